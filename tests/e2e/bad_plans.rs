//! A table of bad plans. Each must be refused with exit 2, name the offending key path and its
//! line, and change nothing: the running workers and the stored plan stay as they were.

use crate::harness::Agent;

const GPUS: &str = "version = 1\n[[gpus]]\nselect = \"0-1\"\nsharing = \"time-slicing\"\n[[gpus]]\nselect = \"2\"\nsharing = \"exclusive\"\n";

fn model(extra: &str) -> String {
    format!("{GPUS}[[models]]\nname = \"m\"\ncommand = [\"/usr/bin/sleep\", \"600\"]\nmemory = \"1GiB\"\n{extra}\n")
}

fn model_without(key: &str) -> String {
    model("").lines().filter(|l| !l.starts_with(key)).collect::<Vec<_>>().join("\n")
}

/// (plan text, key path the problem must name, words the message must hold)
fn cases() -> Vec<(String, &'static str, &'static str)> {
    vec![
        ("version = 2\n".into(), "version", "version 2 is not supported"),
        ("[[gpus]]\nselect = \"0\"\nsharing = \"exclusive\"\n".into(), "version", "version is required"),
        ("version = 1\nmodles = []\n".into(), "modles", "unknown key \"modles\""),
        ("version = 1\n[[gpus]\n".into(), "", "not valid TOML"),
        ("version = 1\ngpus = \"all\"\n".into(), "gpus", "must be an array of tables"),
        ("version = 1\n[[gpus]]\nselect = \"9\"\nsharing = \"exclusive\"\n".into(), "gpus[0].select", "GPU 9 does not exist"),
        ("version = 1\n[[gpus]]\nselect = \"3-1\"\nsharing = \"exclusive\"\n".into(), "gpus[0].select", "runs backwards"),
        ("version = 1\n[[gpus]]\nselect = \"GPU-00000000-0000-0000-0000-000000000000\"\nsharing = \"exclusive\"\n".into(), "gpus[0].select", "no GPU has UUID"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"magic\"\n".into(), "gpus[0].sharing", "\"magic\" is not one of"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\n".into(), "gpus[0].sharing", "sharing is required"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"exclusive\"\n[[gpus]]\nselect = \"0-1\"\nsharing = \"exclusive\"\n".into(), "gpus[1].select", "GPU 0 is already selected by gpus[0]"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [\"3g.40gb\"]\n".into(), "gpus[0].mig[0]", "profile \"3g.40gb\" does not exist on NVIDIA H200"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [\"3g.71gb@2\"]\n".into(), "gpus[0].mig[0]", "3g.71gb@2 is not a valid placement"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\nmig = [\"1g.18gb\"]\n".into(), "gpus[0].mig", "only valid with sharing = \"mig\""),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharring = \"mig\"\nsharing = \"exclusive\"\n".into(), "gpus[0].sharring", "unknown key"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mps\"\nmps = { active_thread_percentage = 150 }\n".into(), "gpus[0].mps.active_thread_percentage", "150 is out of range"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"auto\"\n".into(), "gpus[0].sharing", "this agent version applies only"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mps\"\nmps = { allow_compute_oversubscription = 1 }\n".into(), "gpus[0].mps.allow_compute_oversubscription", "must be true or false"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"time-slicing\"\ntimeslice = \"eternal\"\n".into(), "gpus[0].timeslice", "\"eternal\" is not one of"),
        (model_without("memory"), "models[0].memory", "memory is required"),
        (model("memory = \"lots\"").replace("memory = \"1GiB\"\n", ""), "models[0].memory", "\"lots\" is not a size"),
        (model("memory = 6").replace("memory = \"1GiB\"\n", ""), "models[0].memory", "bare number"),
        (model("memory = \"300GiB\"").replace("memory = \"1GiB\"\n", ""), "models[0].memory", "more than any device"),
        (format!("{}[[models]]\nname = \"m\"\ncommand = [\"/usr/bin/sleep\"]\nmemory = \"1GiB\"\n", model("")), "models[1].name", "duplicate model name \"m\""),
        (model("").replace("name = \"m\"", "name = \"Bad_Name\""), "models[0].name", "not a valid model name"),
        (model("").replace("command = [\"/usr/bin/sleep\", \"600\"]", "command = \"/usr/bin/sleep 600\""), "models[0].command", "never go through a shell"),
        (model("").replace("\"/usr/bin/sleep\"", "\"sleep\""), "models[0].command[0]", "not an absolute path"),
        (model("").replace("\"/usr/bin/sleep\"", "\"/nonexistent/bin/serve\""), "models[0].command[0]", "No such file or directory"),
        (model("").replace("\"/usr/bin/sleep\"", "\"/etc/passwd\""), "models[0].command[0]", "is not executable"),
        (model("").replace("\"/usr/bin/sleep\"", "\"/usr/bin\""), "models[0].command[0]", "is not a file"),
        (model("user = \"no-such-user-xyz\""), "models[0].user", "does not exist on this host"),
        (model("user = \"root\""), "models[0].user", "allow_root_workers"),
        (model("isolation = \"strong\""), "models[0].isolation", "\"strong\" is not one of"),
        (model("replicas = -1"), "models[0].replicas", "out of range"),
        (model("gpu = \"3\""), "models[0].gpu", "GPU 3 is not selected by any [[gpus]] entry"),
        (model("gpu = \"12\""), "models[0].gpu", "GPU 12 does not exist"),
        (model("gpu = \"0\"\nisolation = \"exclusive\""), "models[0].isolation", "cannot run on GPU 0"),
        (model("isolation = \"mig\""), "models[0].isolation", "needs a GPU with sharing = \"mig\""),
        (model("compute = 0"), "models[0].compute", "out of range"),
        (model("isolation = \"exclusive\"\ncompute = 50"), "models[0].compute", "no effect"),
        (model("restart = \"sometimes\""), "models[0].restart", "\"sometimes\" is not one of"),
        (model("health = { interval = \"5s\" }"), "models[0].health", "needs a probe"),
        (model("health = { http = \"127.0.0.1:80\" }"), "models[0].health.http", "not an http:// URL"),
        (model("env = { CUDA_VISIBLE_DEVICES = \"0\" }"), "models[0].env.CUDA_VISIBLE_DEVICES", "cannot be overridden"),
        (model("env = { \"BAD-NAME\" = \"x\" }"), "models[0].env.BAD-NAME", "not a valid environment variable name"),
        (model("working_dir = \"srv/model\""), "models[0].working_dir", "not an absolute path"),
        (model("working_dir = \"/nonexistent/dir\""), "models[0].working_dir", "No such file or directory"),
        (model("stop_timeout = \"soon\""), "models[0].stop_timeout", "not a duration"),
        (model("limits = { cpu = -1 }"), "models[0].limits.cpu", "number of CPUs from 0.01 to 4096"),
        (model("limits = { cpu = 5000 }"), "models[0].limits.cpu", "number of CPUs from 0.01 to 4096"),
        (model("limits = { memory = \"8 apples\" }"), "models[0].limits.memory", "not a size"),
        (model("colour = \"blue\""), "models[0].colour", "unknown key \"colour\""),
        ("version = 1\n[[gpus]]\nselect = \"0-200000\"\nsharing = \"exclusive\"\n".into(), "gpus[0].select", "past the 1024 GPUs"),
        (model("stop_timeout = \"500000000000years\""), "models[0].stop_timeout", "longer than the 24h"),
        (model("stop_timeout = \"25h\""), "models[0].stop_timeout", "longer than the 24h"),
        (model("memory = \"512KiB\"").replace("memory = \"1GiB\"\n", ""), "models[0].memory", "under 1 MiB"),
        (model("").replace("\"600\"]", "\"6\\u00000\"]"), "models[0].command[1]", "NUL byte"),
        (model("").replace("\"/usr/bin/sleep\"", "\"/root/.gpu-agent-test-secret.sh\""), "models[0].command[0]", "cannot reach"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [\"3g.71gb\", \"3g.71gb\", \"3g.71gb\"]\n".into(), "gpus[0].mig", "takes at most 2; a layout that fits: 3g.71gb 3g.71gb"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [\"7g.141gb\", \"1g.18gb\"]\n".into(), "gpus[0].mig", "a layout that fits: 7g.141gb"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [\"1g.18gb+me\", \"1g.18gb+me\"]\n".into(), "gpus[0].mig", "one media extension"),
        ("version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"mig\"\nmig = [\"2g.35gb@1\"]\n".into(), "gpus[0].mig[0]", "starts at 0, 2, 4"),
        (model("isolation = \"exclusive\"\nreplicas = 2").replace("memory = \"1GiB\"", "memory = \"100GiB\""), "models[0]", "replica 1 of \"m\" cannot be placed"),
    ]
}

#[test]
fn bad_plans_are_refused_with_their_key_path_and_change_nothing() {
    // A program nobody (the default run-as user) cannot reach: root's home is 0700.
    std::fs::create_dir_all("/root").unwrap();
    std::fs::write("/root/.gpu-agent-test-secret.sh", "#!/bin/sh\n").unwrap();
    std::fs::set_permissions("/root/.gpu-agent-test-secret.sh", std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    std::fs::set_permissions("/root", std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let agent = Agent::start("h200:4");
    let good = agent.write_plan("good.toml", &model(""));
    assert_eq!(agent.gpuctl(&["apply", "-f", &good]).code, 0);
    let workers_before = agent.worker_pids();
    assert_eq!(workers_before.len(), 1);
    let plan_before = agent.state_json()["plan"].clone();

    let cases = cases();
    assert!(cases.len() >= 25);
    for (i, (text, path, words)) in cases.iter().enumerate() {
        let file = agent.write_plan(&format!("bad{i}.toml"), text);
        for verb in [&["apply", "-f"][..], &["apply", "--dry-run", "-f"], &["diff", "-f"]] {
            let mut args = vec!["-o", "json"];
            args.extend_from_slice(verb);
            args.push(&file);
            let out = agent.gpuctl(&args);
            // Invalid input is exit 2 for apply and diff alike.
            assert_eq!(out.code, 2, "case {i} ({path}) {verb:?}: {out:?}\n{text}");
            let problems = out.json()["problems"].as_array().cloned().unwrap_or_default();
            let hit = problems.iter().find(|p| p["path"] == *path && p["message"].as_str().unwrap().contains(words));
            let hit =
                hit.unwrap_or_else(|| panic!("case {i}: no problem at {path:?} with {words:?}: {problems:#?}\n{text}"));
            let line = hit["line"].as_u64().unwrap();
            assert!(
                line >= 1 && line as usize <= text.lines().count().max(1),
                "case {i}: line {line} of {path}\n{text}"
            );
            // The human form names path and line too.
            assert!(out.stderr.contains(path) || path.is_empty(), "case {i}: {out:?}");
        }
    }
    assert_eq!(agent.worker_pids(), workers_before, "bad plans changed the workers");
    assert_eq!(agent.state_json()["plan"], plan_before, "bad plans changed the stored plan");
}

/// A model with one bad key is still checked for everything else, and a duplicate of its name
/// is still found.
#[test]
fn partial_entries_are_still_checked() {
    let agent = Agent::start("h200:2");
    let text = "version = 1\n[[gpus]]\nselect = \"0\"\nsharing = \"exclusive\"\n[[models]]\nname = \"a\"\ncommand = \"not an array\"\nmemory = \"1GiB\"\nuser = \"ghost-user\"\n[[models]]\nname = \"a\"\ncommand = [\"/usr/bin/sleep\"]\nmemory = \"200GiB\"\n";
    let file = agent.write_plan("partial.toml", text);
    let out = agent.gpuctl(&["apply", "-f", &file]);
    assert_eq!(out.code, 2, "{out:?}");
    for want in [
        "models[0].command (line 7)",
        "models[0].user (line 9)",
        "models[1].name (line 11): duplicate model name",
        "models[1].memory (line 13)",
    ] {
        assert!(out.stderr.contains(want), "missing {want:?} in\n{}", out.stderr);
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let agent = Agent::start("h200:2");
    let text = "version = 1\n[[gpus]]\nselect = \"5\"\nsharing = \"exclusive\"\n[[models]]\nname = \"a\"\ncommand = [\"python3\"]\nmemory = \"6\"\n[[models]]\nname = \"b\"\ncommand = [\"/usr/bin/sleep\"]\nmemory = \"1GiB\"\nuser = \"ghost-user\"\n";
    let file = agent.write_plan("many.toml", text);
    let out = agent.gpuctl(&["apply", "-f", &file]);
    assert_eq!(out.code, 2, "{out:?}");
    for want in [
        "gpus[0].select (line 3): GPU 5 does not exist: this host has GPUs 0-1",
        "models[0].command[0] (line 7)",
        "models[0].memory (line 8)",
        "models[1].user (line 13)",
    ] {
        assert!(out.stderr.contains(want), "missing {want:?} in\n{}", out.stderr);
    }
    assert!(out.stderr.contains("nothing was changed"), "{out:?}");
}
