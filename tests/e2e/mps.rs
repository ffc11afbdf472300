//! The MPS tier on the simulated host: supervised daemons (the fake `nvidia-cuda-mps-control`,
//! which gpu-agent runs as under --simulate) and test workers that are MPS clients of them.

use crate::harness::{Agent, environ, testworker};
use std::time::{Duration, Instant};

fn plan(agent: &Agent, defaults: &str, extra_models: &str) -> String {
    let state = agent.state_dir.join("sim/nvml.json");
    format!(
        "version = 1\n[[gpus]]\nselect = \"1\"\nsharing = \"mps\"\n{defaults}\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n\
         [[models]]\nname = \"c\"\ncommand = [\"{tw}\", \"--gpu-memory\", \"1000\"]\nisolation = \"mps\"\ncompute = 25\nmemory = \"4GiB\"\nreplicas = 2\nuser = \"root\"\nenv = {{ GPU_SIM_STATE = \"{state}\" }}\n\
         [[models]]\nname = \"t\"\ncommand = [\"{tw}\"]\nisolation = \"time-slicing\"\nmemory = \"1GiB\"\nuser = \"root\"\n{extra_models}",
        tw = testworker(),
        state = state.display()
    )
}

/// An agent on two simulated H200s whose settings let plans run workers as root.
fn start() -> Agent {
    Agent::start_with("h200:2", &["--config", &root_config()])
}

fn root_config() -> String {
    crate::harness::settings_file("allow_root_workers = true\n")
}

fn status(agent: &Agent) -> serde_json::Value {
    agent.gpuctl(&["-o", "json", "status"]).json()
}

fn daemon_pid(agent: &Agent) -> u64 {
    status(agent)["mps_daemons"][0]["pid"].as_u64().unwrap()
}

fn control(agent: &Agent, command: &str) -> String {
    let base = agent.state_dir.join("sim/run/mps/gpu1");
    let out = std::process::Command::new(agent.state_dir.join("sim/bin/nvidia-cuda-mps-control"))
        .env("CUDA_MPS_PIPE_DIRECTORY", base.join("pipe"))
        .env("CUDA_MPS_LOG_DIRECTORY", base.join("log"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            // The tool exits without reading when no daemon answers: a broken pipe is no failure.
            let _ = writeln!(c.stdin.take().unwrap(), "{command}");
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn mps_workers(agent: &Agent) -> Vec<(u64, String)> {
    let w = agent.gpuctl(&["-o", "json", "workers"]).json();
    w["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["isolation"] == "mps")
        .map(|w| (w["pid"].as_u64().unwrap_or(0), w["state"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn mps_tier_end_to_end() {
    let agent = start();
    let file = agent.write_plan(
        "mps.toml",
        &plan(&agent, "mps = { active_thread_percentage = 80, pinned_memory_limit = \"20GiB\" }", ""),
    );
    let out = agent.gpuctl(&["-o", "json", "apply", "-f", &file]);
    assert_eq!(out.code, 0, "{out:?}");
    let actions: Vec<String> =
        out.json()["steps"].as_array().unwrap().iter().map(|s| s["action"].as_str().unwrap().to_string()).collect();
    assert_eq!(
        actions,
        ["start_mps", "start_worker", "start_worker", "start_worker"],
        "the daemon comes before its clients"
    );

    // One daemon for GPU 1, confined to its UUID, with its own pipe and log directories and the
    // plan's defaults set before any client started.
    let s = status(&agent);
    let d = &s["mps_daemons"][0];
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    assert_eq!(d["name"], "gpu1");
    assert_eq!(d["device"], gpus["gpus"][1]["uuid"]);
    assert_eq!(d["state"], "running");
    assert_eq!(control(&agent, "get_default_active_thread_percentage"), "80.0");
    assert_eq!(control(&agent, "get_default_device_pinned_mem_limit 0"), "20480M");
    let log = std::fs::read_to_string(agent.state_dir.join("sim/run/mps/gpu1/log/control.log")).unwrap();
    let set = log.find("Cmd:set_default_active_thread_percentage").expect("defaults set through the command interface");
    let client = log.find("NEW CLIENT").expect("clients connected");
    assert!(set < client, "defaults before the first client:\n{log}");

    // Each client gets its daemon's pipe directory and its own limits.
    agent.wait_for("both clients connected", 10, || mps_workers(&agent).iter().all(|(_, s)| s == "running"));
    for (pid, _) in mps_workers(&agent) {
        let env: std::collections::BTreeMap<_, _> = environ(pid).into_iter().collect();
        assert!(env["CUDA_MPS_PIPE_DIRECTORY"].ends_with("sim/run/mps/gpu1/pipe"));
        assert!(env["CUDA_MPS_LOG_DIRECTORY"].ends_with("sim/run/mps/gpu1/log"));
        assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
        assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=4096M");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], gpus["gpus"][1]["uuid"].as_str().unwrap());
    }
    // NVML's process list shows them as MPS clients, attributed to their model, beside the server.
    agent.wait_for("the clients in NVML's MPS list", 10, || {
        let g = agent.gpuctl(&["-o", "json", "gpus"]).json();
        let procs = g["gpus"][1]["processes"].as_array().unwrap().clone();
        procs.iter().filter(|p| p["mps_client"] == true && p["model"] == "c").count() == 2
    });
    let w = agent.gpuctl(&["-o", "json", "workers"]).json();
    assert!(
        w["workers"].as_array().unwrap().iter().filter(|w| w["model"] == "c").all(|w| w["gpu_memory_used_mib"] == 1000)
    );
    // Re-applying changes nothing.
    assert_eq!(agent.gpuctl(&["diff", "-f", &file]).code, 0);

    // New daemon defaults: the daemon and exactly its clients restart; the time-slicing worker stays.
    let t_pid = agent.worker_pids().into_iter().find(|w| w.0 == "t").unwrap().2;
    let changed = agent.write_plan("mps2.toml", &plan(&agent, "mps = { active_thread_percentage = 60 }", ""));
    let diff = agent.gpuctl(&["-o", "json", "diff", "-f", &changed]);
    let actions: Vec<String> = diff.json()["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s["action"].as_str().unwrap(),
                s["model"].as_str().or(s["mps_daemon"].as_str()).unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        actions,
        ["stop_worker c", "stop_worker c", "stop_mps gpu1", "start_mps gpu1", "start_worker c", "start_worker c"]
    );
    assert_eq!(agent.gpuctl(&["apply", "-f", &changed]).code, 0);
    assert_eq!(control(&agent, "get_default_active_thread_percentage"), "60.0");
    assert_eq!(agent.worker_pids().into_iter().find(|w| w.0 == "t").unwrap().2, t_pid);

    // Removing the tier: clients stop, then the daemon quits.
    let none = agent.write_plan("none.toml", "version = 1\n");
    let out = agent.gpuctl(&["-o", "json", "apply", "-f", &none]);
    let actions: Vec<String> =
        out.json()["steps"].as_array().unwrap().iter().map(|s| s["action"].as_str().unwrap().to_string()).collect();
    assert_eq!(actions.last().map(String::as_str), Some("stop_mps"));
    assert_eq!(status(&agent)["mps_daemons"], serde_json::json!([]));
    assert!(control(&agent, "get_server_list").is_empty());
}

#[test]
fn a_killed_daemon_is_restarted_with_its_clients() {
    let agent = start();
    let file = agent.write_plan("mps.toml", &plan(&agent, "", ""));
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    agent.wait_for("clients running", 10, || mps_workers(&agent).iter().all(|(_, s)| s == "running"));
    let before: Vec<u64> = mps_workers(&agent).iter().map(|(p, _)| *p).collect();
    let daemon = daemon_pid(&agent);
    let killed = Instant::now();
    // SAFETY: kill(2) on the daemon the agent started for this test.
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
    agent.wait_for("the daemon back and its clients restarted", 20, || {
        let s = status(&agent);
        let w = mps_workers(&agent);
        s["mps_daemons"][0]["pid"].as_u64().is_some_and(|p| p != daemon)
            && s["mps_daemons"][0]["state"] == "running"
            && w.iter().all(|(p, st)| st == "running" && !before.contains(p))
    });
    let recovery = killed.elapsed();
    assert!(recovery < Duration::from_secs(20));
    assert_eq!(status(&agent)["mps_daemons"][0]["restarts"], 1);
    let events = agent.gpuctl(&["events"]).stdout;
    assert!(events.contains("mps_down") && events.contains("mps_recovered"), "{events}");
    // The restarted clients are MPS clients of the new server.
    agent.wait_for("clients connected again", 10, || !control(&agent, "get_server_list").is_empty());
}

#[test]
fn a_faulted_server_ends_its_clients_and_they_come_back() {
    let agent = start();
    let file = agent.write_plan("mps.toml", &plan(&agent, "", ""));
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    agent.wait_for("a server", 10, || !control(&agent, "get_server_list").is_empty());
    let before: Vec<u64> = mps_workers(&agent).iter().map(|(p, _)| *p).collect();
    let server = control(&agent, "get_server_list");
    control(&agent, &format!("fake_fault {server}"));
    agent.wait_for("clients running again with new pids", 20, || {
        let w = mps_workers(&agent);
        w.len() == 2 && w.iter().all(|(p, st)| st == "running" && !before.contains(p))
    });
    let events = agent.gpuctl(&["events"]).stdout;
    assert!(events.contains("FAULT") || events.contains("worker_backoff"), "{events}");
}

#[test]
fn no_client_starts_without_its_daemon() {
    // A control binary that cannot start a daemon: the clients must not start (they would run
    // without MPS and without limits).
    let agent = Agent::start_with("h200:2", &["--config", &root_config(), "--mps-control", "/bin/false"]);
    let file = agent.write_plan("mps.toml", &plan(&agent, "", ""));
    let out = agent.gpuctl(&["apply", "-f", &file]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("start_mps gpu1 on GPU 1"), "{out:?}");
    assert!(out.stdout.contains("does not answer; not starting a client that would run without MPS"), "{out:?}");
    let clients = mps_workers(&agent);
    assert_eq!(clients.len(), 2, "a client that cannot start is still listed, failed: {clients:?}");
    assert!(clients.iter().all(|(pid, st)| *pid == 0 && st == "failed"), "{clients:?}");
}

#[test]
fn mps_plans_are_checked_per_device() {
    let agent = start();
    let tw = testworker();
    let base = "version = 1\n[[gpus]]\nselect = \"1\"\nsharing = \"mps\"\n";
    let cases = [
        (
            format!(
                "{base}[[models]]\nname = \"a\"\ncommand = [\"{tw}\"]\nisolation = \"mps\"\nmemory = \"1GiB\"\ncompute = 60\nreplicas = 2\n"
            ),
            "has 40% of its compute left",
        ),
        (
            format!(
                "{base}[[models]]\nname = \"a\"\ncommand = [\"{tw}\"]\nisolation = \"mps\"\nmemory = \"1GiB\"\nuser = \"nobody\"\n[[models]]\nname = \"b\"\ncommand = [\"{tw}\"]\nisolation = \"mps\"\nmemory = \"1GiB\"\nuser = \"root\"\n"
            ),
            "one MPS server per uid",
        ),
    ];
    for (text, want) in cases {
        let file = agent.write_plan("bad.toml", &text);
        let out = agent.gpuctl(&["apply", "-f", &file]);
        assert_eq!(out.code, 2, "{out:?}");
        assert!(out.stderr.contains(want), "{want}: {}", out.stderr);
    }
    assert_eq!(status(&agent)["mps_daemons"], serde_json::json!([]));
}

#[test]
fn daemons_survive_an_agent_restart() {
    let mut agent = start();
    let file = agent.write_plan("mps.toml", &plan(&agent, "", ""));
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    agent.wait_for("clients running", 10, || mps_workers(&agent).iter().all(|(_, s)| s == "running"));
    let daemon = daemon_pid(&agent);
    let clients: Vec<u64> = mps_workers(&agent).iter().map(|(p, _)| *p).collect();
    agent.stop_agent(libc::SIGKILL);
    agent.launch().unwrap();
    assert_eq!(daemon_pid(&agent), daemon, "the daemon was adopted, not restarted");
    let now: Vec<u64> = mps_workers(&agent).iter().map(|(p, _)| *p).collect();
    assert_eq!(now, clients);
    assert_eq!(agent.gpuctl(&["diff", "-f", &file]).code, 0);
    // Clean up the tier so the daemon does not outlive the test.
    let none = agent.write_plan("none.toml", "version = 1\n");
    assert_eq!(agent.gpuctl(&["apply", "-f", &none]).code, 0);
}

/// MPS inside a MIG instance: one daemon per `mps` instance, confined to the instance's MIG UUID,
/// whose clients see that UUID.
#[test]
fn mps_in_a_mig_instance() {
    let agent = start();
    let tw = testworker();
    let text = format!(
        "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [\"3g.71gb\", {{ profile = \"3g.71gb\", sharing = \"mps\" }}]\n\
         [[models]]\nname = \"c\"\ncommand = [\"{tw}\"]\nisolation = \"mps\"\nmemory = \"8GiB\"\ncompute = 50\nreplicas = 2\nuser = \"root\"\n"
    );
    let file = agent.write_plan("mig-mps.toml", &text);
    let out = agent.gpuctl(&["-o", "json", "apply", "-f", &file]);
    assert_eq!(out.code, 0, "{out:?}");
    let actions: Vec<String> =
        out.json()["steps"].as_array().unwrap().iter().map(|s| s["action"].as_str().unwrap().to_string()).collect();
    assert_eq!(
        actions,
        ["enable_mig", "create_gpu_instance", "create_gpu_instance", "start_mps", "start_worker", "start_worker"]
    );
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    let instances = gpus["gpus"][0]["instances"].as_array().unwrap();
    let s = status(&agent);
    let d = &s["mps_daemons"][0];
    assert_eq!(d["state"], "running");
    let name = d["name"].as_str().unwrap();
    let label = name.strip_prefix("gpu0-").unwrap();
    let inst =
        instances.iter().find(|i| format!("{}@{}", i["profile"].as_str().unwrap(), i["start"]) == label).unwrap();
    assert_eq!(d["device"], inst["uuid"], "the daemon is confined to its instance");
    agent.wait_for("clients running", 10, || mps_workers(&agent).iter().all(|(_, s)| s == "running"));
    for (pid, _) in mps_workers(&agent) {
        let env: std::collections::BTreeMap<_, _> = environ(pid).into_iter().collect();
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], inst["uuid"].as_str().unwrap());
        assert!(env["CUDA_MPS_PIPE_DIRECTORY"].contains(name));
    }
    let diff = agent.gpuctl(&["diff", "-f", &file]);
    assert_eq!(diff.code, 0, "{diff:?}");
    // `partition set` keeps an instance's MPS with the `:mps` suffix.
    let keep = agent.gpuctl(&["partition", "set", "0", "4g.71gb", "3g.71gb:mps", "--dry-run"]);
    assert_eq!(keep.code, 0, "{keep:?}");
    let none = agent.write_plan("none.toml", "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n");
    assert_eq!(agent.gpuctl(&["apply", "-f", &none]).code, 0);
    assert_eq!(status(&agent)["mps_daemons"], serde_json::json!([]));
}

/// An `mps` worker whose GPU process is not an MPS client (it would run without limits) is
/// reported.
#[test]
fn a_worker_that_is_not_an_mps_client_is_reported() {
    let agent = start();
    let file = agent.write_plan("mps.toml", &plan(&agent, "", ""));
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    agent.wait_for("clients running", 10, || mps_workers(&agent).iter().all(|(_, s)| s == "running"));
    // The driver sees one client's process as a plain CUDA process, as when a client started while
    // its daemon was away.
    let pid = mps_workers(&agent)[0].0 as u32;
    let path = agent.state_dir.join("sim/nvml.json");
    gpu_sim::SimHost::update(&path, |h| {
        for p in h.gpus[1].processes.iter_mut().filter(|p| p.pid == pid) {
            p.mps_client = false;
        }
        Ok::<_, ()>(())
    })
    .unwrap()
    .unwrap();
    agent.wait_for("the mps_not_client event", 10, || {
        agent.gpuctl(&["events"]).stdout.contains("is not an MPS client of gpu1")
    });
}

/// A daemon that died while the agent was down is replaced by the start-up apply, and the tier
/// works again: no stray daemon, no stuck record.
#[test]
fn a_daemon_that_died_while_the_agent_was_down_is_replaced() {
    let mut agent = start();
    let file = agent.write_plan("mps.toml", &plan(&agent, "", ""));
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    agent.wait_for("clients running", 10, || mps_workers(&agent).iter().all(|(_, s)| s == "running"));
    let daemon = daemon_pid(&agent);
    assert_eq!(agent.stop_agent(libc::SIGTERM), Some(0));
    // SAFETY: kill(2) on the daemon this test's agent started.
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(200));
    agent.launch().unwrap();
    let s = status(&agent);
    assert_eq!(s["last_apply"]["ok"], true, "{s:#}");
    assert_eq!(s["mps_daemons"].as_array().unwrap().len(), 1, "{s:#}");
    assert_ne!(daemon_pid(&agent), daemon);
    assert_eq!(s["mps_daemons"][0]["state"], "running");
    agent.wait_for("clients running", 10, || mps_workers(&agent).iter().all(|(_, s)| s == "running"));
    assert_eq!(agent.gpuctl(&["diff", "-f", &file]).code, 0);
    let none = agent.write_plan("none.toml", "version = 1\n");
    assert_eq!(agent.gpuctl(&["apply", "-f", &none]).code, 0);
}
