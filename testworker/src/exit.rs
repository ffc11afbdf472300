//! Ending the worker: every orderly exit first takes the worker out of the simulated NVML state
//! (a real driver forgets a process when it exits; the fake keeps entries until removed, though
//! it skips dead pids). SIGTERM is an orderly exit with code 0 unless ignored; a crash is not.

use nix::sys::signal::{SigHandler, SigSet, Signal};
use std::path::PathBuf;
use std::sync::Mutex;

/// The simulated state this worker registered in, if any.
static REGISTERED: Mutex<Option<PathBuf>> = Mutex::new(None);

pub fn registered(state: PathBuf) {
    *REGISTERED.lock().unwrap_or_else(|e| e.into_inner()) = Some(state);
}

/// Unregisters, then exits. Holds the lock through `exit`, so racing exits run only one.
pub fn exit(code: i32) -> ! {
    let guard = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(state) = guard.as_ref() {
        let _ = fake_mps::sim::unregister(state, std::process::id());
    }
    std::process::exit(code)
}

/// A setup problem (not a CUDA error): says so on stderr, exits 3.
pub fn fail(why: &str) -> ! {
    eprintln!("testworker: {why}");
    exit(3)
}

/// SIGTERM: ignored, or an exit 0 from a dedicated thread (blocked in every other thread, taken
/// with sigwait, so the cleanup runs in normal code, not in a handler).
pub fn handle_sigterm(ignore: bool) {
    if ignore {
        // SAFETY: SIG_IGN installs no handler code; nothing runs in signal context.
        if let Err(e) = unsafe { nix::sys::signal::signal(Signal::SIGTERM, SigHandler::SigIgn) } {
            fail(&format!("cannot ignore SIGTERM: {e}"));
        }
        return;
    }
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    if let Err(e) = set.thread_block() {
        fail(&format!("cannot block SIGTERM: {e}"));
    }
    std::thread::spawn(move || {
        loop {
            if set.wait().is_ok() {
                exit(0);
            }
        }
    });
}

/// Dies of SIGSEGV, as a crashing worker does (no core file: tests would litter).
pub fn crash() -> ! {
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: setrlimit reads the struct we pass for the duration of the call only.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    // SAFETY: SIG_DFL installs no handler code (std's own SIGSEGV handler would otherwise
    // treat a raised SIGSEGV as not its business and return).
    let _ = unsafe { nix::sys::signal::signal(Signal::SIGSEGV, SigHandler::SigDfl) };
    let _ = nix::sys::signal::raise(Signal::SIGSEGV);
    std::process::abort()
}
