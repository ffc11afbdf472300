//! A stand-in for NVIDIA's `nvidia-cuda-mps-control`, faithful enough that the agent's real
//! spawn-and-talk code runs against it, plus the client side of MPS that a CUDA process has
//! (in [`client`]) and helpers that put processes into the simulated NVML state ([`sim`]).
//!
//! One entry point, [`control_main`], because the agent ships it as a multi-call binary
//! (`nvidia-cuda-mps-control` is a link to the agent, dispatched on `argv[0]`); this crate's own
//! `fake-mps-control` binary only calls it. Everything the probe of a real H200 shows is copied;
//! what it does not show is marked "unverified" where it is decided.

pub mod client;
mod daemon;
pub mod env;
pub mod limits;
mod logfile;
mod server;
pub mod sim;
mod ui;
pub mod wire;

pub use daemon::READY_FD_ENV;
pub use server::SERVER_ARG;

use std::ffi::OsString;

const USAGE: &str = "usage: nvidia-cuda-mps-control [-d | -f]\n  \
    -d  start the MPS control daemon in the background\n  \
    -f  run the MPS control daemon in the foreground\n  \
    (no option) read commands from stdin, one per line, and print the daemon's answers";

/// Runs the control tool with `args` as `std::env::args_os()` gives them (`args[0]` is the
/// program name, kept when the daemon and its servers re-execute this binary). Returns the
/// process's exit code:
/// - `-d`: 0 once a daemon answers on the pipe directory, 1 with the reason on stderr;
/// - `-f`: runs the daemon in this process until `quit` or SIGTERM, then 0;
/// - no argument: the command interface (stdin to stdout), 0, or 1 when no daemon answers.
///
/// The daemon and its servers are this same executable run again with `argv[0]` unchanged and
/// `-f` or [`SERVER_ARG`]; a multi-call binary must send every `argv[0]` it serves to this
/// function, whatever the other arguments.
pub fn control_main(args: Vec<OsString>) -> i32 {
    let mut args = args.into_iter();
    let arg0 = args.next().unwrap_or_else(|| "nvidia-cuda-mps-control".into());
    let rest: Vec<OsString> = args.collect();
    let rest: Vec<&str> = rest.iter().map(|a| a.to_str().unwrap_or("?")).collect();
    match rest.as_slice() {
        [] => ui::run(&env::Config::from_env()),
        ["-d"] => daemon::daemonize(&arg0),
        ["-f"] => daemon::run(arg0),
        [SERVER_ARG] => server::run(),
        ["-h" | "--help"] => {
            println!("{USAGE}");
            0
        }
        _ => {
            eprintln!("{USAGE}");
            1
        }
    }
}
