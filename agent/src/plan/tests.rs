//! Parsing tests: the contract's full example reads into the right values, and the parser's
//! corner cases behave.

use super::parse::{parse, parse_mig_item, parse_selector};
use super::*;

#[test]
fn the_contract_example_reads_completely() {
    let parsed = parse(include_str!("../../../tests/fixtures/contract-plan.toml"));
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    let plan = parsed.plan;
    assert_eq!(plan.gpus.len(), 3);
    let mig = &plan.gpus[0];
    assert_eq!((mig.select.clone(), mig.sharing), (Selector::Indices(vec![0]), Sharing::Mig));
    assert_eq!(
        mig.mig,
        vec![
            MigInstance { profile: "3g.71gb".into(), start: None, mps: false },
            MigInstance { profile: "2g.35gb".into(), start: None, mps: false },
            MigInstance { profile: "1g.18gb".into(), start: Some(6), mps: true },
        ]
    );
    assert_eq!(
        plan.gpus[1].mps,
        Some(MpsDefaults {
            active_thread_percentage: Some(100),
            pinned_memory_limit: Some(20 << 30),
            allow_compute_oversubscription: false
        })
    );
    assert_eq!(plan.gpus[2].timeslice, Some(Timeslice::Short));
    let m = &plan.models[0];
    assert_eq!(m.name, "translator");
    assert_eq!(m.command, ["/usr/bin/python3", "serve.py", "--model", "opus-mt"]);
    assert_eq!((m.isolation, m.memory_mib, m.compute, m.replicas), (Isolation::Mps, 6144, Some(25), 2));
    assert_eq!(m.gpu, Some(GpuRef::Index(1)));
    assert_eq!(m.user.as_deref(), Some("models"));
    assert_eq!(m.env.get("HF_HOME").map(String::as_str), Some("/var/cache/hf"));
    assert_eq!(m.restart, Restart::Always);
    let health = m.health.as_ref().unwrap();
    assert_eq!(health.probe, HealthProbe::Http("http://127.0.0.1:8001/healthz".into()));
    assert_eq!(health.interval, Duration::from_secs(5));
    assert_eq!(m.limits, Limits { memory: Some(8 << 30), cpu: Some(2.0), pids: None });
}

#[test]
fn selectors() {
    let ok = [
        ("all", Selector::All),
        ("3", Selector::Indices(vec![3])),
        ("0,2", Selector::Indices(vec![0, 2])),
        ("4-7", Selector::Indices(vec![4, 5, 6, 7])),
        ("0, 2-3", Selector::Indices(vec![0, 2, 3])),
        ("GPU-9189792d-c677-0906-c981-9aa36eee3801", Selector::Uuid("GPU-9189792d-c677-0906-c981-9aa36eee3801".into())),
    ];
    for (text, want) in ok {
        assert_eq!(parse_selector(text), Ok(want), "{text}");
    }
    for bad in ["", "x", "1-", "3-1", "0,0", "-1", "MIG-abc", "0-200000", "0-4294967295", "1024"] {
        assert!(parse_selector(bad).is_err(), "{bad}");
    }
}

#[test]
fn mig_items() {
    assert_eq!(parse_mig_item("2g.35gb@4").unwrap().start, Some(4));
    assert_eq!(parse_mig_item("1g.18gb").unwrap().start, None);
    let mps = parse_mig_item("3g.71gb@4:mps").unwrap();
    assert_eq!((mps.profile.as_str(), mps.start, mps.mps), ("3g.71gb", Some(4), true));
    assert!(parse_mig_item("3g.71gb:shared").is_err());
    for bad in ["@1", "3g.71gb@x", "3g.71gb@"] {
        assert!(parse_mig_item(bad).is_err(), "{bad}");
    }
}

#[test]
fn defaults_when_keys_are_absent() {
    let parsed = parse("version = 1\n[[models]]\nname = \"m\"\ncommand = [\"/bin/true\"]\nmemory = \"1GiB\"\n");
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    let m = &parsed.plan.models[0];
    assert_eq!((m.isolation, m.replicas, m.restart), (Isolation::Auto, 1, Restart::Always));
    assert_eq!(m.stop_timeout, Duration::from_secs(10));
    assert!(m.health.is_none() && m.gpu.is_none() && m.user.is_none());
}

#[test]
fn problems_carry_line_and_column() {
    let parsed = parse("version = 1\n\n[[models]]\nname = \"m\"\ncommand = [\"/bin/true\"]\nmemory = \"6 parsecs\"\n");
    assert_eq!(parsed.problems.len(), 1);
    let p = &parsed.problems[0];
    assert_eq!((p.path.as_str(), p.line, p.column), ("models[0].memory", 6, 10));
    assert_eq!(p.to_string(), format!("models[0].memory (line 6): {}", p.message));
}
