//! The built `testworker` in each of its modes, as the agent's tests will start it. MPS daemons
//! come from the same binary started as `nvidia-cuda-mps-control` (the multi-call path the agent
//! uses too), each in its own temp pipe directory and killed with its servers at the end.

use gpu_sim::{SimGpuInstance, SimHost, SimProcess};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_testworker");
const LONG: Duration = Duration::from_secs(10);

/// A running worker in its own session; killed with its process group when dropped.
struct Worker {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Worker {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Worker {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env_clear()
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| nix::unistd::setsid().map(drop).map_err(std::io::Error::from));
        }
        let mut child = cmd.spawn().unwrap();
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        let out = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = out.send(line);
            }
        });
        // Stderr lines land in the same list (marked), so a failing test shows them.
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(format!("stderr: {line}"));
            }
        });
        Worker { child, lines, seen: Vec::new() }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a line that `pred` accepts; returns it.
    fn expect(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + LONG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(_) => panic!("no line {what}; saw {:?}", self.seen),
            }
        }
    }

    fn expect_line(&mut self, want: &str) -> String {
        self.expect(want, |l| l == want)
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) with plain numbers touches no memory.
        unsafe { libc::kill(self.pid() as i32, signal) };
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + LONG;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "worker still running; saw {:?}", self.seen);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn still_running_after(&mut self, wait: Duration) -> bool {
        std::thread::sleep(wait);
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SAFETY: kill(2) with plain numbers; the worker leads its own process group.
        unsafe { libc::kill(-(self.pid() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// A fake MPS daemon (this binary as `nvidia-cuda-mps-control`), killed with its servers on drop.
struct Mps {
    _dir: tempfile::TempDir,
    pipe: PathBuf,
    env: Vec<(String, String)>,
    pid: i32,
}

impl Mps {
    fn start(env: &[(&str, &str)]) -> Mps {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("pipe");
        let mut env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        env.push(("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.display().to_string()));
        env.push(("CUDA_MPS_LOG_DIRECTORY".into(), dir.path().join("log").display().to_string()));
        let mut mps = Mps { _dir: dir, pipe, env, pid: 0 };
        let out = mps.control().arg("-d").output().unwrap();
        assert!(out.status.success(), "{out:?}");
        mps.pid = std::fs::read_to_string(mps.pipe.join("nvidia-cuda-mps-control.pid")).unwrap().parse().unwrap();
        mps
    }

    fn control(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg0("nvidia-cuda-mps-control").env_clear().envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    fn ask(&self, command: &str) -> String {
        let mut child = self.control().stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let _ = writeln!(child.stdin.take().unwrap(), "{command}");
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert!(child.wait().unwrap().success());
        out
    }

    fn kill(&self) {
        // SAFETY: kill(2) with plain numbers; the daemon leads its own process group (its servers).
        unsafe {
            libc::kill(-self.pid, libc::SIGKILL);
            libc::kill(self.pid, libc::SIGKILL);
        }
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains("nvidia-cuda-mps-control") {
            self.kill();
        }
    }
}

/// A simulated one-GPU H200 host with one MIG instance entry (for the MIG lookup).
fn sim_host() -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim/nvml.json");
    let host = SimHost::prepare(&state, &"h200:1".parse().unwrap()).unwrap();
    SimHost::update(&state, |h| {
        h.gpus[0].instances.push(SimGpuInstance {
            id: 3,
            profile_id: 19,
            start: 0,
            size: 1,
            mig_uuid: Some("MIG-x".into()),
        });
        Ok::<_, ()>(())
    })
    .unwrap()
    .unwrap();
    (dir, state, host.gpus[0].uuid.clone())
}

fn processes(state: &Path) -> Vec<SimProcess> {
    SimHost::load(state).unwrap().gpus[0].processes.clone()
}

fn entry(state: &Path, pid: u32) -> Option<SimProcess> {
    processes(state).into_iter().find(|p| p.pid == pid)
}

#[test]
fn prints_its_identity_and_exits_0_on_sigterm() {
    let env = [("GPU_AGENT_MODEL", "m1"), ("GPU_AGENT_REPLICA", "2"), ("CUDA_VISIBLE_DEVICES", "GPU-abc")];
    let mut w = Worker::start(&["--print", "hello"], &env);
    w.expect_line("hello GPU_AGENT_MODEL=m1 GPU_AGENT_REPLICA=2 CUDA_VISIBLE_DEVICES=GPU-abc");
    w.expect_line("ready");
    w.signal(libc::SIGTERM);
    assert_eq!(w.wait().code(), Some(0));

    let mut w = Worker::start(&["--print", "x"], &[]);
    w.expect_line("x GPU_AGENT_MODEL=<unset> GPU_AGENT_REPLICA=<unset> CUDA_VISIBLE_DEVICES=<unset>");
}

#[test]
fn exits_with_the_code_asked_or_crashes() {
    let mut w = Worker::start(&["--exit-after", "100", "--code", "7"], &[]);
    assert_eq!(w.wait().code(), Some(7));
    let mut w = Worker::start(&["--crash-after", "50"], &[]);
    assert_eq!(w.wait().signal(), Some(libc::SIGSEGV));
}

#[test]
fn ignores_sigterm_when_asked() {
    let mut w = Worker::start(&["--ignore-sigterm"], &[]);
    w.expect_line("ready");
    w.signal(libc::SIGTERM);
    assert!(w.still_running_after(Duration::from_millis(300)));
    w.signal(libc::SIGKILL);
    assert_eq!(w.wait().signal(), Some(libc::SIGKILL));
}

#[test]
fn forks_children_in_its_session() {
    let mut w = Worker::start(&["--fork", "2"], &[]);
    let kids: Vec<u32> = (0..2).map(|_| w.expect("child", |l| l.starts_with("child "))[6..].parse().unwrap()).collect();
    w.expect_line("ready");
    let session = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat.rsplit_once(')').unwrap().1.split_whitespace().nth(3).unwrap().to_string()
    };
    for kid in &kids {
        assert_eq!(session(*kid), w.pid().to_string(), "child {kid} is in the worker's session");
    }
    drop(w);
    let gone = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "));
    let deadline = Instant::now() + LONG;
    while !kids.iter().all(|k| gone(*k)) {
        assert!(Instant::now() < deadline, "children survived their group's SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn claims_simulated_gpu_memory_and_gives_it_back() {
    let (_dir, state, uuid) = sim_host();
    let state_s = state.to_str().unwrap();
    let mut w =
        Worker::start(&["--gpu-memory", "1000"], &[("GPU_SIM_STATE", state_s), ("CUDA_VISIBLE_DEVICES", &uuid)]);
    w.expect_line("gpu memory: 1000 MiB");
    w.expect_line("ready");
    let pid = w.pid();
    assert_eq!(entry(&state, pid), Some(SimProcess { pid, used_mib: 1000, gpu_instance_id: None, mps_client: false }));
    w.signal(libc::SIGTERM);
    assert_eq!(w.wait().code(), Some(0));
    assert_eq!(entry(&state, pid), None, "SIGTERM removes the entry");

    // On a MIG instance: the instance's GPU, with its instance id.
    let mut w =
        Worker::start(&["--gpu-memory", "10"], &[("GPU_SIM_STATE", state_s), ("CUDA_VISIBLE_DEVICES", "MIG-x")]);
    w.expect_line("ready");
    assert_eq!(entry(&state, w.pid()).unwrap().gpu_instance_id, Some(3));

    // Growing.
    let mut w = Worker::start(
        &["--gpu-memory", "100", "--grow-mib-per-sec", "2000", "--exit-after", "5000"],
        &[("GPU_SIM_STATE", state_s), ("CUDA_VISIBLE_DEVICES", &uuid)],
    );
    w.expect_line("ready");
    let pid = w.pid();
    let deadline = Instant::now() + LONG;
    while entry(&state, pid).is_none_or(|p| p.used_mib < 500) {
        assert!(Instant::now() < deadline, "did not grow: {:?}", entry(&state, pid));
        std::thread::sleep(Duration::from_millis(50));
    }

    // No simulated state: a setup error.
    let mut w = Worker::start(&["--gpu-memory", "10"], &[]);
    assert_eq!(w.wait().code(), Some(3));
    // A device the simulated host does not have: CUDA's error.
    let mut w =
        Worker::start(&["--gpu-memory", "10"], &[("GPU_SIM_STATE", state_s), ("CUDA_VISIBLE_DEVICES", "GPU-nope")]);
    w.expect_line("CUDA error: no CUDA-capable device is detected");
    assert_eq!(w.wait().code(), Some(1));
}

#[test]
fn is_an_mps_client_with_its_limits_and_dies_with_the_daemon() {
    let (_dir, state, uuid) = sim_host();
    let state_s = state.to_str().unwrap();
    let mps = Mps::start(&[("GPU_SIM_STATE", state_s), ("CUDA_VISIBLE_DEVICES", &uuid)]);
    let pipe = mps.pipe.display().to_string();
    let env = |limit: &'static str| {
        vec![
            ("GPU_SIM_STATE", state_s.to_string()),
            ("CUDA_VISIBLE_DEVICES", uuid.clone()),
            ("CUDA_MPS_PIPE_DIRECTORY", pipe.clone()),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", limit.to_string()),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25".to_string()),
        ]
    };
    let start = |args: &[&str], env: &[(&str, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Worker::start(args, &env)
    };

    let mut fits = start(&["--gpu-memory", "1000"], &env("0=2048M"));
    let line = fits.expect("mps line", |l| l.starts_with("mps: "));
    let server: u32 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert_eq!(line, format!("mps: server {server} pct 25.0 limit 2048"));
    fits.expect_line("gpu memory: 1000 MiB");
    fits.expect_line("ready");
    let pid = fits.pid();
    assert_eq!(entry(&state, pid), Some(SimProcess { pid, used_mib: 1000, gpu_instance_id: None, mps_client: true }));
    assert_eq!(entry(&state, server).map(|p| (p.used_mib, p.mps_client)), Some((66, false)));
    assert_eq!(mps.ask(&format!("get_client_list {server}")), format!("{pid}\n"));

    // 1600 MiB plus the context does not fit in 2 GiB: out of memory, and it carries on.
    let mut oom = start(&["--gpu-memory", "1600"], &env("0=2G"));
    oom.expect_line("CUDA error: out of memory (limit 2048 MiB)");
    oom.expect_line("gpu memory: 0 MiB");
    oom.expect_line("ready");
    // ... or exits 2 when told to.
    let mut strict = start(&["--gpu-memory", "1600", "--exit-on-oom"], &env("0=2G"));
    strict.expect_line("CUDA error: out of memory (limit 2048 MiB)");
    assert_eq!(strict.wait().code(), Some(2));

    mps.kill();
    for w in [&mut fits, &mut oom] {
        w.expect_line("CUDA error: MPS server connection lost");
        assert_eq!(w.wait().code(), Some(1));
    }
    assert_eq!(entry(&state, pid), None);

    // The daemon is gone: a new worker runs without MPS, silently.
    let mut alone = start(&["--gpu-memory", "100"], &env("0=2G"));
    alone.expect_line("mps: none");
    alone.expect_line("ready");
    assert!(!entry(&state, alone.pid()).unwrap().mps_client);
}

#[test]
fn a_terminated_or_faulted_client_exits_1() {
    let mps = Mps::start(&[]);
    let env = [("CUDA_MPS_PIPE_DIRECTORY", mps.pipe.to_str().unwrap())];
    let mut a = Worker::start(&[], &env);
    let server = a.expect("mps line", |l| l.starts_with("mps: server "));
    let server: u32 = server.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(server > 0);
    a.expect_line("ready");
    let mut b = Worker::start(&[], &env);
    b.expect_line("ready");
    assert_eq!(mps.ask(&format!("terminate_client {server} {}", a.pid())), "");
    a.expect_line("CUDA error: MPS server connection lost");
    assert_eq!(a.wait().code(), Some(1));
    assert!(b.still_running_after(Duration::from_millis(200)));
    mps.ask(&format!("fake_fault {server}"));
    b.expect_line("CUDA error: MPS server connection lost");
    assert_eq!(b.wait().code(), Some(1));
}

#[test]
fn serves_healthz() {
    let mut w = Worker::start(&["--listen", "0"], &[]);
    let line = w.expect("listening", |l| l.starts_with("listening 127.0.0.1:"));
    let addr = line.trim_start_matches("listening ");
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let ok = get("/healthz");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\nok\n"), "{ok}");
    assert!(get("/other").starts_with("HTTP/1.1 404 "));
}
