//! A fake MPS daemon per test, in its own temp pipe and log directories, killed (with its
//! process group: the daemon's servers) when the test ends, even when it panics.

#![allow(dead_code)] // Each test file uses its own part of this.

use fake_mps::client::{self, Client, Hello};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_fake-mps-control");
pub const DEVICE: &str = "GPU-301ffa02-6cac-68c5-1234-567890abcdef";

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub pipe: PathBuf,
    pub log: PathBuf,
    pub env: Vec<(String, String)>,
    pub pid: Option<i32>,
}

impl Daemon {
    /// A daemon on a fresh directory, started with `-d`.
    pub fn start() -> Daemon {
        Daemon::start_with(&[])
    }

    pub fn start_with(env: &[(&str, &str)]) -> Daemon {
        let mut daemon = Daemon::unstarted(env);
        daemon.launch();
        daemon
    }

    /// Directories and environment only; no daemon yet.
    pub fn unstarted(env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let (pipe, log) = (dir.path().join("pipe"), dir.path().join("log"));
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Daemon { dir, pipe, log, env, pid: None }
    }

    /// Runs `-d` (which must succeed) and remembers the daemon's pid from its pid file.
    pub fn launch(&mut self) {
        let out = self.command().arg("-d").stdin(Stdio::null()).output().unwrap();
        assert!(out.status.success(), "-d failed: {}", String::from_utf8_lossy(&out.stderr));
        let pid = std::fs::read_to_string(self.pipe.join("nvidia-cuda-mps-control.pid")).unwrap();
        self.pid = Some(pid.trim().parse().unwrap());
    }

    pub fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env_clear()
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log)
            .env("CUDA_VISIBLE_DEVICES", DEVICE)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs the command interface with `input` on stdin.
    pub fn ctl(&self, input: &str) -> Output {
        let mut child =
            self.command().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // Without a daemon the tool exits at once, maybe before reading: a broken pipe here is
        // expected (the real tool does the same), its exit status and stderr say what happened.
        let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
        child.wait_with_output().unwrap()
    }

    /// One command that must succeed; returns what it printed.
    pub fn ask(&self, command: &str) -> String {
        let out = self.ctl(&format!("{command}\n"));
        assert!(out.status.success(), "{command}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn server_list(&self) -> Vec<u32> {
        self.ask("get_server_list").lines().map(|l| l.parse().unwrap()).collect()
    }

    pub fn client(&self, pid: u32, uid: u32) -> Client {
        self.client_with(&Hello { pid, uid, active_thread_pct: None, pinned_limits: None })
    }

    pub fn client_with(&self, hello: &Hello) -> Client {
        client::connect_with(&self.pipe, hello).unwrap()
    }

    pub fn control_log(&self) -> String {
        std::fs::read_to_string(self.log.join("control.log")).unwrap_or_default()
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.log.join("server.log")).unwrap_or_default()
    }

    pub fn kill(&self, signal: i32) {
        let pid = self.pid.unwrap();
        // SAFETY: kill(2) with a plain pid and signal number touches no memory.
        unsafe { libc::kill(pid, signal) };
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let Some(pid) = self.pid else { return };
        // Only a process that still is our daemon (pids can be reused once it quit).
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains("fake-mps-control") {
            // SAFETY: kill(2) with plain numbers; the daemon leads its own process group
            // (setsid), which holds its servers.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Polls `cond` for up to 5 s.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

pub fn exists(dir: &Path, name: &str) -> bool {
    dir.join(name).symlink_metadata().is_ok()
}
