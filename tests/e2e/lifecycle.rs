//! The agent process: its socket, its state directory, signals, and the plan given at start.

use crate::harness::{Agent, alive};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};

#[test]
fn socket_mode_stale_socket_and_live_agent() {
    let mut agent = Agent::start("h200:1");
    let meta = std::fs::metadata(&agent.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);

    // A second agent on the same socket (own state dir) exits with a clear message.
    let other_state = agent.dir.path().join("other-state");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-agent"))
        .args(["--simulate", "h200:1", "--socket"])
        .arg(&agent.socket)
        .arg("--state-dir")
        .arg(&other_state)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another gpu-agent is already serving"), "{err}");
    assert_eq!(agent.gpuctl(&["status"]).code, 0, "the first agent still serves");

    // A second agent on the same state dir is refused too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-agent"))
        .args(["--simulate", "h200:1", "--socket"])
        .arg(agent.dir.path().join("b.sock"))
        .arg("--state-dir")
        .arg(&agent.state_dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is in use by another gpu-agent"), "{err}");

    // kill -9 leaves a stale socket file; the next start replaces it.
    assert_eq!(agent.stop_agent(libc::SIGKILL), Some(128 + 9));
    assert!(agent.socket.exists());
    agent.launch().unwrap();
    assert_eq!(agent.gpuctl(&["status"]).code, 0);

    // SIGTERM: a clean exit that removes the socket.
    assert_eq!(agent.stop_agent(libc::SIGTERM), Some(0));
    assert!(!agent.socket.exists());
}

#[test]
fn refuses_a_path_that_is_not_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    std::fs::write(&path, "precious").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-agent"))
        .args(["--simulate", "h200:1", "--socket"])
        .arg(&path)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a socket"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
}

#[test]
fn bad_flags_and_settings_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (&["--simulate", "h300:1"], "unknown product \"h300\""),
        (&["--simulate", "h200:1", "--log-format", "xml"], "log format \"xml\""),
        (&["--simulate", "h200:1", "--metrics-listen", "127.0.0.1:9400"], "not available in this version"),
    ];
    for (args, want) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-agent"))
            .args(args)
            .arg("--socket")
            .arg(dir.path().join("a.sock"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // A simulated host cannot silently change shape under an existing state dir.
    let mut agent = Agent::start("h200:2");
    agent.stop_agent(libc::SIGTERM);
    agent.spec = "a30:1".into();
    let err = agent.launch().unwrap_err();
    assert!(err.contains("holds a host of h200:2, not a30:1"), "{err}");
}

#[test]
fn plan_at_start_and_json_logs() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(&plan, "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"exclusive\"\n[[models]]\nname = \"boot\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"1GiB\"\n").unwrap();
    let agent = Agent::start_with("h200:1", &["--plan", plan.to_str().unwrap(), "--log-format", "json"]);
    let workers = agent.worker_pids();
    assert_eq!(workers.len(), 1, "{workers:?}");
    assert_eq!(workers[0].3, "running");
    assert!(alive(workers[0].2.unwrap()));
    let status = agent.gpuctl(&["-o", "json", "status"]).json();
    assert_eq!(status["last_apply"]["ok"], true);
    assert_eq!(status["gpus"][0]["sharing"], "exclusive");
    // Every log line is a JSON object.
    let log = agent.log();
    assert!(!log.is_empty());
    for line in log.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
}
