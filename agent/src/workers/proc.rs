//! Watching processes the agent did not necessarily start: pidfds (which work for any process,
//! also one adopted after an agent restart) and /proc start times (which tell a reused pid apart).

use std::os::fd::{FromRawFd, OwnedFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Start time of `pid` in clock ticks since boot, or None when no such process exists.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    // `rest` starts at field 3 (state); start time is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').and_then(|i| s.get(i + 2..i + 3)).map(|state| state != "Z"))
        .unwrap_or(false)
}

/// Session id of `pid` (/proc/PID/stat field 6).
pub fn session(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// Every live process in session `sid`, the leader included.
pub fn session_members(sid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| session(*pid) == Some(sid))
        .collect()
}

/// True when `pid` is alive and still the process that started at `ticks` (not a zombie).
pub fn same_process(pid: u32, ticks: u64) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').and_then(|i| s.get(i + 2..i + 3)).map(str::to_string));
    start_ticks(pid) == Some(ticks) && state.as_deref() != Some("Z")
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new file descriptor or -1; it touches
    // no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// How a watched process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// Not our child (adopted after a restart): the kernel does not tell us its status.
    Unknown,
}

impl Exit {
    pub fn success(&self) -> bool {
        matches!(self, Exit::Code(0))
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exited with status {c}"),
            Exit::Signal(s) => {
                let name = nix::sys::signal::Signal::try_from(*s).map(|s| s.as_str()).unwrap_or("?");
                write!(f, "killed by signal {s} ({name})")
            }
            Exit::Unknown => write!(f, "exited (status unknown: it was adopted, not started, by this agent)"),
        }
    }
}

/// Waits until `pid` exits. Reaps it when it is our child.
pub async fn wait_exit(pid: u32) -> Exit {
    if let Ok(fd) = pidfd_open(pid) {
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd, so it stays open and refers to the
        // same pidfd for the AsyncFd's whole life.
        if let Ok(async_fd) = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
            // A pidfd turns readable once the process has exited.
            let _ = async_fd.readable().await;
        }
    }
    // Before the leader is reaped (its pid, the session id, cannot be reused while it is a
    // zombie), whatever else runs in its session goes too: children it left behind would keep
    // holding GPU memory with no worker to account them to.
    kill_session(pid);
    reap(pid)
}

/// Waits until `pid` (any process, not only a child) exits; does not reap it.
pub async fn wait_gone(pid: u32) {
    // No pidfd: the process is already gone.
    let Ok(fd) = pidfd_open(pid) else { return };
    // SAFETY: `fd` is an OwnedFd moved into the AsyncFd, so it stays open and refers to the same
    // pidfd for the AsyncFd's whole life.
    match unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) } {
        Ok(async_fd) => drop(async_fd.readable().await),
        // Could not register with the reactor: poll instead.
        Err(_) => {
            while alive(pid) {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}

/// SIGKILL to every process in session `sid`.
pub fn kill_session(sid: u32) {
    for member in session_members(sid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(member as i32), nix::sys::signal::Signal::SIGKILL);
    }
}

fn reap(pid: u32) -> Exit {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    use nix::unistd::Pid;
    match waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => Exit::Code(code),
        Ok(WaitStatus::Signaled(_, sig, _)) => Exit::Signal(sig as i32),
        _ => Exit::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn watches_exit_codes_and_signals() {
        let cases = [("exit 3", Exit::Code(3)), ("kill -9 $$", Exit::Signal(9)), ("true", Exit::Code(0))];
        for (script, want) in cases {
            #[allow(clippy::zombie_processes)] // wait_exit reaps it through waitpid
            let child = std::process::Command::new("/bin/sh").args(["-c", script]).spawn().unwrap();
            let pid = child.id();
            assert_eq!(wait_exit(pid).await, want, "{script}");
        }
    }

    #[test]
    fn start_ticks_tell_processes_apart() {
        let me = std::process::id();
        let ticks = start_ticks(me).unwrap();
        assert!(same_process(me, ticks));
        assert!(!same_process(me, ticks + 1));
        assert_eq!(start_ticks(u32::MAX / 2), None);
    }
}
