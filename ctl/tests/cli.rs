//! The gpuctl binary's own behaviour when no agent answers or the input is wrong.

use std::process::Command;

fn gpuctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl")).args(args).env_remove("GPUCTL_SOCKET").output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn exit_codes_and_messages() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("none.sock");
    let sock = sock.to_str().unwrap();
    let plan = dir.path().join("p.toml");
    std::fs::write(&plan, "version = 1\n").unwrap();
    let plan = plan.to_str().unwrap();
    // (args, exit code, words on stderr)
    let cases: [(&[&str], i32, &str); 7] = [
        (&["--socket", sock, "status"], 1, "cannot reach gpu-agent at"),
        (&["--socket", sock, "gpus"], 1, sock),
        (&["--socket", sock, "diff", "-f", plan], 3, "cannot reach gpu-agent"),
        (&["--socket", sock, "apply", "-f", "/nonexistent/plan.toml"], 2, "plan /nonexistent/plan.toml"),
        (&["--socket", sock, "frobnicate"], 2, "unrecognized subcommand"),
        (&["--socket", sock, "-o", "yaml", "gpus"], 2, "invalid value 'yaml'"),
        (&["--host", "gpu1:7443", "status"], 2, "--host"),
    ];
    for (args, code, words) in cases {
        let (got, _, err) = gpuctl(args);
        assert_eq!(got, code, "{args:?}: {err}");
        assert!(err.contains(words), "{args:?}: {err}");
    }
    // The default socket is the contract's, and GPUCTL_SOCKET overrides it.
    let (_, _, err) = gpuctl(&["status"]);
    assert!(err.contains("/run/gpu-agent/agent.sock"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_gpuctl")).arg("status").env("GPUCTL_SOCKET", sock).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains(sock));
}

#[test]
fn help_lists_the_contract_commands() {
    let (code, out, _) = gpuctl(&["--help"]);
    assert_eq!(code, 0);
    for cmd in ["status", "gpus", "profiles", "apply", "diff", "workers", "events"] {
        assert!(out.contains(cmd), "{cmd} missing from help:\n{out}");
    }
}
