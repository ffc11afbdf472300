//! Applying plans: workers start with the right device and environment, re-applying is a no-op,
//! models leaving the plan stop, and workers survive an agent restart.

use crate::harness::{Agent, alive, environ};

const DEMO: &str = include_str!("../../examples/demo.toml");

fn env_of(pid: u64, key: &str) -> Option<String> {
    environ(pid).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

#[test]
fn demo_plan_applies_then_is_a_no_op() {
    let agent = Agent::start("h200:8");
    let plan = agent.write_plan("demo.toml", DEMO);

    // Dry run: ordered steps, nothing changes.
    let dry = agent.gpuctl(&["-o", "json", "apply", "-f", &plan, "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    let steps = dry.json()["steps"].as_array().unwrap().clone();
    assert_eq!(steps.len(), 6, "{dry:?}");
    assert!(steps.iter().all(|s| s["action"] == "start_worker" && s["gpu"].is_u64()));
    assert!(agent.worker_pids().is_empty(), "a dry run starts nothing");
    let diff = agent.gpuctl(&["diff", "-f", &plan]);
    assert_eq!(diff.code, 1, "diff exits 1 when something would change: {diff:?}");
    assert!(diff.stdout.contains("+ start_worker chat-small/0 on GPU 0"), "{diff:?}");

    let applied = agent.gpuctl(&["apply", "-f", &plan]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert!(applied.stdout.contains("applied 6 step(s)"), "{applied:?}");

    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    let uuid = |i: usize| gpus["gpus"][i]["uuid"].as_str().unwrap().to_string();
    assert_eq!(gpus["gpus"][0]["sharing"], "time-slicing");
    assert_eq!(gpus["gpus"][2]["sharing"], "exclusive");
    assert_eq!(gpus["gpus"][5]["sharing"], serde_json::Value::Null);

    let workers = agent.gpuctl(&["-o", "json", "workers"]).json();
    let workers = workers["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 6);
    // Placement: a model's replicas spread over the time-slicing GPUs 0 and 1 (lowest index
    // first); the 130 GiB model gets GPU 2 alone.
    let expect = [
        ("chat-small", 0, 0, "time-slicing"),
        ("chat-small", 1, 1, "time-slicing"),
        ("chat-small", 2, 0, "time-slicing"),
        ("embedder", 0, 0, "time-slicing"),
        ("embedder", 1, 1, "time-slicing"),
        ("llm-70b", 0, 2, "exclusive"),
    ];
    for (w, (model, replica, gpu, isolation)) in workers.iter().zip(expect) {
        assert_eq!((w["model"].as_str().unwrap(), w["replica"].as_u64().unwrap()), (model, replica));
        assert_eq!(w["state"], "running", "{w}");
        assert_eq!(w["isolation"], isolation);
        assert_eq!(w["device"], uuid(gpu), "{model}/{replica}");
        assert_eq!(w["restarts"], 0);
        let pid = w["pid"].as_u64().unwrap();
        assert!(alive(pid));
        // The worker sees only its device, and who it is.
        assert_eq!(env_of(pid, "CUDA_VISIBLE_DEVICES"), Some(uuid(gpu)));
        assert_eq!(env_of(pid, "GPU_AGENT_DEVICE"), Some(uuid(gpu)));
        assert_eq!(env_of(pid, "GPU_AGENT_MODEL").as_deref(), Some(model));
        assert_eq!(env_of(pid, "GPU_AGENT_REPLICA"), Some(replica.to_string()));
        // Its own session (it leads it), as the default run-as user, with a clean environment.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        assert_eq!(fields[3], pid.to_string(), "session id of {model}/{replica}");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap().uid;
        assert!(
            status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&nobody.to_string())),
            "{status}"
        );
        assert_eq!(env_of(pid, "GPU_SIM_STATE"), None, "the agent's own environment does not leak");
        let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        fds.sort();
        assert_eq!(fds, ["0", "1", "2"], "only stdin, stdout and stderr are open in {model}/{replica}");
        assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "no_new_privs is set: {status}");
    }
    let embed_pid = workers[3]["pid"].as_u64().unwrap();
    assert_eq!(env_of(embed_pid, "EMBED_BATCH").as_deref(), Some("64"));

    // The worker's output lands in its log file.
    let log = agent.state_dir.join("logs/chat-small.1.log");
    agent.wait_for("the chat-small/1 log line", 10, || {
        std::fs::read_to_string(&log).unwrap_or_default().contains("chat-small/1 serving on GPU-")
    });

    // Re-applying the same plan takes zero steps.
    let diff = agent.gpuctl(&["diff", "-f", &plan]);
    assert_eq!(diff.code, 0, "{diff:?}");
    assert!(diff.stdout.contains("no changes"), "{diff:?}");
    let again = agent.gpuctl(&["-o", "json", "apply", "-f", &plan]);
    assert_eq!(again.code, 0);
    assert_eq!(again.json()["steps"], serde_json::json!([]));

    let status = agent.gpuctl(&["status"]);
    assert!(status.stdout.contains("6 running"), "{status:?}");
}

#[test]
fn models_leaving_the_plan_stop_and_changes_restart() {
    let agent = Agent::start("h200:2");
    let base = "version = 1\n[[gpus]]\nselect = \"all\"\nsharing = \"time-slicing\"\n";
    let two = format!(
        "{base}[[models]]\nname = \"a\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"10GiB\"\nreplicas = 2\n[[models]]\nname = \"b\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"10GiB\"\n"
    );
    let plan = agent.write_plan("two.toml", &two);
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    let before = agent.worker_pids();
    assert_eq!(before.len(), 3);

    // b leaves, a shrinks to one replica and gets a new command.
    let one = format!("{base}[[models]]\nname = \"a\"\ncommand = [\"/usr/bin/sleep\", \"700\"]\nmemory = \"10GiB\"\n");
    let plan = agent.write_plan("one.toml", &one);
    let diff = agent.gpuctl(&["-o", "json", "diff", "-f", &plan]);
    assert_eq!(diff.code, 1);
    let actions: Vec<(String, String)> = diff.json()["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (s["action"].as_str().unwrap().to_string(), format!("{}/{}", s["model"].as_str().unwrap(), s["replica"]))
        })
        .collect();
    let want = [("stop_worker", "a/0"), ("stop_worker", "a/1"), ("stop_worker", "b/0"), ("start_worker", "a/0")];
    assert_eq!(actions, want.map(|(a, w)| (a.to_string(), w.to_string())));
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    for (_, _, pid, _) in &before {
        let pid = pid.unwrap();
        agent.wait_for("old workers to be gone", 10, || !alive(pid));
    }
    let after = agent.worker_pids();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].3, "running");
    let cmdline = std::fs::read_to_string(format!("/proc/{}/cmdline", after[0].2.unwrap())).unwrap();
    assert!(cmdline.contains("700"), "{cmdline}");

    // An empty plan stops everything.
    let empty = agent.write_plan("empty.toml", "version = 1\n");
    assert_eq!(agent.gpuctl(&["apply", "-f", &empty]).code, 0);
    assert!(agent.worker_pids().is_empty());
}

#[test]
fn sigterm_ignoring_worker_is_killed_after_stop_timeout() {
    let agent = Agent::start("h200:1");
    let stubborn = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"stubborn\"\ncommand = [\"/bin/sh\", \"-c\", \"trap '' TERM; sleep 600 & wait\"]\nmemory = \"1GiB\"\nstop_timeout = \"300ms\"\n";
    let plan = agent.write_plan("s.toml", stubborn);
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    let pid = agent.worker_pids()[0].2.unwrap();
    // Let the shell install its trap and start its child.
    agent.wait_for("the child sleep", 10, || {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).is_ok_and(|c| !c.trim().is_empty())
    });
    let child: u64 = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let empty = agent.write_plan("empty.toml", "version = 1\n");
    let out = agent.gpuctl(&["apply", "-f", &empty]);
    assert_eq!(out.code, 0, "{out:?}");
    agent.wait_for("worker and its child to be gone", 10, || !alive(pid) && !alive(child));
    let events = agent.gpuctl(&["events"]);
    assert!(events.stdout.contains("ignored SIGTERM"), "{events:?}");
}

#[test]
fn crashed_worker_is_reported_and_restarted_by_the_next_apply() {
    let agent = Agent::start("h200:1");
    let text = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"crashy\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"1GiB\"\nrestart = \"never\"\n";
    let plan = agent.write_plan("c.toml", text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    let pid = agent.worker_pids()[0].2.unwrap();
    // SAFETY: kill(2) on the worker we just started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    agent.wait_for("the crash to be recorded", 10, || agent.worker_pids()[0].3 == "failed");
    let workers = agent.gpuctl(&["-o", "json", "workers"]).json();
    assert_eq!(workers["workers"][0]["last_exit"], "killed by signal 9 (SIGKILL)");
    assert_eq!(workers["workers"][0]["pid"], serde_json::Value::Null);
    let diff = agent.gpuctl(&["diff", "-f", &plan]);
    assert_eq!(diff.code, 1);
    assert!(diff.stdout.contains("not running (killed by signal 9 (SIGKILL))"), "{diff:?}");
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    assert_eq!(agent.worker_pids()[0].3, "running");
    let w = agent.gpuctl(&["-o", "json", "workers"]).json();
    assert_eq!(w["workers"][0]["restarts"], 1, "starting a worker that had exited is a restart");
}

/// A worker that died while the agent was down is handled by its restart policy: `never` leaves
/// it `failed` (the start-up apply does not start it); `on-failure` starts it again.
#[test]
fn a_worker_lost_while_the_agent_was_down_follows_its_policy() {
    let mut agent = Agent::start("h200:1");
    let text = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n\
                [[models]]\nname = \"once\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"1GiB\"\nrestart = \"never\"\n\
                [[models]]\nname = \"again\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"1GiB\"\nrestart = \"on-failure\"\n";
    let plan = agent.write_plan("p.toml", text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    let before = agent.worker_pids();
    assert_eq!(agent.stop_agent(libc::SIGKILL), Some(128 + 9));
    for w in &before {
        // SAFETY: kill(2) on workers this test started.
        unsafe { libc::kill(w.2.unwrap() as i32, libc::SIGKILL) };
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    agent.launch().unwrap();
    let after = agent.worker_pids();
    let state = |m: &str| after.iter().find(|w| w.0 == m).unwrap().3.clone();
    assert_eq!(state("once"), "failed", "{after:?}");
    assert_eq!(state("again"), "running", "{after:?}");
}

/// An agent that dies while `gpuctl stop` waits out a worker's stop timeout finishes that stop at
/// its next start, and the worker stays `stopped`: the start-up apply does not bring it back.
#[test]
fn a_stop_interrupted_by_an_agent_crash_is_finished_and_held() {
    let mut agent = Agent::start("h200:1");
    let text = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"stubborn\"\ncommand = [\"/bin/sh\", \"-c\", \"trap '' TERM; sleep 600 & wait\"]\nmemory = \"1GiB\"\nstop_timeout = \"2s\"\n";
    let plan = agent.write_plan("s.toml", text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    let pid = agent.worker_pids()[0].2.unwrap();
    agent.wait_for("the child sleep", 10, || {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).is_ok_and(|c| !c.trim().is_empty())
    });
    let mut stop = std::process::Command::new(crate::harness::gpuctl_binary())
        .args(["--socket", agent.socket.to_str().unwrap(), "stop", "stubborn"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    agent.wait_for("the worker stopping", 10, || agent.worker_pids()[0].3 == "stopping");
    assert_eq!(agent.stop_agent(libc::SIGKILL), Some(128 + 9));
    let _ = stop.wait();
    assert!(alive(pid), "the stubborn worker outlived the agent");
    agent.launch().unwrap();
    agent.wait_for("the stop finished", 10, || !alive(pid));
    let w = agent.worker_pids();
    assert_eq!(w[0].3, "stopped", "{w:?}");
    assert_eq!(w[0].2, None, "not started again: {w:?}");
}

#[test]
fn workers_survive_an_agent_restart_and_are_adopted() {
    let mut agent = Agent::start("h200:2");
    let text = "version = 1\n[[gpus]]\nselect = \"all\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"keep\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"4GiB\"\nreplicas = 20\n";
    let plan = agent.write_plan("k.toml", text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    let before = agent.worker_pids();
    assert_eq!(agent.stop_agent(libc::SIGKILL), Some(128 + 9));
    for (_, _, pid, _) in &before {
        assert!(alive(pid.unwrap()), "workers outlive the agent");
    }
    // One worker dies while the agent is down.
    let victim = before[3].2.unwrap();
    // SAFETY: kill(2) on a worker this test started.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(100));
    agent.launch().unwrap();
    // The stored plan is re-applied at start: the three live workers are adopted with the same
    // pids, the dead one is started again.
    let after = agent.worker_pids();
    assert_eq!(after.len(), 20);
    let victim_key = (before[3].0.clone(), before[3].1);
    for (b, a) in before.iter().zip(&after).filter(|(b, _)| (b.0.clone(), b.1) != victim_key) {
        assert_eq!(b.2, a.2, "{} keeps its pid", a.0);
        assert_eq!(a.3, "running");
    }
    let replaced = after.iter().find(|a| (a.0.clone(), a.1) == victim_key).unwrap();
    assert_ne!(replaced.2, before[3].2);
    assert_eq!(replaced.3, "running");
    let events = agent.gpuctl(&["events"]).stdout;
    assert!(events.contains("adopted worker keep/0"), "{events}");
    assert!(events.contains("exited while the agent was down"), "{events}");
    // An adopted worker that crashes is restarted under its restart policy.
    let adopted = after[0].2.unwrap();
    // SAFETY: kill(2) on a worker this test started.
    unsafe { libc::kill(adopted as i32, libc::SIGKILL) };
    agent.wait_for("the adopted worker restarted", 10, || {
        let w = agent.worker_pids();
        w[0].3 == "running" && w[0].2.is_some_and(|p| p != adopted)
    });
}

fn session_members(sid: u64) -> Vec<u64> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let rest = stat.rfind(')').map(|i| &stat[i + 2..]).unwrap_or("");
            rest.split_whitespace().nth(3) == Some(&sid.to_string()) && alive(*pid)
        })
        .collect()
}

/// A worker that exits leaves nothing behind: what it started in its session goes too.
#[test]
fn an_exited_worker_leaves_no_orphans() {
    let agent = Agent::start("h200:1");
    let text = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"forker\"\ncommand = [\"/bin/sh\", \"-c\", \"/usr/bin/sleep 601 & sleep 0.3; exit 3\"]\nmemory = \"1GiB\"\nrestart = \"never\"\n";
    let plan = agent.write_plan("f.toml", text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    let pid = agent.worker_pids()[0].2.unwrap();
    agent.wait_for("the background child", 10, || session_members(pid).len() >= 2);
    agent.wait_for("the worker to fail", 10, || agent.worker_pids()[0].3 == "failed");
    agent.wait_for("its session to be empty", 10, || session_members(pid).is_empty());
    let w = agent.gpuctl(&["-o", "json", "workers"]).json();
    assert_eq!(w["workers"][0]["last_exit"], "exited with status 3");
}

/// A worker the agent was stopping when it died is stopped by the next agent, not left
/// `stopping`; the restarted agent then applies its stored plan.
#[test]
fn an_interrupted_stop_is_finished_after_a_restart() {
    let mut agent = Agent::start("h200:1");
    let base = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n";
    let stubborn = format!(
        "{base}[[models]]\nname = \"stubborn\"\ncommand = [\"/bin/sh\", \"-c\", \"trap '' TERM; while true; do sleep 0.1; done\"]\nmemory = \"1GiB\"\nstop_timeout = \"2s\"\n"
    );
    let plan = agent.write_plan("s.toml", &stubborn);
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    let pid = agent.worker_pids()[0].2.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let empty = agent.write_plan("empty.toml", base);
    let socket = agent.socket.clone();
    let stopper = std::thread::spawn(move || crate::harness::gpuctl_at(&socket, &["apply", "-f", &empty]));
    agent.wait_for("the worker to be stopping", 10, || agent.worker_pids()[0].3 == "stopping");
    agent.stop_agent(libc::SIGKILL);
    let _ = stopper.join();
    assert!(alive(pid), "SIGTERM is ignored, and the agent died before SIGKILL");
    agent.launch().unwrap();
    assert!(!alive(pid), "the new agent finished the stop before serving");
    // The interrupted apply never completed, so the stored plan (with the worker) is applied again.
    let workers = agent.worker_pids();
    assert_eq!(workers.len(), 1, "{workers:?}");
    assert_ne!(workers[0].2, Some(pid));
    assert_eq!(workers[0].3, "running");
}

/// `gpuctl drain GPU` stops the workers on that GPU (others keep running), places them elsewhere
/// where there is room, and keeps the GPU out of placement until `gpuctl undrain`.
#[test]
fn drain_and_undrain_a_gpu() {
    let agent = Agent::start("h200:2");
    let text = "version = 1\n[[gpus]]\nselect = \"all\"\nsharing = \"time-slicing\"\n\
                [[models]]\nname = \"small\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"10GiB\"\nreplicas = 2\n\
                [[models]]\nname = \"big\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"100GiB\"\nreplicas = 2\n";
    let file = agent.write_plan("d.toml", text);
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    let on = |gpu: u64| -> Vec<(String, u64)> {
        let w = agent.gpuctl(&["-o", "json", "workers"]).json();
        w["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["gpu"] == gpu && w["state"] == "running")
            .map(|w| (format!("{}/{}", w["model"].as_str().unwrap(), w["replica"]), w["pid"].as_u64().unwrap()))
            .collect()
    };
    let gpu0_before = on(0);
    assert_eq!(on(1).len(), 2, "small/1 and big/1 on GPU 1");

    let out = agent.gpuctl(&["drain", "1"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(on(1).is_empty(), "nothing runs on the drained GPU");
    // What was on GPU 0 is untouched; small/1 moved to GPU 0; big/1 has no room there.
    let gpu0 = on(0);
    for w in &gpu0_before {
        assert!(gpu0.contains(w), "{w:?} kept running: {gpu0:?}");
    }
    assert!(gpu0.iter().any(|(k, _)| k == "small/1"), "{gpu0:?}");
    assert!(!gpu0.iter().any(|(k, _)| k == "big/1"));
    let status = agent.gpuctl(&["-o", "json", "status"]).json();
    assert_eq!(status["gpus"][1]["drained"], true);
    assert!(agent.gpuctl(&["events"]).stdout.contains("big/1 does not run while GPUs are drained"));
    // A drain excuses only what the drain displaces: a plan too big for the whole host is refused.
    let too_big = agent.write_plan("big.toml", &text.replace("replicas = 2\n", "replicas = 3\n"));
    let out = agent.gpuctl(&["apply", "-f", &too_big]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("cannot be placed"), "{out:?}");
    assert_eq!(on(0), gpu0, "the refused plan changed nothing");

    let out = agent.gpuctl(&["undrain", "1"]);
    assert_eq!(out.code, 0, "{out:?}");
    let gpu1 = on(1);
    assert_eq!(
        gpu1.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["big/1"],
        "big/1 runs again where there is room"
    );
    assert_eq!(agent.gpuctl(&["-o", "json", "status"]).json()["gpus"][1]["drained"], false);
    assert_eq!(agent.gpuctl(&["diff", "-f", &file]).code, 0);
}
