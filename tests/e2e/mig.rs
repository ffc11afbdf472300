//! MIG through gpuctl on the simulated driver: layouts, incremental changes, drain, rollback,
//! pending modes and re-creation after a reboot. (A real card's MIG settings are never changed:
//! all of this is proven against the simulator only.)

use crate::harness::{Agent, Out, alive, environ};

fn instances(agent: &Agent, gpu: usize) -> Vec<String> {
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    gpus["gpus"][gpu]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| format!("{}@{}", i["profile"].as_str().unwrap(), i["start"]))
        .collect()
}

fn actions(out: &Out) -> Vec<String> {
    out.json()["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| match s["profile"].as_str() {
            Some(p) => format!("{} {p}@{}", s["action"].as_str().unwrap(), s["start"]),
            None => s["action"].as_str().unwrap().to_string(),
        })
        .collect()
}

fn sim(agent: &Agent, f: impl FnOnce(&mut gpu_sim::SimHost)) {
    let path = agent.state_dir.join("sim/nvml.json");
    gpu_sim::SimHost::update(&path, |h| {
        f(h);
        Ok::<_, ()>(())
    })
    .unwrap()
    .unwrap();
}

#[test]
fn partition_set_is_incremental_and_shows_in_gpus() {
    let agent = Agent::start("h200:2");
    let seven = ["1g.18gb"; 7];
    let mut args = vec!["partition", "set", "0"];
    args.extend(seven);
    let out = agent.gpuctl(&args);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(instances(&agent, 0), (0..7).map(|s| format!("1g.18gb@{s}")).collect::<Vec<_>>());
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    assert_eq!(gpus["gpus"][0]["mig"], serde_json::json!({"current": true, "pending": true}));
    assert!(
        gpus["gpus"][0]["instances"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["uuid"].as_str().unwrap().starts_with("MIG-"))
    );
    assert_eq!(gpus["gpus"][0]["sharing"], "mig");
    assert_eq!(gpus["gpus"][1]["mig"]["current"], false, "GPU 1 is left alone");

    // The same layout again: nothing to do.
    let mut again = vec!["-o", "json", "partition", "set", "0", "--dry-run"];
    again.extend(seven);
    assert_eq!(actions(&agent.gpuctl(&again)), Vec::<String>::new());

    // One instance changed on a GPU holding seven: exactly one destroy and one create.
    let uuids_before = agent.gpuctl(&["-o", "json", "gpus"]).json()["gpus"][0]["instances"].clone();
    let mut change = vec!["-o", "json", "partition", "set", "0", "--dry-run"];
    change.extend(["1g.18gb"; 6]);
    change.push("1g.18gb+me");
    let dry = agent.gpuctl(&change);
    assert_eq!(actions(&dry), ["destroy_gpu_instance 1g.18gb@6", "create_gpu_instance 1g.18gb+me@6"], "{dry:?}");
    change.retain(|a| *a != "--dry-run");
    assert_eq!(agent.gpuctl(&change).code, 0);
    let after = agent.gpuctl(&["-o", "json", "gpus"]).json()["gpus"][0]["instances"].clone();
    for slot in 0..6 {
        assert_eq!(after[slot]["uuid"], uuids_before[slot]["uuid"], "instance at slot {slot} kept its UUID");
    }
    assert_eq!(after[6]["profile"], "1g.18gb+me");

    // partition show lists the layout and the free slices; clear turns MIG off.
    let show = agent.gpuctl(&["partition", "show"]);
    assert!(show.stdout.contains("GPU 0: NVIDIA H200 (MIG on); free memory slices: 7"), "{show:?}");
    assert!(show.stdout.contains("1g.18gb+me@6"), "{show:?}");
    let clear = agent.gpuctl(&["-o", "json", "partition", "clear", "0"]);
    assert_eq!(clear.code, 0, "{clear:?}");
    assert_eq!(actions(&clear).iter().filter(|a| a.starts_with("destroy")).count(), 7);
    assert_eq!(actions(&clear).last().map(String::as_str), Some("disable_mig"));
    assert!(instances(&agent, 0).is_empty());
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    assert_eq!(gpus["gpus"][0]["mig"]["current"], false);
    assert_eq!(gpus["gpus"][0]["sharing"], "time-slicing");
}

#[test]
fn invalid_layouts_are_refused_with_a_suggestion() {
    let agent = Agent::start("h200:1,a30:1");
    let cases: [(&str, &[&str], &str); 7] = [
        (
            "0",
            &["3g.71gb", "3g.71gb", "3g.71gb"],
            "3 x 3g.71gb requested, but GPU 0 (NVIDIA H200) takes at most 2; a layout that fits: 3g.71gb 3g.71gb",
        ),
        ("0", &["4g.71gb", "4g.71gb"], "takes at most 1; a layout that fits: 4g.71gb"),
        (
            "0",
            &["1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb"],
            "8 x 1g.18gb requested",
        ),
        ("0", &["7g.141gb", "1g.18gb"], "a layout that fits: 7g.141gb"),
        ("0", &["2g.35gb@1"], "2g.35gb@1 is not a valid placement: 2g.35gb starts at 0, 2, 4"),
        ("0", &["1g.18gb+me", "1g.18gb+me"], "one media extension"),
        ("1", &["4g.24gb", "1g.6gb"], "NVIDIA A30) has 4; a layout that fits: 4g.24gb"),
    ];
    for (gpu, layout, want) in cases {
        let mut args = vec!["partition", "set", gpu];
        args.extend(layout);
        let out = agent.gpuctl(&args);
        assert_eq!(out.code, 2, "{layout:?}: {out:?}");
        assert!(out.stderr.contains(want), "{layout:?}: {}", out.stderr);
        assert!(instances(&agent, gpu.parse().unwrap()).is_empty(), "nothing changed");
    }
    let out = agent.gpuctl(&["partition", "set", "0", "3g.40gb"]);
    assert!(out.stderr.contains("profile \"3g.40gb\" does not exist"), "{out:?}");
    let out = agent.gpuctl(&["partition", "set", "5", "3g.71gb"]);
    assert_eq!(out.code, 2, "{out:?}");
}

#[test]
fn mig_workers_get_their_instance_and_drain_is_required_to_move_them() {
    let agent = Agent::start("h200:1");
    let plan = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [\"3g.71gb\", \"2g.35gb\", \"1g.18gb\"]\n[[models]]\nname = \"small\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"10GiB\"\nisolation = \"mig\"\n[[models]]\nname = \"big\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"60GiB\"\nisolation = \"mig\"\n";
    let file = agent.write_plan("mig.toml", plan);
    let out = agent.gpuctl(&["apply", "-f", &file]);
    assert_eq!(out.code, 0, "{out:?}");
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    let uuid_of = |label: &str| {
        gpus["gpus"][0]["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| format!("{}@{}", i["profile"].as_str().unwrap(), i["start"]) == label)
            .map(|i| i["uuid"].as_str().unwrap().to_string())
            .unwrap()
    };
    let workers = agent.gpuctl(&["-o", "json", "workers"]).json();
    let w = workers["workers"].as_array().unwrap();
    // The smallest instance that fits each: 60 GiB needs the 3g, 10 GiB takes the 1g.
    let big = w.iter().find(|w| w["model"] == "big").unwrap();
    let small = w.iter().find(|w| w["model"] == "small").unwrap();
    let three_g = instances(&agent, 0).into_iter().find(|i| i.starts_with("3g")).unwrap();
    let one_g = instances(&agent, 0).into_iter().find(|i| i.starts_with("1g")).unwrap();
    assert_eq!(big["device"], uuid_of(&three_g));
    assert_eq!(small["device"], uuid_of(&one_g));
    assert_eq!(big["isolation"], "mig");
    let small_pid = small["pid"].as_u64().unwrap();
    assert_eq!(environ(small_pid).into_iter().find(|(k, _)| k == "CUDA_VISIBLE_DEVICES").unwrap().1, uuid_of(&one_g));
    let show = agent.gpuctl(&["partition", "show", "0"]);
    assert!(show.stdout.contains("small/0"), "{show:?}");

    // The driver sees the small worker's process in its instance (as a CUDA process would be).
    let gi =
        gpus["gpus"][0]["instances"].as_array().unwrap().iter().find(|i| i["uuid"] == uuid_of(&one_g)).unwrap()["id"]
            .as_u64()
            .unwrap() as u32;
    sim(&agent, |h| {
        h.gpus[0].processes.push(gpu_sim::SimProcess {
            pid: small_pid as u32,
            used_mib: 900,
            gpu_instance_id: Some(gi),
            mps_client: false,
        })
    });
    let gpus_now = agent.gpuctl(&["-o", "json", "gpus"]).json();
    assert_eq!(gpus_now["gpus"][0]["processes"][0]["model"], "small", "GPU processes are attributed to their model");

    // A layout without that 1g would kill it: refused without --drain, naming pid and model.
    let out = agent.gpuctl(&["partition", "set", "0", "3g.71gb", "2g.35gb"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.contains(&format!("destroy {one_g} on GPU 0 would kill pid {small_pid} (model small/0)")),
        "{out:?}"
    );
    assert!(out.stderr.contains("--drain"), "{out:?}");
    assert!(alive(small_pid));
    assert_eq!(instances(&agent, 0).len(), 3, "nothing changed");

    // With --drain: the worker stops first, the instance goes, and the worker starts again where
    // the plan puts it now (the 2g, the smallest instance left that fits).
    let out = agent.gpuctl(&["-o", "json", "partition", "set", "0", "3g.71gb", "2g.35gb", "--drain"]);
    assert_eq!(out.code, 0, "{out:?}");
    let order = actions(&out);
    let stop = order.iter().position(|a| a == "stop_worker").unwrap();
    let destroy = order.iter().position(|a| a.starts_with("destroy_gpu_instance")).unwrap();
    let start = order.iter().position(|a| a.starts_with("start_worker")).unwrap();
    assert!(stop < destroy && destroy < start, "{order:?}");
    assert!(!alive(small_pid));
    let workers = agent.gpuctl(&["-o", "json", "workers"]).json();
    let small = workers["workers"].as_array().unwrap().iter().find(|w| w["model"] == "small").unwrap().clone();
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    let two_g =
        gpus["gpus"][0]["instances"].as_array().unwrap().iter().find(|i| i["profile"] == "2g.35gb").unwrap()["uuid"]
            .clone();
    assert_eq!(small["device"], two_g);
    assert_eq!(small["state"], "running");
}

#[test]
fn processes_that_are_not_ours_always_block() {
    let agent = Agent::start("h200:1");
    assert_eq!(agent.gpuctl(&["partition", "set", "0", "3g.71gb", "3g.71gb"]).code, 0);
    let mut stranger = std::process::Command::new("/usr/bin/sleep").arg("60").spawn().unwrap();
    let pid = stranger.id();
    sim(&agent, |h| {
        let gi = h.gpus[0].instances[0].id;
        h.gpus[0].processes.push(gpu_sim::SimProcess {
            pid,
            used_mib: 100,
            gpu_instance_id: Some(gi),
            mps_client: false,
        });
    });
    let out = agent.gpuctl(&["partition", "set", "0", "7g.141gb", "--drain"]);
    stranger.kill().unwrap();
    stranger.wait().unwrap();
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains(&format!("would kill pid {pid}, which is not run by this agent")), "{out:?}");
    assert_eq!(instances(&agent, 0).len(), 2);
}

#[test]
fn a_failed_create_rolls_the_whole_change_back() {
    let agent = Agent::start("h200:2");
    assert_eq!(agent.gpuctl(&["partition", "set", "0", "4g.71gb", "3g.71gb"]).code, 0);
    let before = instances(&agent, 0);
    let uuids_before: Vec<_> = agent.gpuctl(&["-o", "json", "gpus"]).json()["gpus"][0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["uuid"].clone())
        .collect();
    // The third create fails with INSUFFICIENT_RESOURCES (23), as a driver might mid-change.
    sim(&agent, |h| {
        h.faults.push(gpu_sim::Fault {
            call: "nvmlDeviceCreateGpuInstanceWithPlacement".into(),
            gpu: None,
            after: 2,
            times: 1,
            code: 23,
            seen: 0,
        })
    });
    let out = agent.gpuctl(&["-o", "json", "partition", "set", "0", "2g.35gb", "2g.35gb", "2g.35gb", "1g.18gb"]);
    assert_eq!(out.code, 1, "{out:?}");
    let doc = out.json();
    assert_eq!(doc["rolled_back"], true, "{doc:#}");
    assert!(doc["message"].as_str().unwrap().contains("rolled back"), "{doc:#}");
    let failed: Vec<_> = doc["results"].as_array().unwrap().iter().filter(|r| r["ok"] == false).collect();
    assert_eq!(failed.len(), 1);
    assert!(failed[0]["error"].as_str().unwrap().contains("nvmlDeviceCreateGpuInstanceWithPlacement"), "{doc:#}");
    assert!(doc["rollback"].as_array().unwrap().iter().all(|r| r["ok"] == true), "{doc:#}");
    // Same profiles at the same placements as before (new UUIDs: they are new instances).
    assert_eq!(instances(&agent, 0), before);
    let uuids_after: Vec<_> = agent.gpuctl(&["-o", "json", "gpus"]).json()["gpus"][0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["uuid"].clone())
        .collect();
    assert!(uuids_after.iter().all(|u| u.as_str().unwrap().starts_with("MIG-")));
    assert_ne!(uuids_after, uuids_before);
    // The stored plan is still the old layout: re-applying it changes nothing.
    let status = agent.gpuctl(&["-o", "json", "status"]).json();
    assert_eq!(status["last_apply"]["ok"], false);
    let events = agent.gpuctl(&["events"]).stdout;
    assert!(events.contains("rolled back"), "{events}");
}

#[test]
fn a_pending_mode_names_what_holds_the_gpu() {
    let agent = Agent::start("a100-40gb:2");
    let node = std::fs::File::open(agent.state_dir.join("sim/dev/nvidia0")).unwrap();
    let mut holder = std::process::Command::new("/usr/bin/sleep").arg("60").stdin(node).spawn().unwrap();
    let out = agent.gpuctl(&["partition", "set", "0", "3g.20gb"]);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("MIG mode on is pending"), "{out:?}");
    assert!(out.stdout.contains(&format!("held by pid {} (sleep)", holder.id())), "{out:?}");
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    assert_eq!(gpus["gpus"][0]["mig"], serde_json::json!({"current": false, "pending": false}), "request withdrawn");
    assert_eq!(gpus["gpus"][1]["mig"], serde_json::json!({"current": false, "pending": false}), "other GPU untouched");
    // Once nothing holds it, the same change goes through (the Ampere reset succeeds).
    let out = agent.gpuctl(&["partition", "set", "0", "3g.20gb"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(instances(&agent, 0), ["3g.20gb@4"]);
}

#[test]
fn layouts_are_recreated_after_a_reboot_before_workers_start() {
    let mut agent = Agent::start("h200:1");
    let plan = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [\"4g.71gb\", \"3g.71gb\"]\n[[models]]\nname = \"m\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"50GiB\"\nisolation = \"mig\"\n";
    let file = agent.write_plan("m.toml", plan);
    assert_eq!(agent.gpuctl(&["apply", "-f", &file]).code, 0);
    let pid = agent.worker_pids()[0].2.unwrap();
    agent.stop_agent(libc::SIGTERM);
    // A reboot: the worker is gone, GPU instances are gone, and a Hopper GPU's MIG mode does not
    // survive the driver reload either.
    // SAFETY: kill(2) on the worker this test started.
    unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
    sim(&agent, |h| {
        h.gpus[0].instances.clear();
        h.gpus[0].mig_current = false;
        h.gpus[0].mig_pending = false;
    });
    agent.launch().unwrap();
    assert_eq!(instances(&agent, 0), ["4g.71gb@0", "3g.71gb@4"]);
    let workers = agent.gpuctl(&["-o", "json", "workers"]).json();
    let w = &workers["workers"][0];
    assert_eq!(w["state"], "running");
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    let uuids: Vec<_> = gpus["gpus"][0]["instances"].as_array().unwrap().iter().map(|i| i["uuid"].clone()).collect();
    assert!(uuids.contains(&w["device"]), "the worker runs in a re-created instance: {w}");
}

#[test]
fn read_only_gpus_refuse_mig_changes() {
    let agent = Agent::start_with("h200:1", &["--read-only-gpus"]);
    let out = agent.gpuctl(&["partition", "set", "0", "7g.141gb"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.contains("enable_mig on GPU 0 changes a GPU setting, and the agent runs with --read-only-gpus"),
        "{out:?}"
    );
    let dry = agent.gpuctl(&["partition", "set", "0", "7g.141gb", "--dry-run"]);
    assert!(dry.stderr.contains("applying would be refused"), "{dry:?}");
    assert!(instances(&agent, 0).is_empty());
}

/// The driver refusing a destroy (IN_USE: a process appeared after the plan was made) fails the
/// step with the driver's word for it and undoes what the apply did before.
#[test]
fn a_destroy_the_driver_refuses_rolls_back() {
    let agent = Agent::start("h200:1");
    assert_eq!(agent.gpuctl(&["partition", "set", "0", "2g.35gb", "2g.35gb", "2g.35gb"]).code, 0);
    let before = instances(&agent, 0);
    sim(&agent, |h| {
        h.faults.push(gpu_sim::Fault {
            call: "nvmlGpuInstanceDestroy".into(),
            gpu: Some(0),
            after: 1,
            times: 1,
            code: 19,
            seen: 0,
        })
    });
    let out = agent.gpuctl(&["-o", "json", "partition", "set", "0", "7g.141gb"]);
    assert_eq!(out.code, 1, "{out:?}");
    let doc = out.json();
    let failed = doc["results"].as_array().unwrap().iter().find(|r| r["ok"] == false).unwrap().clone();
    assert_eq!(failed["action"], "destroy_gpu_instance");
    assert!(failed["error"].as_str().unwrap().contains("nvmlGpuInstanceDestroy"), "{doc:#}");
    assert_eq!(doc["rollback"].as_array().unwrap().len(), 1, "the one destroy that succeeded is undone: {doc:#}");
    assert_eq!(instances(&agent, 0), before);
    // The instance whose destroy failed halfway got its compute instance back: every instance is
    // a MIG device, and the layout is whole again.
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    assert!(gpus["gpus"][0]["instances"].as_array().unwrap().iter().all(|i| i["uuid"].is_string()), "{gpus:#}");
}

/// Two `partition set` runs at once, on two GPUs: both land (each edits the stored plan as it is
/// when it holds the apply lock).
#[test]
fn concurrent_partition_changes_both_land() {
    let agent = Agent::start("h200:2");
    let socket = agent.socket.clone();
    let other = socket.clone();
    let a = std::thread::spawn(move || crate::harness::gpuctl_at(&socket, &["partition", "set", "0", "3g.71gb"]));
    let b = std::thread::spawn(move || crate::harness::gpuctl_at(&other, &["partition", "set", "1", "4g.71gb"]));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!((a.code, b.code), (0, 0), "{a:?}\n{b:?}");
    assert_eq!(instances(&agent, 0), ["3g.71gb@4"]);
    assert_eq!(instances(&agent, 1), ["4g.71gb@0"]);
}
