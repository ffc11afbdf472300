//! Runs the real `gpu-agent` binary on a temp socket and state directory against the simulated
//! driver, and the real gpuctl code (`ctl::run`) against it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Agent {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub spec: String,
    child: Option<Child>,
    extra: Vec<String>,
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\nstderr: {}", self.stdout, self.stderr))
    }
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n--- stdout\n{}\n--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// gpuctl, in-process, with `--socket` pointing at `socket`.
pub fn gpuctl_at(socket: &Path, args: &[&str]) -> Out {
    let mut argv = vec!["gpuctl".to_string(), "--socket".to_string(), socket.display().to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = ctl::run(argv, &mut out, &mut err);
    Out { code, stdout: String::from_utf8_lossy(&out).into_owned(), stderr: String::from_utf8_lossy(&err).into_owned() }
}

impl Agent {
    pub fn start(spec: &str) -> Agent {
        Self::start_with(spec, &[])
    }

    pub fn start_with(spec: &str, extra: &[&str]) -> Agent {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("agent.sock");
        let state_dir = dir.path().join("state");
        let mut agent = Agent {
            dir,
            socket,
            state_dir,
            spec: spec.to_string(),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        agent.launch().expect("agent starts");
        agent
    }

    pub fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-agent"));
        cmd.arg("--simulate")
            .arg(&self.spec)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(&self.extra);
        cmd.env("RUST_LOG", "info").stdout(Stdio::null()).stderr(Stdio::from(
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("agent.log")).expect("log"),
        ));
        cmd
    }

    /// Starts the agent process and waits until it answers.
    pub fn launch(&mut self) -> Result<(), String> {
        let child = self.command().spawn().map_err(|e| e.to_string())?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(format!("agent exited with {status}: {}", self.log()));
            }
            if self.gpuctl(&["status"]).code == 0 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("agent did not answer within 30s: {}", self.log()))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    pub fn gpuctl(&self, args: &[&str]) -> Out {
        gpuctl_at(&self.socket, args)
    }

    /// Sends a signal to the agent and waits for it to exit; returns its exit code.
    pub fn stop_agent(&mut self, signal: i32) -> Option<i32> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) with a pid we own (our child) and a valid signal number.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = child.wait().expect("wait for agent");
        use std::os::unix::process::ExitStatusExt;
        status.code().or(status.signal().map(|s| 128 + s))
    }

    pub fn write_plan(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write plan");
        path.display().to_string()
    }

    pub fn state_json(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.state_dir.join("state.json")).unwrap_or_else(|_| "{}".into());
        serde_json::from_str(&text).expect("state.json is JSON")
    }

    /// Worker pids as `gpuctl workers -o json` reports them, by (model, replica).
    pub fn worker_pids(&self) -> Vec<(String, u64, Option<u64>, String)> {
        let out = self.gpuctl(&["-o", "json", "workers"]);
        assert_eq!(out.code, 0, "{out:?}");
        out.json()["workers"]
            .as_array()
            .expect("workers array")
            .iter()
            .map(|w| {
                (
                    w["model"].as_str().unwrap().to_string(),
                    w["replica"].as_u64().unwrap(),
                    w["pid"].as_u64(),
                    w["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// Waits until `f` holds, polling; panics with the agent log after `secs`.
    pub fn wait_for(&self, what: &str, secs: u64, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if f() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}\nagent log:\n{}", self.log());
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop_agent(libc::SIGKILL);
        // Workers and MPS daemons outlive the agent by design; the test owns them, so end them here.
        if let Some(daemons) = self.state_json()["mps"].as_array() {
            for d in daemons {
                if let Some(pid) = d["pid"].as_i64() {
                    // SAFETY: kill(2) on the MPS daemon this test's agent started.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
            }
        }
        if let Some(workers) = self.state_json()["workers"].as_array() {
            for w in workers {
                if let Some(pid) = w["pid"].as_i64() {
                    // SAFETY: killpg(2) on the worker's own process group (it leads its session).
                    unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
                }
            }
        }
    }
}

pub fn alive(pid: u64) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

pub fn environ(pid: u64) -> Vec<(String, String)> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok()?.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// The test worker binary (crate `testworker`), built by `cargo test --workspace` beside this
/// test's own binary.
pub fn testworker() -> String {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = dir.join("testworker");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` (or `cargo test --workspace`)",
        path.display()
    );
    path.display().to_string()
}

/// Writes agent settings to a file of their own (tests run in parallel; a shared file could be
/// read half-written) and returns its path.
pub fn settings_file(contents: &str) -> String {
    let mut file = tempfile::Builder::new().prefix("gpu-agent-e2e-").suffix(".toml").tempfile().expect("temp file");
    std::io::Write::write_all(&mut file, contents.as_bytes()).expect("write settings");
    let (_, path) = file.keep().expect("keep settings file");
    path.display().to_string()
}

/// The gpuctl binary, built beside the test binary (for what needs a separate process, such as
/// `logs --follow`).
pub fn gpuctl_binary() -> String {
    let exe = std::env::current_exe().expect("test exe");
    let path = exe.parent().and_then(Path::parent).expect("target/<profile>").join("gpuctl");
    assert!(path.is_file(), "{} is missing: run `cargo build --workspace`", path.display());
    path.display().to_string()
}
