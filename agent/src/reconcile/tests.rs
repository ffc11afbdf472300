//! Table tests of reconciliation: plan text and observed workers in, steps out.

use super::*;
use crate::inventory::{ComputeMode, Gpu, Inventory};
use crate::mps::{DaemonSpec, ObservedDaemon};
use crate::plan::{check, parse};
use crate::settings::WorkerPolicy;

fn inventory(gpus: usize) -> Inventory {
    // Whole GPUs of 100 GiB, so the memory arithmetic below is easy to follow.
    Inventory {
        unavailable: Vec::new(),
        driver_version: "test".into(),
        gpus: (0..gpus as u32)
            .map(|index| Gpu {
                index,
                uuid: format!("GPU-{index}"),
                name: "NVIDIA H200".into(),
                pci_device_id: 0x2335_10de,
                pci_bus_id: String::new(),
                memory_total_mib: 100 * 1024,
                memory_used_mib: 0,
                mig_current: false,
                mig_pending: false,
                compute_mode: ComputeMode::Default,
                sm_count: 132,
                minor: Some(index),
                profiles: Vec::new(),
                instances: Vec::new(),
                processes: Vec::new(),
            })
            .collect(),
    }
}

fn desired(text: &str, inv: &Inventory) -> Desired {
    let parsed = parse::parse(text);
    let policy = WorkerPolicy {
        allow_root: false,
        default_user: None,
        restart_backoff: std::time::Duration::from_secs(1),
        memory_grace: std::time::Duration::from_secs(10),
    };
    let (desired, problems) = check::check(&parsed.plan, &parsed.spans, inv, &policy);
    assert!(parsed.problems.is_empty() && problems.is_empty(), "{:?} {problems:?}", parsed.problems);
    desired
}

const TS2: &str = "version = 1\n[[gpus]]\nselect = \"0-1\"\nsharing = \"time-slicing\"\n";
const EX2: &str = "version = 1\n[[gpus]]\nselect = \"0-1\"\nsharing = \"exclusive\"\n";
const MIXED: &str = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"exclusive\"\n[[gpus]]\nselect = \"1\"\nsharing = \"time-slicing\"\n";

fn model(name: &str, memory: &str, replicas: u32, extra: &str) -> String {
    format!(
        "[[models]]\nname = \"{name}\"\ncommand = [\"/usr/bin/sleep\", \"1\"]\nmemory = \"{memory}\"\nreplicas = {replicas}\n{extra}\n"
    )
}

fn run(desired: &Desired, inv: &Inventory, observed: &[Observed]) -> Result<Vec<Step>, PlacementError> {
    reconcile(desired, inv, observed, &[], &BTreeMap::new()).map(|r| r.steps)
}

/// The steps as short strings: "start a/0 gpu0", "stop b/1 gpu1", "create 3g.71gb@4 gpu0".
fn render(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|s| match s {
            Step::StartWorker { spec, .. } => match &spec.instance {
                Some(i) => format!("start {} gpu{} {i} {}", spec.key, spec.gpu, spec.isolation),
                None => format!("start {} gpu{} {}", spec.key, spec.gpu, spec.isolation),
            },
            Step::StopWorker { key, gpu, .. } => format!("stop {key} gpu{gpu}"),
            Step::CreateGpuInstance { gpu, profile, start, .. } => format!("create {profile}@{start} gpu{gpu}"),
            Step::DestroyGpuInstance { gpu, profile, start, .. } => format!("destroy {profile}@{start} gpu{gpu}"),
            Step::EnableMig { gpu, .. } => format!("enable_mig gpu{gpu}"),
            Step::DisableMig { gpu, .. } => format!("disable_mig gpu{gpu}"),
            Step::StartMps { daemon, .. } => format!("start_mps {}", daemon.name),
            Step::StopMps { name, .. } => format!("stop_mps {name}"),
        })
        .collect()
}

/// Observed workers: what applying `text` from scratch would start, all running.
fn running(text: &str, inv: &Inventory) -> Vec<Observed> {
    let steps = run(&desired(text, inv), inv, &[]).unwrap();
    steps
        .into_iter()
        .filter_map(|s| match s {
            Step::StartWorker { spec, .. } => {
                Some(Observed { spec: *spec, pid: Some(1), active: true, held: false, last_exit: None })
            }
            _ => None,
        })
        .collect()
}

#[test]
fn steps_for_each_case() {
    let inv = inventory(2);
    let two_a = format!("{TS2}{}", model("a", "10GiB", 2, ""));
    let cases: Vec<(&str, String, Vec<Observed>, Vec<&str>)> = vec![
        ("empty plan, nothing running", "version = 1\n".into(), vec![], vec![]),
        (
            "replicas spread over GPUs",
            two_a.clone(),
            vec![],
            vec!["start a/0 gpu0 time-slicing", "start a/1 gpu1 time-slicing"],
        ),
        ("same plan again: no steps", two_a.clone(), running(&two_a, &inv), vec![]),
        ("model left the plan", TS2.into(), running(&two_a, &inv), vec!["stop a/0 gpu0", "stop a/1 gpu1"]),
        (
            "scale down stops the highest replica",
            format!("{TS2}{}", model("a", "10GiB", 1, "")),
            running(&two_a, &inv),
            vec!["stop a/1 gpu1"],
        ),
        (
            "a changed command restarts, stops first",
            format!("{TS2}{}", model("a", "10GiB", 2, "")).replace("\"1\"]", "\"2\"]"),
            running(&two_a, &inv),
            vec!["stop a/0 gpu0", "stop a/1 gpu1", "start a/0 gpu0 time-slicing", "start a/1 gpu1 time-slicing"],
        ),
        (
            "a replica that exited is started again",
            two_a.clone(),
            running(&two_a, &inv)
                .into_iter()
                .map(|mut o| {
                    if o.spec.key.replica == 1 {
                        o.active = false;
                        o.pid = None;
                    }
                    o
                })
                .collect(),
            vec!["start a/1 gpu1 time-slicing"],
        ),
        (
            "exclusive: one replica per GPU",
            format!("{EX2}{}", model("x", "50GiB", 2, "")),
            vec![],
            vec!["start x/0 gpu0 exclusive", "start x/1 gpu1 exclusive"],
        ),
        (
            "auto prefers a shared GPU, then a whole one",
            format!("{MIXED}{}{}", model("s", "60GiB", 1, ""), model("t", "60GiB", 1, "")),
            vec![],
            vec!["start s/0 gpu1 time-slicing", "start t/0 gpu0 exclusive"],
        ),
        (
            "memory budgets pack: the third 40 GiB replica goes where room is left",
            format!("{TS2}{}", model("m", "40GiB", 4, "")),
            vec![],
            vec![
                "start m/0 gpu0 time-slicing",
                "start m/1 gpu1 time-slicing",
                "start m/2 gpu0 time-slicing",
                "start m/3 gpu1 time-slicing",
            ],
        ),
        (
            "a pin is honoured",
            format!("{TS2}{}", model("p", "1GiB", 2, "gpu = \"1\"")),
            vec![],
            vec!["start p/0 gpu1 time-slicing", "start p/1 gpu1 time-slicing"],
        ),
    ];
    for (name, text, observed, want) in cases {
        let steps = run(&desired(&text, &inv), &inv, &observed).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(render(&steps), want, "{name}");
    }
}

#[test]
fn running_replicas_stay_where_they_are() {
    let inv = inventory(2);
    let text = format!("{TS2}{}", model("a", "10GiB", 1, ""));
    // a/0 runs on GPU 1, though a fresh placement would choose GPU 0.
    let mut observed = running(&text, &inv);
    observed[0].spec.gpu = 1;
    observed[0].spec.device = "GPU-1".into();
    observed[0].spec.other_gpu_minors = vec![0];
    let steps = run(&desired(&text, &inv), &inv, &observed).unwrap();
    assert!(steps.is_empty(), "{:?}", render(&steps));
    // A worker recorded by an agent that did not yet fill in device rules is not restarted.
    observed[0].spec.other_gpu_minors.clear();
    let steps = run(&desired(&text, &inv), &inv, &observed).unwrap();
    assert!(steps.is_empty(), "{:?}", render(&steps));
}

#[test]
fn what_cannot_be_placed_is_an_error_with_a_reason() {
    let inv = inventory(2);
    let cases = [
        (
            format!("{EX2}{}", model("x", "50GiB", 3, "")),
            "x",
            2,
            "GPU 0 already runs a worker alone, GPU 1 already runs a worker alone",
        ),
        (
            format!("{TS2}{}", model("m", "60GiB", 3, "")),
            "m",
            2,
            "needs 60 GiB; GPU 0 has 40 GiB free, GPU 1 has 40 GiB free",
        ),
    ];
    for (text, model, replica, reason) in cases {
        let err = run(&desired(&text, &inv), &inv, &[]).unwrap_err();
        assert_eq!(err.unplaced.len(), 1, "{err:?}");
        assert_eq!((err.unplaced[0].model.as_str(), err.unplaced[0].replica), (model, replica));
        assert!(err.unplaced[0].reason.contains(reason), "{}", err.unplaced[0].reason);
    }
}

/// A MIG plan on H200s: its GPU steps and where replicas go.
#[test]
fn mig_layouts_and_placement() {
    use crate::inventory::test_support;
    let mut inv = test_support::inventory("h200", 2);
    let mig = |layout: &str| format!("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [{layout}]\n");
    // From MIG off: enable, create, then the workers: a mig-tier one alone in the smallest
    // instance that fits, time-slicing ones spread over the instances left.
    let text = format!(
        "{}{}{}",
        mig("\"3g.71gb\", \"2g.35gb\", \"1g.18gb\""),
        model("alone", "10GiB", 1, "isolation = \"mig\""),
        model("shared", "20GiB", 2, "isolation = \"time-slicing\"")
    );
    let steps = run(&desired(&text, &inv), &inv, &[]).unwrap();
    assert_eq!(
        render(&steps),
        [
            "enable_mig gpu0",
            "create 2g.35gb@0 gpu0",
            "create 1g.18gb@2 gpu0",
            "create 3g.71gb@4 gpu0",
            "start alone/0 gpu0 1g.18gb@2 mig",
            "start shared/0 gpu0 2g.35gb@0 time-slicing",
            "start shared/1 gpu0 3g.71gb@4 time-slicing",
        ]
    );

    // Now the layout exists (MIG on, instances with UUIDs): asking for one more 1g destroys
    // nothing and creates one.
    inv.gpus[0].mig_current = true;
    inv.gpus[0].mig_pending = true;
    inv.gpus[0].instances = [("2g.35gb", 14, 0, 2, 33280), ("1g.18gb", 19, 2, 1, 16384), ("3g.71gb", 9, 4, 4, 71424)]
        .iter()
        .enumerate()
        .map(|(i, (profile, id, start, size, mib))| crate::inventory::GpuInstance {
            id: i as u32 + 1,
            profile_id: *id,
            profile: profile.to_string(),
            start: *start,
            size: *size,
            memory_mib: *mib,
            uuid: Some(format!("MIG-{i}")),
        })
        .collect();
    let grown = mig("\"3g.71gb\", \"2g.35gb\", \"1g.18gb\", \"1g.18gb\"");
    let steps = run(&desired(&grown, &inv), &inv, &[]).unwrap();
    assert_eq!(render(&steps), ["create 1g.18gb@3 gpu0"]);

    // Replacing the 2g with two 1g destroys exactly the 2g.
    let swapped = mig("\"3g.71gb\", \"1g.18gb\", \"1g.18gb\", \"1g.18gb\"");
    let steps = run(&desired(&swapped, &inv), &inv, &[]).unwrap();
    assert_eq!(render(&steps), ["destroy 2g.35gb@0 gpu0", "create 1g.18gb@0 gpu0", "create 1g.18gb@1 gpu0"]);

    // Leaving MIG: destroy everything, then turn it off.
    let off = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n";
    let steps = run(&desired(off, &inv), &inv, &[]).unwrap();
    assert_eq!(
        render(&steps),
        ["destroy 2g.35gb@0 gpu0", "destroy 1g.18gb@2 gpu0", "destroy 3g.71gb@4 gpu0", "disable_mig gpu0"]
    );

    // A process in an instance that must go is a disruption, attributed to its worker.
    inv.gpus[0].processes =
        vec![crate::inventory::GpuProcess { pid: 42, used_mib: 100, gpu_instance_id: Some(1), mps_client: false }];
    let owners: BTreeMap<u32, WorkerKey> = [(42, WorkerKey { model: "shared".into(), replica: 0 })].into();
    let r = reconcile(&desired(&swapped, &inv), &inv, &[], &[], &owners).unwrap();
    assert_eq!(
        r.disruptions,
        [Disruption {
            gpu: 0,
            what: "destroy 2g.35gb@0".into(),
            pids: vec![(42, Some(WorkerKey { model: "shared".into(), replica: 0 }))]
        }]
    );
}

/// MPS: one daemon per `mps` device before its clients; a defaults change restarts the daemon and
/// exactly its clients; compute shares and run-as users are checked per device.
#[test]
fn mps_daemons_and_their_clients() {
    let inv = inventory(2);
    let mps = |defaults: &str| {
        format!(
            "version = 1\n[[gpus]]\nselect = \"1\"\nsharing = \"mps\"\n{defaults}[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\n"
        )
    };
    let text = format!(
        "{}{}{}",
        mps(""),
        model("a", "10GiB", 2, "isolation = \"mps\"\ncompute = 30"),
        model("t", "10GiB", 1, "isolation = \"time-slicing\"")
    );
    let steps = run(&desired(&text, &inv), &inv, &[]).unwrap();
    assert_eq!(
        render(&steps),
        ["start_mps gpu1", "start a/0 gpu1 mps", "start a/1 gpu1 mps", "start t/0 gpu0 time-slicing"]
    );
    let Step::StartWorker { spec, .. } = &steps[1] else { panic!() };
    assert_eq!(spec.mps_daemon.as_deref(), Some("gpu1"));

    // Running, with the daemon up: nothing to do.
    let observed = running(&text, &inv);
    let daemon = |defaults: Option<u32>| ObservedDaemon {
        spec: DaemonSpec {
            name: "gpu1".into(),
            gpu: 1,
            instance: None,
            device: "GPU-1".into(),
            active_thread_percentage: defaults,
            pinned_limit_mib: None,
        },
        running: true,
    };
    let steps = reconcile(&desired(&text, &inv), &inv, &observed, &[daemon(None)], &BTreeMap::new()).unwrap().steps;
    assert!(steps.is_empty(), "{:?}", render(&steps));

    // New daemon defaults: restart the daemon and its two clients, not the time-slicing worker.
    let changed = format!(
        "{}{}{}",
        mps("mps = { active_thread_percentage = 50 }\n"),
        model("a", "10GiB", 2, "isolation = \"mps\"\ncompute = 30"),
        model("t", "10GiB", 1, "isolation = \"time-slicing\"")
    );
    let steps = reconcile(&desired(&changed, &inv), &inv, &observed, &[daemon(None)], &BTreeMap::new()).unwrap().steps;
    assert_eq!(
        render(&steps),
        [
            "stop a/0 gpu1",
            "stop a/1 gpu1",
            "stop_mps gpu1",
            "start_mps gpu1",
            "start a/0 gpu1 mps",
            "start a/1 gpu1 mps"
        ]
    );

    // A client's own limit changed: only that model's workers restart.
    let limit = text.replace("compute = 30", "compute = 20");
    let steps = reconcile(&desired(&limit, &inv), &inv, &observed, &[daemon(None)], &BTreeMap::new()).unwrap().steps;
    assert_eq!(render(&steps), ["stop a/0 gpu1", "stop a/1 gpu1", "start a/0 gpu1 mps", "start a/1 gpu1 mps"]);

    // Removing the tier: clients first, then the daemon.
    let gone = mps("").replace("sharing = \"mps\"", "sharing = \"time-slicing\"");
    let steps = reconcile(&desired(&gone, &inv), &inv, &observed, &[daemon(None)], &BTreeMap::new()).unwrap().steps;
    assert_eq!(render(&steps), ["stop a/0 gpu1", "stop a/1 gpu1", "stop t/0 gpu0", "stop_mps gpu1"]);

    // Compute shares past 100% and a second run-as user do not fit one MPS device.
    let cases = [
        (model("a", "1GiB", 4, "isolation = \"mps\"\ncompute = 30"), "has 10% of its compute left"),
        (
            format!(
                "{}{}",
                model("a", "1GiB", 1, "isolation = \"mps\"\nuser = \"nobody\""),
                model("b", "1GiB", 1, "isolation = \"mps\"\nuser = \"daemon\"")
            ),
            "serves nobody (one MPS server per uid)",
        ),
    ];
    for (models, reason) in cases {
        let err = run(&desired(&format!("{}{models}", mps("")), &inv), &inv, &[]).unwrap_err();
        assert!(err.unplaced[0].reason.contains(reason), "{:?}", err.unplaced);
    }
    // Unless the plan allows oversubscription explicitly.
    let over = format!(
        "{}{}",
        mps("mps = { allow_compute_oversubscription = true }\n"),
        model("a", "1GiB", 4, "isolation = \"mps\"\ncompute = 30")
    );
    assert!(run(&desired(&over, &inv), &inv, &[]).is_ok());
}

#[test]
fn held_workers_start_only_when_the_operator_asks() {
    let inv = inventory(2);
    let plan = format!("{TS2}{}", model("a", "10GiB", 2, ""));
    let held: Vec<Observed> = running(&plan, &inv)
        .into_iter()
        .map(|mut o| {
            if o.spec.key.replica == 1 {
                o.active = false;
                o.held = true;
                o.pid = None;
            }
            o
        })
        .collect();
    let mut d = desired(&plan, &inv);
    assert_eq!(render(&run(&d, &inv, &held).unwrap()), vec!["start a/1 gpu1 time-slicing"], "apply -f starts it");
    d.start_held = false;
    assert!(run(&d, &inv, &held).unwrap().is_empty(), "other applies leave it stopped");
    // A changed spec is a new ask: it starts even then.
    let changed = plan.replace("\"1\"]", "\"2\"]");
    let mut d = desired(&changed, &inv);
    d.start_held = false;
    assert_eq!(
        render(&run(&d, &inv, &held).unwrap()),
        vec!["stop a/0 gpu0", "start a/0 gpu0 time-slicing", "start a/1 gpu1 time-slicing"]
    );
}

#[test]
fn held_workers_stay_stopped_when_placement_moves_them() {
    let inv = inventory(2);
    let plan = format!("{TS2}{}", model("a", "10GiB", 2, ""));
    let all_held: Vec<Observed> = running(&plan, &inv)
        .into_iter()
        .map(|mut o| {
            o.active = false;
            o.held = true;
            o.pid = None;
            o
        })
        .collect();
    // Drain GPU 1: a/1 would move to GPU 0; undrain after a stop on GPU 0 only: a/1 would move
    // back to GPU 1. Neither starts it.
    let mut drained = desired(&plan, &inv);
    drained.start_held = false;
    drained.gpus.remove(&1);
    drained.tolerate_unplaced = true;
    assert!(run(&drained, &inv, &all_held).unwrap().is_empty());
    let both_on_0: Vec<Observed> = all_held
        .iter()
        .cloned()
        .map(|mut o| {
            o.spec.gpu = 0;
            o.spec.device = "GPU-0".into();
            o
        })
        .collect();
    let mut undrained = desired(&plan, &inv);
    undrained.start_held = false;
    assert!(run(&undrained, &inv, &both_on_0).unwrap().is_empty());
    // The operator's apply starts them where placement puts them.
    undrained.start_held = true;
    assert_eq!(run(&undrained, &inv, &both_on_0).unwrap().len(), 2);
}
