//! GPUs and profiles as gpuctl shows them, on the simulated hosts the contract names.

use crate::harness::{Agent, gpuctl_at};

#[test]
fn h200_x8_gpus_and_profiles() {
    let agent = Agent::start("h200:8");
    let out = agent.gpuctl(&["-o", "json", "gpus"]);
    assert_eq!(out.code, 0, "{out:?}");
    let doc = out.json();
    let gpus = doc["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(g["index"], i as u64);
        assert_eq!(g["name"], "NVIDIA H200");
        assert_eq!(g["memory_mib"], 143771);
        assert_eq!(g["mig"]["current"], false);
        assert_eq!(g["mig"]["pending"], false);
        assert!(g["uuid"].as_str().unwrap().starts_with("GPU-"));
        assert_eq!(g["sharing"], serde_json::Value::Null);
        assert_eq!(g["instances"], serde_json::json!([]));
        assert_eq!(g["pci_device_id"], "0x233510de");
    }
    let table = agent.gpuctl(&["gpus"]);
    assert_eq!(table.code, 0);
    assert!(table.stdout.starts_with("GPU  NAME"), "{}", table.stdout);
    assert_eq!(table.stdout.lines().count(), 9, "{}", table.stdout);

    // UUIDs survive an agent restart: the simulated driver keeps its state in the state dir.
    let mut agent = agent;
    let before: Vec<_> = gpus.iter().map(|g| g["uuid"].clone()).collect();
    assert_eq!(agent.stop_agent(libc::SIGTERM), Some(0));
    agent.launch().unwrap();
    let after = agent.gpuctl(&["-o", "json", "gpus"]).json();
    let after: Vec<_> = after["gpus"].as_array().unwrap().iter().map(|g| g["uuid"].clone()).collect();
    assert_eq!(before, after);
}

#[test]
fn mixed_host_profiles_differ_per_product() {
    let agent = Agent::start("a100-40gb:2,h100-80gb:2");
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    let names: Vec<_> =
        gpus["gpus"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(
        names,
        ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]
    );
    let cases = [
        ("0", vec!["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"], 4864),
        ("3", vec!["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"], 9984),
    ];
    for (gpu, want, small_mib) in cases {
        let out = agent.gpuctl(&["-o", "json", "profiles", gpu]);
        assert_eq!(out.code, 0, "{out:?}");
        let doc = out.json();
        let got: Vec<_> =
            doc["profiles"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_string()).collect();
        assert_eq!(got, want, "GPU {gpu}");
        assert_eq!(doc["profiles"][0]["memory_mib"], small_mib, "GPU {gpu}");
        assert_eq!(doc["profiles"][0]["placements"].as_array().unwrap().len(), 7);
    }
    // By UUID too; an unknown GPU is a usage error naming it.
    let uuid = gpus["gpus"][2]["uuid"].as_str().unwrap().to_string();
    assert_eq!(agent.gpuctl(&["profiles", &uuid]).code, 0);
    let bad = agent.gpuctl(&["profiles", "9"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("no GPU \"9\""), "{bad:?}");
}

/// The simulated H200 must answer as the real one did (tests/fixtures/h200-probe.txt), through the
/// whole stack: fake NVML, nvml-wrapper, the agent, gRPC and gpuctl's JSON.
#[test]
fn simulated_h200_matches_the_real_probe() {
    let probe = include_str!("../fixtures/h200-probe.txt");
    let agent = Agent::start("h200:1");
    let profiles = agent.gpuctl(&["-o", "json", "profiles", "0"]).json();
    let profiles = profiles["profiles"].as_array().unwrap();
    // "gi profile 0 id 19 slices 1 count 7 memMiB 16384 sm 16 copy 1 dec 1 enc 0 jpeg 1 ofa 0"
    let mut seen = 0;
    for line in probe.lines().filter(|l| l.starts_with("gi profile ") && l.contains(" id ")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let field = |name: &str| -> u64 { f[f.iter().position(|w| *w == name).unwrap() + 1].parse().unwrap() };
        let id = field("id");
        let p = profiles.iter().find(|p| p["id"] == id).unwrap_or_else(|| panic!("profile id {id} missing"));
        assert_eq!(p["slices"], field("slices"), "id {id} slices");
        assert_eq!(p["max"], field("count"), "id {id} count");
        assert_eq!(p["memory_mib"], field("memMiB"), "id {id} memory");
        assert_eq!(p["sm"], field("sm"), "id {id} sm");
        assert_eq!(p["copy_engines"], field("copy"), "id {id} copy engines");
        assert_eq!(p["decoders"], field("dec"), "id {id} decoders");
        assert_eq!(p["encoders"], field("enc"), "id {id} encoders");
        assert_eq!(p["jpegs"], field("jpeg"), "id {id} jpeg");
        assert_eq!(p["ofas"], field("ofa"), "id {id} ofa");
        seen += 1;
    }
    assert_eq!(seen, 7);
    assert_eq!(profiles.len(), 7);
    // "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1"
    for line in probe.lines().filter(|l| l.contains("Profile ID") && l.contains("Placement")) {
        let id: u64 = line.split("Profile ID").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        let spec = line.split(": ").nth(1).unwrap().trim();
        let (starts, size) = spec.split_once(':').unwrap();
        let starts: Vec<u64> = starts.trim_matches(['{', '}']).split(',').map(|s| s.parse().unwrap()).collect();
        let p = profiles.iter().find(|p| p["id"] == id).unwrap();
        let got: Vec<(u64, u64)> = p["placements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|pl| (pl["start"].as_u64().unwrap(), pl["size"].as_u64().unwrap()))
            .collect();
        let want: Vec<(u64, u64)> = starts.iter().map(|s| (*s, size.parse().unwrap())).collect();
        assert_eq!(got, want, "placements of profile {id}");
    }
    // "|   0  MIG 1g.18gb         19     7/7 ..." : names as nvidia-smi prints them, without "MIG ".
    let mut named = 0;
    for line in probe.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (name, id) = match f.as_slice() {
            ["|", _, "MIG", name, id, ..] => (*name, id.parse::<u64>().unwrap()),
            _ => continue,
        };
        named += 1;
        let p = profiles.iter().find(|p| p["id"] == id).unwrap();
        assert_eq!(p["name"], name, "name of profile {id}");
    }
    assert_eq!(named, 7);
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    let g = &gpus["gpus"][0];
    assert_eq!(g["name"], "NVIDIA H200");
    assert!(probe.contains(&format!("{} MiB", g["memory_mib"])), "whole card memory {}", g["memory_mib"]);
    assert_eq!(g["memory_mib"], 143771);
    assert_eq!(g["memory_used_mib"], 0, "nvidia-smi shows 0 MiB used on an idle card");
    assert_eq!(g["compute_mode"], "default");
    assert_eq!(g["sm_count"], 132);
}

#[test]
fn unreachable_agent_names_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody-here.sock");
    let out = gpuctl_at(&socket, &["status"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains(&socket.display().to_string()), "{out:?}");
    assert!(out.stderr.contains("No such file or directory"), "{out:?}");
}

/// MIG instances and GPU processes that the driver reports show up in gpuctl, and a worker's GPU
/// memory is attributed to it. The instances and the process usage are written into the simulated
/// driver's state, as a real driver would report them.
#[test]
fn instances_processes_and_memory_attribution() {
    let agent = Agent::start("h200:1");
    let plan = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n[[models]]\nname = \"w\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"4GiB\"\n";
    let plan = agent.write_plan("w.toml", plan);
    assert_eq!(agent.gpuctl(&["apply", "-f", &plan]).code, 0);
    let pid = agent.worker_pids()[0].2.unwrap() as u32;
    let state = agent.state_dir.join("sim/nvml.json");
    gpu_sim::SimHost::update(&state, |host| {
        let gpu = &mut host.gpus[0];
        gpu.mig_current = true;
        gpu.mig_pending = true;
        gpu.instances = vec![
            gpu_sim::SimGpuInstance {
                id: 1,
                profile_id: 9,
                start: 4,
                size: 4,
                mig_uuid: Some("MIG-11111111-2222-3333-4444-555555555555".into()),
            },
            gpu_sim::SimGpuInstance { id: 2, profile_id: 19, start: 0, size: 1, mig_uuid: None },
        ];
        gpu.processes = vec![gpu_sim::SimProcess { pid, used_mib: 3000, gpu_instance_id: None, mps_client: false }];
        Ok::<_, ()>(())
    })
    .unwrap()
    .unwrap();
    let gpus = agent.gpuctl(&["-o", "json", "gpus"]).json();
    let g = &gpus["gpus"][0];
    assert_eq!(g["mig"], serde_json::json!({"current": true, "pending": true}));
    assert_eq!(
        g["instances"],
        serde_json::json!([
            {"profile": "1g.18gb", "profile_id": 19, "start": 0, "size": 1, "uuid": null, "memory_mib": 16384, "id": 2},
            {"profile": "3g.71gb", "profile_id": 9, "start": 4, "size": 4, "uuid": "MIG-11111111-2222-3333-4444-555555555555", "memory_mib": 71424, "id": 1},
        ])
    );
    assert_eq!(g["processes"][0]["pid"], pid);
    assert_eq!(g["processes"][0]["used_mib"], 3000);
    assert_eq!(g["memory_used_mib"], 3000);
    let workers = agent.gpuctl(&["-o", "json", "workers"]).json();
    assert_eq!(workers["workers"][0]["gpu_memory_used_mib"], 3000);
    let table = agent.gpuctl(&["gpus"]).stdout;
    assert!(table.contains("└ 3g.71gb@4  MIG-11111111-2222-3333-4444-555555555555"), "{table}");
    let status = agent.gpuctl(&["status"]).stdout;
    assert!(status.contains("time-slicing  on   2          1"), "{status}");
}
