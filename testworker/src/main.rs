//! `testworker`: a model worker for the agent's tests. It behaves like a worker in every way the
//! tests look at: what it prints, how it exits or crashes, the children it forks, the simulated
//! GPU memory it claims (in gpu-sim's NVML state), whether it is an MPS client and what that
//! client's limits do to it, and a `/healthz` endpoint.
//!
//! Started as `nvidia-cuda-mps-control` (by `argv[0]`), it is the fake MPS control tool instead,
//! the same multi-call arrangement the agent uses; the tests start their MPS daemons that way.

mod exit;
mod gpu;
mod http;
mod mps;

use clap::Parser;
use std::path::Path;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "A model-worker stand-in for gpu-agent's tests")]
struct Args {
    /// Print a line with TEXT and GPU_AGENT_MODEL, GPU_AGENT_REPLICA, CUDA_VISIBLE_DEVICES at start.
    #[arg(long, value_name = "TEXT")]
    print: Option<String>,
    /// Exit with --code after MS milliseconds.
    #[arg(long, value_name = "MS")]
    exit_after: Option<u64>,
    #[arg(long, default_value_t = 0, requires = "exit_after")]
    code: i32,
    /// Die of SIGSEGV after MS milliseconds.
    #[arg(long, value_name = "MS")]
    crash_after: Option<u64>,
    #[arg(long)]
    ignore_sigterm: bool,
    /// Start N children that sleep forever, in this worker's session and process group.
    #[arg(long, value_name = "N", default_value_t = 0)]
    fork: u32,
    /// Claim MIB of simulated GPU memory (needs GPU_SIM_STATE).
    #[arg(long, value_name = "MIB")]
    gpu_memory: Option<u64>,
    /// Raise the claim by N MiB per second.
    #[arg(long, value_name = "N", default_value_t = 0)]
    grow_mib_per_sec: u64,
    /// Exit 2 when an allocation fails (past the MPS pinned memory limit) instead of going on.
    #[arg(long)]
    exit_on_oom: bool,
    /// Serve `GET /healthz` on 127.0.0.1:PORT (0: any free port, printed).
    #[arg(long, value_name = "PORT")]
    listen: Option<u16>,
    /// A child of --fork: sleep until killed.
    #[arg(long, hide = true)]
    sleep_child: bool,
}

fn main() {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.first().and_then(|a| Path::new(a).file_name()).is_some_and(|n| n == "nvidia-cuda-mps-control") {
        std::process::exit(fake_mps::control_main(argv));
    }
    let args = Args::parse();
    if args.sleep_child {
        sleep_forever();
    }
    // Children first: they keep the default signal dispositions (SIG_IGN would be inherited).
    for _ in 0..args.fork {
        match std::process::Command::new(self_exe()).arg("--sleep-child").spawn() {
            Ok(child) => println!("child {}", child.id()),
            Err(e) => exit::fail(&format!("cannot fork a child: {e}")),
        }
    }
    exit::handle_sigterm(args.ignore_sigterm);
    if let Some(text) = &args.print {
        let var = |name| std::env::var(name).unwrap_or_else(|_| "<unset>".into());
        println!(
            "{text} GPU_AGENT_MODEL={} GPU_AGENT_REPLICA={} CUDA_VISIBLE_DEVICES={}",
            var("GPU_AGENT_MODEL"),
            var("GPU_AGENT_REPLICA"),
            var("CUDA_VISIBLE_DEVICES")
        );
    }
    let mps = mps::connect();
    if args.gpu_memory.is_some() || args.grow_mib_per_sec > 0 {
        gpu::claim(args.gpu_memory.unwrap_or(0), args.grow_mib_per_sec, mps.as_ref(), args.exit_on_oom);
    }
    if let Some(port) = args.listen {
        http::serve(port);
    }
    if let Some(ms) = args.exit_after {
        let code = args.code;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            exit::exit(code);
        });
    }
    if let Some(ms) = args.crash_after {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            exit::crash();
        });
    }
    println!("ready");
    sleep_forever();
}

/// This executable, for the --fork children.
fn self_exe() -> std::path::PathBuf {
    std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into())
}

fn sleep_forever() -> ! {
    loop {
        std::thread::park();
    }
}
