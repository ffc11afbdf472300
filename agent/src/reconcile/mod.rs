//! Reconciliation: a pure function from (desired state, observed host) to ordered steps.
//!
//! Architecture invariant: nothing in this module does I/O or reads a clock, so it cannot fail for
//! I/O reasons and every case is a table test. The executor (`crate::executor`) carries steps out.

pub mod place;

use crate::inventory::Inventory;
use crate::plan::check::Desired;
use crate::plan::{Health, Isolation, Limits, Restart};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use place::{Assignment, Unplaced};

/// Identity of one worker: a model's replica.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkerKey {
    pub model: String,
    pub replica: u32,
}

impl std::fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.model, self.replica)
    }
}

/// Everything needed to start one worker, fully resolved. Two equal specs mean the running process
/// already is what the plan asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub key: WorkerKey,
    pub gpu: u32,
    /// `GPU-...` or `MIG-...`: what CUDA_VISIBLE_DEVICES is set to.
    pub device: String,
    /// The tier the worker actually runs under (never `auto`).
    pub isolation: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    pub working_dir: Option<PathBuf>,
    pub memory_mib: u64,
    pub compute: Option<u32>,
    pub restart: String,
    #[serde(with = "humantime_serde_secs")]
    pub stop_timeout: Duration,
    pub health: Option<String>,
    pub limits: Option<String>,
}

/// Durations as fractional seconds in the state file.
mod humantime_serde_secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        f64::deserialize(d).map(Duration::from_secs_f64)
    }
}

/// A worker the agent already has, as the reconciler sees it.
#[derive(Debug, Clone)]
pub struct Observed {
    pub spec: WorkerSpec,
    pub pid: Option<u32>,
    /// True while a process runs (or is starting) for it.
    pub active: bool,
    /// Why it is not running, when it is not.
    pub last_exit: Option<String>,
}

/// One change to the host. Actions named as the contract's JSON names them.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    StopWorker { key: WorkerKey, gpu: u32, device: String, pid: Option<u32>, reason: String },
    StartWorker { spec: Box<WorkerSpec>, reason: String },
}

impl Step {
    pub fn action(&self) -> &'static str {
        match self {
            Step::StopWorker { .. } => "stop_worker",
            Step::StartWorker { .. } => "start_worker",
        }
    }

    pub fn gpu(&self) -> u32 {
        match self {
            Step::StopWorker { gpu, .. } => *gpu,
            Step::StartWorker { spec, .. } => spec.gpu,
        }
    }

    /// Whether this step changes a GPU setting (refused under --read-only-gpus).
    pub fn changes_gpu_settings(&self) -> bool {
        false
    }
}

/// Placement failed for some replicas; nothing may change.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementError {
    pub unplaced: Vec<Unplaced>,
}

/// The ordered steps that make the host match `desired`: stops first (so capacity frees up),
/// then starts, each group in model then replica order.
pub fn reconcile(desired: &Desired, inventory: &Inventory, observed: &[Observed]) -> Result<Vec<Step>, PlacementError> {
    let current: BTreeMap<&WorkerKey, &Observed> = observed.iter().map(|o| (&o.spec.key, o)).collect();
    let keep: BTreeMap<WorkerKey, u32> =
        observed.iter().filter(|o| o.active).map(|o| (o.spec.key.clone(), o.spec.gpu)).collect();
    let placement = place::place(desired, inventory, &keep);
    if !placement.unplaced.is_empty() {
        return Err(PlacementError { unplaced: placement.unplaced });
    }
    let wanted: BTreeMap<WorkerKey, WorkerSpec> = placement
        .assignments
        .iter()
        .filter_map(|a| worker_spec(desired, inventory, a).map(|s| (s.key.clone(), s)))
        .collect();

    let mut stops = Vec::new();
    let mut starts = Vec::new();
    for (key, obs) in &current {
        if obs.active && !wanted.contains_key(*key) {
            stops.push(Step::StopWorker {
                key: (*key).clone(),
                gpu: obs.spec.gpu,
                device: obs.spec.device.clone(),
                pid: obs.pid,
                reason: "no longer in the plan".to_string(),
            });
        }
    }
    for (key, spec) in &wanted {
        match current.get(key) {
            Some(obs) if obs.active && obs.spec == *spec => {}
            Some(obs) if obs.active => {
                let changed = differences(&obs.spec, spec).join(", ");
                stops.push(Step::StopWorker {
                    key: key.clone(),
                    gpu: obs.spec.gpu,
                    device: obs.spec.device.clone(),
                    pid: obs.pid,
                    reason: format!("restart: {changed} changed"),
                });
                starts.push(Step::StartWorker {
                    spec: Box::new(spec.clone()),
                    reason: format!("restart: {changed} changed"),
                });
            }
            Some(obs) => {
                let why = obs.last_exit.clone().unwrap_or_else(|| "not running".to_string());
                starts.push(Step::StartWorker { spec: Box::new(spec.clone()), reason: format!("not running ({why})") });
            }
            None => starts.push(Step::StartWorker { spec: Box::new(spec.clone()), reason: "new".to_string() }),
        }
    }
    stops.extend(starts);
    Ok(stops)
}

fn differences(a: &WorkerSpec, b: &WorkerSpec) -> Vec<&'static str> {
    let checks: [(&'static str, bool); 13] = [
        ("gpu", a.gpu != b.gpu),
        ("device", a.device != b.device && a.gpu == b.gpu),
        ("isolation", a.isolation != b.isolation),
        ("command", a.command != b.command),
        ("env", a.env != b.env),
        ("user", a.user != b.user),
        ("working_dir", a.working_dir != b.working_dir),
        ("memory", a.memory_mib != b.memory_mib),
        ("compute", a.compute != b.compute),
        ("restart", a.restart != b.restart),
        ("stop_timeout", a.stop_timeout != b.stop_timeout),
        ("health", a.health != b.health),
        ("limits", a.limits != b.limits),
    ];
    checks.into_iter().filter(|(_, differs)| *differs).map(|(name, _)| name).collect()
}

fn worker_spec(desired: &Desired, inventory: &Inventory, a: &Assignment) -> Option<WorkerSpec> {
    let model = desired.models.iter().find(|m| m.name == a.key.model)?;
    let gpu = inventory.gpu(a.gpu)?;
    Some(WorkerSpec {
        key: a.key.clone(),
        gpu: a.gpu,
        device: gpu.uuid.clone(),
        isolation: a.isolation.as_str().to_string(),
        command: model.command.clone(),
        env: model.env.clone(),
        user: model.user.clone(),
        working_dir: model.working_dir.clone(),
        memory_mib: model.memory_mib,
        compute: model.compute,
        restart: restart_name(model.restart).to_string(),
        stop_timeout: model.stop_timeout,
        health: model.health.as_ref().map(health_text),
        limits: limits_text(&model.limits),
    })
}

fn restart_name(r: Restart) -> &'static str {
    match r {
        Restart::Always => "always",
        Restart::OnFailure => "on-failure",
        Restart::Never => "never",
    }
}

fn health_text(h: &Health) -> String {
    format!("{:?} every {:?} timeout {:?} threshold {}", h.probe, h.interval, h.timeout, h.failure_threshold)
}

fn limits_text(l: &Limits) -> Option<String> {
    (l != &Limits::default()).then(|| format!("memory={:?} cpu={:?} pids={:?}", l.memory, l.cpu, l.pids))
}

/// The isolation tier a worker gets on a GPU shared this way.
pub fn tier_on(sharing: crate::plan::Sharing) -> Isolation {
    use crate::plan::Sharing;
    match sharing {
        Sharing::Exclusive => Isolation::Exclusive,
        Sharing::TimeSlicing | Sharing::Auto => Isolation::TimeSlicing,
        Sharing::Mps => Isolation::Mps,
        Sharing::Mig => Isolation::Mig,
    }
}

#[cfg(test)]
mod tests;
