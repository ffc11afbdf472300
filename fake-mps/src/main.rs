//! `fake-mps-control`: the fake `nvidia-cuda-mps-control`; all of it lives in the library.

fn main() {
    std::process::exit(fake_mps::control_main(std::env::args_os().collect()));
}
