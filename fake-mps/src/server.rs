//! The fake `nvidia-cuda-mps-server`: a real process, so the server has its own pid as on a real
//! host (NVML lists it; `get_server_list` names it). The daemon re-executes its own binary with
//! [`SERVER_ARG`]; this process says `ready` on stdout once "initialized" and lives until its
//! stdin (a pipe only the daemon holds) closes, so it can never outlive the daemon, however the
//! daemon ends.

use crate::env::SERVER_START_MS_ENV;
use std::io::{Read, Write};
use std::time::Duration;

/// The hidden argument that turns the control binary into a server.
pub const SERVER_ARG: &str = "--fake-mps-server";

pub fn run() -> i32 {
    let start_ms: u64 = std::env::var(SERVER_START_MS_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    std::thread::sleep(Duration::from_millis(start_ms));
    let mut out = std::io::stdout();
    if out.write_all(b"ready\n").and_then(|()| out.flush()).is_err() {
        return 1;
    }
    // Blocks until the daemon closes its end (or dies): then this server is done.
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin();
    while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
    0
}
