//! The MPS control daemon seam: starting `nvidia-cuda-mps-control -d` for one device with its own
//! pipe and log directories, and talking to it through its command interface (one command per
//! run of the control binary, on its stdin, with the same environment), exactly as an operator
//! would. The binary is a setting, so tests and `--simulate` run the fake one through this code.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("MPS daemon for {device}: cannot run {binary}: {source}")]
    Spawn { device: String, binary: PathBuf, source: std::io::Error },
    #[error("MPS daemon for {device}: {dir}: {source}")]
    Dir { device: String, dir: PathBuf, source: std::io::Error },
    #[error("MPS daemon for {device}: `{command}` failed: {message}")]
    Command { device: String, command: String, message: String },
    #[error("MPS daemon for {device} did not answer within {secs}s after starting")]
    NoAnswer { device: String, secs: u64 },
}

/// One device's MPS daemon, as the control binary reaches it.
#[derive(Debug, Clone)]
pub struct Control {
    pub binary: PathBuf,
    /// `CUDA_VISIBLE_DEVICES` of the daemon: a GPU-... or MIG-... UUID.
    pub device: String,
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
    /// Extra environment (the simulated driver's state path under --simulate).
    pub env: Vec<(String, String)>,
}

const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// A daemon's pipe and log directories: `RUNTIME/mps/<name>/{pipe,log}`. Its clients use the same.
pub fn dirs(runtime_dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let base = runtime_dir.join("mps").join(name);
    (base.join("pipe"), base.join("log"))
}

impl Control {
    pub fn new(binary: &Path, runtime_dir: &Path, name: &str, device: &str, env: &[(String, String)]) -> Control {
        let (pipe_dir, log_dir) = dirs(runtime_dir, name);
        Control { binary: binary.to_path_buf(), device: device.to_string(), pipe_dir, log_dir, env: env.to_vec() }
    }

    fn command_for(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log_dir)
            .env("CUDA_VISIBLE_DEVICES", &self.device)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        // The daemon and the servers it starts load the driver's libraries as the agent does.
        if let Some(path) = std::env::var_os("LD_LIBRARY_PATH") {
            cmd.env("LD_LIBRARY_PATH", path);
        }
        cmd
    }

    /// Starts the daemon (`-d`) and waits until it answers commands.
    pub fn start(&self) -> Result<(), MpsError> {
        for dir in [&self.pipe_dir, &self.log_dir] {
            std::fs::create_dir_all(dir).map_err(|source| MpsError::Dir {
                device: self.device.clone(),
                dir: dir.clone(),
                source,
            })?;
        }
        let out = self.command_for().arg("-d").stdin(Stdio::null()).output().map_err(|source| MpsError::Spawn {
            device: self.device.clone(),
            binary: self.binary.clone(),
            source,
        })?;
        if !out.status.success() {
            return Err(MpsError::Command {
                device: self.device.clone(),
                command: "-d".into(),
                message: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
            });
        }
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while Instant::now() < deadline {
            if self.answers() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(MpsError::NoAnswer { device: self.device.clone(), secs: COMMAND_TIMEOUT.as_secs() })
    }

    /// Runs one command through the control binary and returns what it printed.
    pub fn command(&self, command: &str) -> Result<String, MpsError> {
        let err = |message: String| MpsError::Command { device: self.device.clone(), command: command.into(), message };
        let mut child =
            self.command_for().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(
                |source| MpsError::Spawn { device: self.device.clone(), binary: self.binary.clone(), source },
            )?;
        if let Some(mut stdin) = child.stdin.take() {
            // The tool exits without reading when no daemon answers: a broken pipe here is not
            // the answer, its exit status and stderr are.
            let _ = writeln!(stdin, "{command}");
        }
        // A daemon that hangs must not hang the agent.
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(err(format!("no answer within {}s", COMMAND_TIMEOUT.as_secs())));
                }
                Err(e) => return Err(err(e.to_string())),
            }
        }
        let out = child.wait_with_output().map_err(|e| err(e.to_string()))?;
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(err(if stderr.is_empty() { stdout } else { stderr }));
        }
        if stdout.starts_with("Unknown command") {
            return Err(err(stdout));
        }
        Ok(stdout)
    }

    /// Whether the daemon answers its command interface.
    pub fn answers(&self) -> bool {
        self.command("get_default_active_thread_percentage").is_ok()
    }

    /// The daemon's pid, from the pid file it writes in its pipe directory.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pipe_dir.join("nvidia-cuda-mps-control.pid")).ok()?.trim().parse().ok()
    }

    /// Pids of the MPS servers this daemon runs (one at a time, in practice).
    pub fn servers(&self) -> Result<Vec<u32>, MpsError> {
        Ok(self.command("get_server_list")?.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// `ACTIVE`, `INITIALIZING` or `FAULT`.
    pub fn server_status(&self, server: u32) -> Result<String, MpsError> {
        self.command(&format!("get_server_status {server}"))
    }

    pub fn clients(&self, server: u32) -> Result<Vec<u32>, MpsError> {
        Ok(self.command(&format!("get_client_list {server}"))?.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Sets the defaults a server started from now on gets.
    pub fn set_defaults(&self, active_thread_percentage: Option<u32>, pinned_mib: Option<u64>) -> Result<(), MpsError> {
        if let Some(pct) = active_thread_percentage {
            self.command(&format!("set_default_active_thread_percentage {pct}"))?;
        }
        if let Some(mib) = pinned_mib {
            self.command(&format!("set_default_device_pinned_mem_limit 0 {mib}M"))?;
        }
        Ok(())
    }

    /// Ends one client the safe way (killing a client with work in flight can wedge the server).
    pub fn terminate_client(&self, pid: u32) -> Result<bool, MpsError> {
        for server in self.servers()? {
            if self.clients(server)?.contains(&pid) {
                self.command(&format!("terminate_client {server} {pid}"))?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Asks the daemon to quit; waits for its process to go, then kills it if it did not.
    pub fn quit(&self) -> Result<(), MpsError> {
        let pid = self.pid();
        let _ = self.command("quit");
        if let Some(pid) = pid {
            let deadline = Instant::now() + COMMAND_TIMEOUT;
            while crate::workers::proc::alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if crate::workers::proc::alive(pid) {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
            }
        }
        Ok(())
    }
}
