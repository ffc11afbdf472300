//! Restart policies: a worker that exits is started again (or not) as its model says, with
//! backoff, and a crash loop ends in `failed` with its last exit and what it printed.

use crate::harness::{Agent, alive, testworker};

fn agent() -> Agent {
    let path = crate::harness::settings_file("restart_backoff = \"10ms\"\n");
    Agent::start_with("h200:1", &["--config", &path])
}

fn plan(args: &str, restart: &str) -> String {
    format!(
        "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"w\"\ncommand = [\"{}\"{args}]\nmemory = \"1GiB\"\nrestart = \"{restart}\"\n",
        testworker()
    )
}

fn worker(agent: &Agent) -> serde_json::Value {
    agent.gpuctl(&["-o", "json", "workers"]).json()["workers"][0].clone()
}

#[test]
fn always_restarts_a_killed_worker_at_once() {
    let agent = agent();
    let file = agent.write_plan("a.toml", &plan("", "always"));
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    let pid = worker(&agent)["pid"].as_u64().unwrap();
    // SAFETY: kill(2) on the worker this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    agent.wait_for("the restart", 10, || {
        let w = worker(&agent);
        w["state"] == "running" && w["pid"].as_u64().is_some_and(|p| p != pid)
    });
    let w = worker(&agent);
    assert_eq!(w["restarts"], 1);
    assert!(!alive(pid));
    let events = agent.gpuctl(&["events"]).stdout;
    assert!(events.contains("killed by signal 9 (SIGKILL); restarting in"), "{events}");
    // The restart is the agent's own doing: the plan still matches.
    assert_eq!(agent.gpuctl(&["diff", "-f", &file]).code, 0);
}

#[test]
fn policies_decide_who_comes_back() {
    let agent = agent();
    // (worker args, policy, final state)
    let cases = [
        (", \"--exit-after\", \"50\", \"--code\", \"0\"", "on-failure", "stopped"),
        (", \"--exit-after\", \"50\", \"--code\", \"4\"", "never", "failed"),
    ];
    for (args, policy, want) in cases {
        let file = agent.write_plan("p.toml", &plan(args, policy));
        assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
        agent.wait_for(want, 10, || worker(&agent)["state"] == want);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let w = worker(&agent);
        assert_eq!(w["state"], want, "{policy}: {w}");
        assert_eq!(w["restarts"], 0, "{policy}: {w}");
        let empty = agent.write_plan("e.toml", "version = 1\n");
        assert_eq!(agent.gpuctl(&["apply", "-f", &empty]).code, 0);
    }
}

#[test]
fn a_crash_loop_backs_off_then_fails_with_its_last_words() {
    let agent = agent();
    let file = agent.write_plan(
        "c.toml",
        &plan(", \"--print\", \"loading weights\", \"--exit-after\", \"20\", \"--code\", \"7\"", "on-failure"),
    );
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    let mut saw_backoff = false;
    agent.wait_for("the crash loop to end in failed", 30, || {
        let w = worker(&agent);
        saw_backoff |= w["state"] == "backoff";
        w["state"] == "failed"
    });
    assert!(saw_backoff, "the worker showed backoff between restarts");
    let w = worker(&agent);
    assert_eq!(w["last_exit"], "exited with status 7");
    assert!(w["log_tail"].as_str().unwrap().contains("loading weights"), "{w}");
    assert_eq!(w["restarts"], 10, "{w}");
    let events = agent.gpuctl(&["events"]).stdout;
    assert!(events.contains("crash loop: 11 quick exits in a row"), "{events}");
    assert!(events.contains("it last printed: loading weights"), "{events}");
    // The next apply tries again.
    let diff = agent.gpuctl(&["diff", "-f", &file]);
    assert_eq!(diff.code, 1, "{diff:?}");
}

/// Under time-slicing nothing else enforces a memory budget: a worker above its budget for longer
/// than the grace period is stopped with a clear event, and its neighbour is untouched.
#[test]
fn a_time_slicing_worker_over_its_memory_budget_is_stopped() {
    let settings = crate::harness::settings_file("memory_grace = \"300ms\"\n");
    let agent = Agent::start_with("h200:1", &["--config", &settings]);
    let state = agent.state_dir.join("sim/nvml.json").display().to_string();
    let tw = testworker();
    let text = format!(
        "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n\
         [[models]]\nname = \"hog\"\ncommand = [\"{tw}\", \"--gpu-memory\", \"500\", \"--grow-mib-per-sec\", \"4000\"]\nmemory = \"1GiB\"\nenv = {{ GPU_SIM_STATE = \"{state}\" }}\n\
         [[models]]\nname = \"neighbour\"\ncommand = [\"{tw}\", \"--gpu-memory\", \"900\"]\nmemory = \"1GiB\"\nenv = {{ GPU_SIM_STATE = \"{state}\" }}\n"
    );
    let file = agent.write_plan("b.toml", &text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    let neighbour = agent.worker_pids().into_iter().find(|w| w.0 == "neighbour").unwrap().2.unwrap();
    agent.wait_for("the hog to be stopped", 15, || {
        agent.worker_pids().into_iter().any(|w| w.0 == "hog" && w.3 == "failed")
    });
    let w = agent.gpuctl(&["-o", "json", "workers"]).json();
    let hog = w["workers"].as_array().unwrap().iter().find(|w| w["model"] == "hog").unwrap().clone();
    let last = hog["last_exit"].as_str().unwrap();
    assert!(last.starts_with("stopped by the agent: it used") && last.contains("over its 1024 MiB budget"), "{last}");
    let events = agent.gpuctl(&["events"]).stdout;
    assert!(events.contains("worker_over_budget"), "{events}");
    // The neighbour, within its budget, runs on with the same pid.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let n = agent.worker_pids().into_iter().find(|w| w.0 == "neighbour").unwrap();
    assert_eq!((n.2, n.3.as_str()), (Some(neighbour), "running"));
    assert!(alive(neighbour));
    // The restart policy does not bring the hog back.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(agent.worker_pids().into_iter().any(|w| w.0 == "hog" && w.3 == "failed"));
}

/// `gpuctl logs` (all replicas marked, one replica, tail, follow), `gpuctl stop` and
/// `gpuctl restart`.
#[test]
fn logs_stop_and_restart_of_one_model() {
    use std::io::BufRead;
    let mut agent = agent();
    let text = format!(
        "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"p\"\ncommand = [\"{}\", \"--print\", \"hello\"]\nmemory = \"1GiB\"\nreplicas = 2\n[[models]]\nname = \"q\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"1GiB\"\n",
        testworker()
    );
    let file = agent.write_plan("l.toml", &text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    agent.wait_for("both replicas ready", 10, || {
        let out = agent.gpuctl(&["logs", "p"]).stdout;
        out.contains("p/0 | ready") && out.contains("p/1 | ready")
    });
    let all = agent.gpuctl(&["logs", "p"]).stdout;
    assert!(all.contains("p/1 | hello GPU_AGENT_MODEL=p GPU_AGENT_REPLICA=1"), "{all}");
    let one = agent.gpuctl(&["logs", "p", "--replica", "0", "--tail", "1"]);
    assert_eq!(one.stdout, "ready\n", "{one:?}");
    let missing = agent.gpuctl(&["logs", "nope"]);
    assert_eq!(missing.code, 2, "{missing:?}");
    assert!(missing.stderr.contains("no model \"nope\""), "{missing:?}");

    // Follow: a separate gpuctl process that prints new output as the worker writes it.
    let mut follow = std::process::Command::new(crate::harness::gpuctl_binary())
        .args(["--socket", agent.socket.to_str().unwrap(), "logs", "p", "--replica", "0", "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(follow.stdout.take().unwrap()).lines();

    // Stop: p's workers stop and stay stopped; q is untouched; the plan would start p again.
    let q = agent.worker_pids().into_iter().find(|w| w.0 == "q").unwrap().2;
    let before: Vec<_> = agent.worker_pids().into_iter().filter(|w| w.0 == "p").filter_map(|w| w.2).collect();
    let stop = agent.gpuctl(&["stop", "p"]);
    assert_eq!(stop.code, 0, "{stop:?}");
    assert!(stop.stdout.contains("stopped p/0") && stop.stdout.contains("stopped p/1"), "{stop:?}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let after = agent.worker_pids();
    assert!(after.iter().filter(|w| w.0 == "p").all(|w| w.3 == "stopped" && w.2.is_none()), "{after:?}");
    assert_eq!(after.iter().find(|w| w.0 == "q").unwrap().2, q);
    assert!(before.iter().all(|p| !alive(*p)));
    assert_eq!(agent.gpuctl(&["diff", "-f", &file]).code, 1);

    // Restart: running again with new pids; the follower sees the new output.
    let restart = agent.gpuctl(&["restart", "p"]);
    assert_eq!(restart.code, 0, "{restart:?}");
    let now: Vec<_> = agent.worker_pids().into_iter().filter(|w| w.0 == "p").collect();
    assert!(now.iter().all(|w| w.3 == "running" && w.2.is_some_and(|p| !before.contains(&p))), "{now:?}");
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if seen.iter().filter(|l| l.starts_with("hello")).count() >= 2 {
            break;
        }
    }
    follow.kill().unwrap();
    follow.wait().unwrap();
    assert_eq!(agent.gpuctl(&["diff", "-f", &file]).code, 0, "restarted workers match the plan");

    // Held: once stopped, neither an agent restart (its start-up apply) nor a drain and undrain starts p again;
    // only the operator's own apply or restart does.
    assert_eq!(agent.gpuctl(&["stop", "p"]).code, 0);
    let q = agent.worker_pids().into_iter().find(|w| w.0 == "q").unwrap().2;
    // An open `logs --follow` does not keep the agent from stopping: it is cut off after a grace.
    let mut follower = std::process::Command::new(crate::harness::gpuctl_binary())
        .args(["--socket", agent.socket.to_str().unwrap(), "logs", "q", "--follow"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(agent.stop_agent(libc::SIGTERM), Some(0));
    follower.wait().unwrap();
    agent.launch().unwrap();
    let held = agent.worker_pids();
    assert!(held.iter().filter(|w| w.0 == "p").all(|w| w.3 == "stopped"), "{held:?}");
    assert_eq!(held.iter().find(|w| w.0 == "q").unwrap().2, q, "q adopted, not restarted");
    assert_eq!(agent.gpuctl(&["drain", "0"]).code, 0);
    let refused = agent.gpuctl(&["restart", "p"]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("drained"), "{refused:?}");
    assert_eq!(agent.gpuctl(&["undrain", "0"]).code, 0);
    let undrained = agent.worker_pids();
    assert!(undrained.iter().filter(|w| w.0 == "p").all(|w| w.3 == "stopped"), "{undrained:?}");
    assert!(undrained.iter().any(|w| w.0 == "q" && w.3 == "running"), "{undrained:?}");

    let apply = agent.gpuctl(&["apply", "-f", &file]);
    assert_eq!(apply.code, 0, "{apply:?}");
    let started = agent.worker_pids();
    assert!(started.iter().all(|w| w.3 == "running"), "{started:?}");
}

/// Two distinct free ports (both held while the second is chosen, so they differ).
fn free_ports() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

/// Health checks: a worker is `starting` until its check answers, then `running`; one that never
/// becomes healthy is ended and its restart policy decides.
#[test]
fn health_checks_gate_running_and_end_unhealthy_workers() {
    let agent = agent();
    let (up, down) = free_ports();
    let text = format!(
        "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n\
         [[models]]\nname = \"up\"\ncommand = [\"{tw}\", \"--listen\", \"{up}\"]\nmemory = \"1GiB\"\nhealth = {{ http = \"http://127.0.0.1:{up}/healthz\", interval = \"200ms\" }}\n\
         [[models]]\nname = \"down\"\ncommand = [\"{tw}\"]\nmemory = \"1GiB\"\nrestart = \"never\"\nstop_timeout = \"1s\"\nhealth = {{ tcp = \"127.0.0.1:{down}\", interval = \"100ms\", start_timeout = \"600ms\" }}\n",
        tw = testworker()
    );
    let file = agent.write_plan("h.toml", &text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    let state = |model: &str| agent.worker_pids().into_iter().find(|w| w.0 == model).map(|w| w.3).unwrap_or_default();
    assert_eq!(state("down"), "starting", "not running before it is healthy");
    agent.wait_for("up to become running", 10, || state("up") == "running");
    agent.wait_for("down to be ended", 10, || state("down") == "failed");
    let events = agent.gpuctl(&["events"]).stdout;
    assert!(events.contains("worker_healthy") && events.contains("worker up/0"), "{events}");
    assert!(events.contains("not healthy within 600 ms"), "{events}");
    let w = agent.gpuctl(&["-o", "json", "workers"]).json();
    let down = w["workers"].as_array().unwrap().iter().find(|w| w["model"] == "down").unwrap().clone();
    assert!(down["last_exit"].as_str().unwrap().starts_with("ended after failing its health check"), "{down}");
}

/// Each worker runs in a cgroup of its own with its model's limits; stopping it kills the whole
/// cgroup (also children that left its session) and removes it.
#[test]
fn workers_run_in_their_own_cgroup_with_their_limits() {
    let agent = agent();
    let text = format!(
        "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"boxed\"\ncommand = [\"{}\", \"--fork\", \"2\"]\nmemory = \"1GiB\"\nlimits = {{ memory = \"64MiB\", cpu = 0.5, pids = 32 }}\n",
        testworker()
    );
    let file = agent.write_plan("cg.toml", &text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    let pid = agent.worker_pids()[0].2.unwrap();
    // Where is it? /proc/PID/cgroup: "0::/path" (v2) or "N:memory:/path" (v1).
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let (dir, mem_file, mem_want) = if v2 {
        let path = groups.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        (format!("/sys/fs/cgroup{path}"), "memory.max", "67108864")
    } else {
        let path = groups.lines().find_map(|l| l.split_once(":memory:").map(|(_, p)| p)).unwrap();
        (format!("/sys/fs/cgroup/memory{path}"), "memory.limit_in_bytes", "67108864")
    };
    assert!(dir.contains("gpu-agent-sim-") && dir.ends_with("/boxed.0"), "{dir}");
    assert_eq!(std::fs::read_to_string(format!("{dir}/{mem_file}")).unwrap().trim(), mem_want);
    let pids_dir = if v2 { dir.clone() } else { dir.replace("/memory/", "/pids/") };
    assert_eq!(std::fs::read_to_string(format!("{pids_dir}/pids.max")).unwrap().trim(), "32");
    if !v2 {
        let cpu_dir = dir.replace("/memory/", "/cpu/");
        assert_eq!(std::fs::read_to_string(format!("{cpu_dir}/cpu.cfs_quota_us")).unwrap().trim(), "50000");
    }
    agent.wait_for("the children in the cgroup", 10, || {
        std::fs::read_to_string(format!("{dir}/cgroup.procs")).unwrap().lines().count() >= 3
    });
    let members: Vec<u64> =
        std::fs::read_to_string(format!("{dir}/cgroup.procs")).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    // `gpuctl stop` keeps the worker's record but not its cgroup; the next start makes it anew.
    assert_eq!(agent.gpuctl(&["stop", "boxed"]).code, 0);
    agent.wait_for("every member gone", 10, || members.iter().all(|p| !alive(*p)));
    agent.wait_for("the stopped worker's cgroup removed", 10, || !std::path::Path::new(&dir).exists());
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    assert!(std::path::Path::new(&dir).exists(), "cgroup made again at start");
    let members: Vec<u64> =
        std::fs::read_to_string(format!("{dir}/cgroup.procs")).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let empty = agent.write_plan("e.toml", "version = 1\n");
    assert_eq!(agent.gpuctl(&["apply", "-f", &empty]).code, 0);
    agent.wait_for("every member gone", 10, || members.iter().all(|p| !alive(*p)));
    agent.wait_for("the cgroup removed", 10, || !std::path::Path::new(&dir).exists());
}

/// With the v1 devices controller, a worker may not open another GPU's device node: its own opens
/// as usual (no driver here, so it fails with "No such device"), another GPU's is not permitted.
#[test]
fn the_device_cgroup_denies_other_gpus_nodes() {
    if !std::path::Path::new("/sys/fs/cgroup/devices/cgroup.procs").exists() {
        eprintln!("no cgroup v1 devices controller here: nothing to check");
        return;
    }
    let nodes = tempfile::tempdir().unwrap();
    for minor in [0u64, 1] {
        let path = nodes.path().join(format!("nv{minor}"));
        nix::sys::stat::mknod(
            &path,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, minor),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    }
    std::fs::set_permissions(nodes.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let agent = Agent::start("h200:2");
    let d = nodes.path().display();
    let text = format!(
        "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"dev\"\ncommand = [\"/bin/sh\", \"-c\", \"cat {d}/nv1 2>&1 | head -1; cat {d}/nv0 2>&1 | head -1; exec sleep 600\"]\nmemory = \"1GiB\"\n"
    );
    let file = agent.write_plan("dev.toml", &text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    let log = agent.state_dir.join("logs/dev.0.log");
    agent.wait_for("both opens tried", 10, || std::fs::read_to_string(&log).unwrap_or_default().lines().count() >= 2);
    let out = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains("nv1") && lines[0].contains("Operation not permitted"), "{out}");
    assert!(lines[1].contains("nv0") && !lines[1].contains("Operation not permitted"), "{out}");
}
