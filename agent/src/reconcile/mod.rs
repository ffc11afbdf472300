//! Reconciliation: a pure function from (desired state, observed host) to ordered steps.
//!
//! Architecture invariant: nothing in this module does I/O or reads a clock, so it cannot fail for
//! I/O reasons and every case is a table test. The executor (`crate::executor`) carries steps out.

pub mod place;

use crate::inventory::Inventory;
use crate::mig::{Planned, Want, plan_layout};
use crate::mps::{DaemonSpec, ObservedDaemon};
use crate::plan::check::Desired;
use crate::plan::{Health, HealthProbe, Limits, Restart, Sharing};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
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
    /// `PROFILE@START` of the MIG instance it runs in; None on a whole GPU.
    #[serde(default)]
    pub instance: Option<String>,
    /// Name of the MPS daemon whose client it is (`mps`-tier workers only).
    #[serde(default)]
    pub mps_daemon: Option<String>,
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
    #[serde(with = "millis")]
    pub stop_timeout: Duration,
    pub health: Option<HealthSpec>,
    /// Host memory, CPU and pids limits of its cgroup.
    #[serde(default)]
    pub limits: Limits,
    /// Device-node minors of the host's other GPUs, which its device cgroup denies.
    #[serde(default)]
    pub other_gpu_minors: Vec<u32>,
}

/// A worker's health check, as its spec carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthSpec {
    /// `http://host:port/path`: healthy on a 2xx answer.
    pub http: Option<String>,
    /// `host:port`: healthy when a connection opens.
    pub tcp: Option<String>,
    #[serde(with = "millis")]
    pub interval: Duration,
    #[serde(with = "millis")]
    pub timeout: Duration,
    pub failure_threshold: u32,
    #[serde(with = "millis")]
    pub start_timeout: Duration,
}

/// Durations as whole milliseconds in the state file.
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis().min(u64::MAX as u128) as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// A worker the agent already has, as the reconciler sees it.
#[derive(Debug, Clone)]
pub struct Observed {
    pub spec: WorkerSpec,
    pub pid: Option<u32>,
    /// True while a process runs (or is starting) for it.
    pub active: bool,
    /// Not running on purpose (`stopped` or `failed`): only `Desired::start_held` starts it again
    /// with the same spec.
    pub held: bool,
    /// Why it is not running, when it is not.
    pub last_exit: Option<String>,
}

/// One change to the host. Actions named as the contract's JSON names them.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    StopWorker { key: WorkerKey, gpu: u32, device: String, pid: Option<u32>, reason: String },
    DestroyGpuInstance { gpu: u32, id: u32, profile: String, profile_id: u32, start: u32, size: u32, reason: String },
    DisableMig { gpu: u32, reason: String },
    EnableMig { gpu: u32, reason: String },
    CreateGpuInstance { gpu: u32, profile: String, profile_id: u32, start: u32, size: u32, reason: String },
    StopMps { gpu: u32, name: String, reason: String },
    StartMps { daemon: Box<DaemonSpec>, reason: String },
    StartWorker { spec: Box<WorkerSpec>, reason: String },
}

impl Step {
    pub fn action(&self) -> &'static str {
        match self {
            Step::StopWorker { .. } => "stop_worker",
            Step::DestroyGpuInstance { .. } => "destroy_gpu_instance",
            Step::DisableMig { .. } => "disable_mig",
            Step::EnableMig { .. } => "enable_mig",
            Step::CreateGpuInstance { .. } => "create_gpu_instance",
            Step::StopMps { .. } => "stop_mps",
            Step::StartMps { .. } => "start_mps",
            Step::StartWorker { .. } => "start_worker",
        }
    }

    pub fn gpu(&self) -> u32 {
        match self {
            Step::StopWorker { gpu, .. }
            | Step::DestroyGpuInstance { gpu, .. }
            | Step::DisableMig { gpu, .. }
            | Step::EnableMig { gpu, .. }
            | Step::CreateGpuInstance { gpu, .. }
            | Step::StopMps { gpu, .. } => *gpu,
            Step::StartMps { daemon, .. } => daemon.gpu,
            Step::StartWorker { spec, .. } => spec.gpu,
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            Step::StopWorker { reason, .. }
            | Step::DestroyGpuInstance { reason, .. }
            | Step::DisableMig { reason, .. }
            | Step::EnableMig { reason, .. }
            | Step::CreateGpuInstance { reason, .. }
            | Step::StopMps { reason, .. }
            | Step::StartMps { reason, .. }
            | Step::StartWorker { reason, .. } => reason,
        }
    }

    /// Whether this step changes a GPU setting (refused under --read-only-gpus). MPS daemons
    /// change none: the agent never sets a compute mode unless a plan asks for it.
    pub fn changes_gpu_settings(&self) -> bool {
        !matches!(
            self,
            Step::StopWorker { .. } | Step::StartWorker { .. } | Step::StopMps { .. } | Step::StartMps { .. }
        )
    }
}

/// Processes a GPU-setting step would kill: destroying an instance or switching MIG mode under
/// running processes. Refused unless the apply drains (stops those workers first); processes that
/// are not the agent's workers always block.
#[derive(Debug, Clone, PartialEq)]
pub struct Disruption {
    pub gpu: u32,
    /// e.g. "destroy 3g.71gb@4" or "enable MIG".
    pub what: String,
    /// Each process, with the worker it belongs to when it is one of ours.
    pub pids: Vec<(u32, Option<WorkerKey>)>,
}

/// What applying a plan takes.
#[derive(Debug, Clone, Default)]
pub struct Reconciled {
    pub steps: Vec<Step>,
    pub disruptions: Vec<Disruption>,
    /// Replicas left without a device (only when the desired state tolerates it).
    pub unplaced: Vec<Unplaced>,
}

/// Placement failed for some replicas; nothing may change.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementError {
    pub unplaced: Vec<Unplaced>,
}

/// The MIG layout each `mig` GPU of the plan gets, next to what exists.
pub type Layouts = BTreeMap<u32, Vec<Planned>>;

/// Lays out every `mig` GPU. Layout problems were reported by the plan check; a GPU whose layout
/// does not place is left out here.
pub fn layouts(desired: &Desired, inventory: &Inventory) -> Layouts {
    desired
        .gpus
        .iter()
        .filter(|(_, d)| d.sharing == Sharing::Mig)
        .filter_map(|(index, d)| {
            let gpu = inventory.gpu(*index)?;
            let wants: Vec<Want> = d.mig.iter().map(|m| Want { profile: m.profile.clone(), start: m.start }).collect();
            // An instance without its compute instance (a destroy that failed halfway) is no MIG
            // device: it does not count as existing, so it is destroyed and made anew.
            let usable: Vec<_> = gpu.instances.iter().filter(|i| i.uuid.is_some()).cloned().collect();
            plan_layout(&gpu.name, &gpu.profiles, &usable, &wants).ok().map(|l| (*index, l))
        })
        .collect()
}

/// The ordered steps that make the host match `desired`: worker stops (so capacity frees up and
/// instances empty), instance destroys, MIG mode changes, instance creates, worker starts; each
/// group in GPU, then model and replica order. `owners` maps GPU process pids to the worker they
/// belong to.
pub fn reconcile(
    desired: &Desired,
    inventory: &Inventory,
    observed: &[Observed],
    daemons: &[ObservedDaemon],
    owners: &BTreeMap<u32, WorkerKey>,
) -> Result<Reconciled, PlacementError> {
    let layouts = layouts(desired, inventory);
    let current: BTreeMap<&WorkerKey, &Observed> = observed.iter().map(|o| (&o.spec.key, o)).collect();
    let keep: BTreeMap<WorkerKey, (u32, Option<String>)> = observed
        .iter()
        .filter(|o| o.active)
        .map(|o| (o.spec.key.clone(), (o.spec.gpu, o.spec.instance.clone())))
        .collect();
    let placement = place::place(desired, inventory, &layouts, &keep);
    if !placement.unplaced.is_empty() && !desired.tolerate_unplaced {
        return Err(PlacementError { unplaced: placement.unplaced });
    }
    let wanted: BTreeMap<WorkerKey, WorkerSpec> = placement
        .assignments
        .iter()
        .filter_map(|a| worker_spec(desired, inventory, &layouts, a).map(|s| (s.key.clone(), s)))
        .collect();

    let mut out = Reconciled { unplaced: placement.unplaced.clone(), ..Reconciled::default() };
    let mut stops = Vec::new();
    let mut starts = Vec::new();
    // MPS daemons: one per `mps` device; a changed one is restarted (defaults apply only to a new
    // server), and so are its clients.
    let wanted_daemons = daemon_specs(desired, inventory, &layouts);
    let mut daemon_stops = Vec::new();
    let mut daemon_starts = Vec::new();
    let mut restarted: BTreeSet<String> = BTreeSet::new();
    for obs in daemons {
        match wanted_daemons.iter().find(|d| d.name == obs.spec.name) {
            None => daemon_stops.push(Step::StopMps {
                gpu: obs.spec.gpu,
                name: obs.spec.name.clone(),
                reason: "no longer in the plan".into(),
            }),
            Some(want) if *want != obs.spec || !obs.running => {
                let why = if obs.running { "restart: its defaults or device changed" } else { "not running" };
                daemon_stops.push(Step::StopMps { gpu: obs.spec.gpu, name: obs.spec.name.clone(), reason: why.into() });
                daemon_starts.push(Step::StartMps { daemon: Box::new(want.clone()), reason: why.into() });
                restarted.insert(want.name.clone());
            }
            Some(_) => {}
        }
    }
    for want in wanted_daemons.iter().filter(|w| !daemons.iter().any(|o| o.spec.name == w.name)) {
        daemon_starts.push(Step::StartMps { daemon: Box::new(want.clone()), reason: "new".into() });
        restarted.insert(want.name.clone());
    }
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
        let daemon_restarts = spec.mps_daemon.as_ref().is_some_and(|d| restarted.contains(d));
        match current.get(key) {
            Some(obs) if obs.active && same(&obs.spec, spec) && daemon_restarts => {
                let why = "restart: its MPS daemon restarts";
                stops.push(Step::StopWorker {
                    key: key.clone(),
                    gpu: obs.spec.gpu,
                    device: obs.spec.device.clone(),
                    pid: obs.pid,
                    reason: why.into(),
                });
                starts.push(Step::StartWorker { spec: Box::new(spec.clone()), reason: why.into() });
            }
            Some(obs) if obs.active && same(&obs.spec, spec) => {}
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
            // Held, and the model itself unchanged: it stays stopped wherever placement now puts
            // it (a drain, undrain, partition or reboot may move it).
            Some(obs) if obs.held && !desired.start_held && same_model(&obs.spec, spec) => {}
            Some(obs) => {
                let why = obs.last_exit.clone().unwrap_or_else(|| "not running".to_string());
                starts.push(Step::StartWorker { spec: Box::new(spec.clone()), reason: format!("not running ({why})") });
            }
            None => starts.push(Step::StartWorker { spec: Box::new(spec.clone()), reason: "new".to_string() }),
        }
    }
    stops.sort_by(|a, b| match (a, b) {
        (Step::StopWorker { key: x, .. }, Step::StopWorker { key: y, .. }) => x.cmp(y),
        _ => std::cmp::Ordering::Equal,
    });
    let gpu_steps = gpu_steps(desired, inventory, &layouts, owners, &mut out.disruptions);
    // Workers a GPU change would kill are stopped before it and started again after it (an apply
    // that would kill them is refused unless it drains), also when their own spec is unchanged.
    for key in
        out.disruptions.iter().flat_map(|d| d.pids.iter().filter_map(|(_, k)| k.clone())).collect::<BTreeSet<_>>()
    {
        let already = stops.iter().any(|s| matches!(s, Step::StopWorker { key: k, .. } if *k == key));
        let Some(obs) = current.get(&key).filter(|o| o.active) else { continue };
        if already {
            continue;
        }
        stops.push(Step::StopWorker {
            key: key.clone(),
            gpu: obs.spec.gpu,
            device: obs.spec.device.clone(),
            pid: obs.pid,
            reason: "drain: a GPU change would kill it".into(),
        });
        if let Some(spec) = wanted.get(&key) {
            starts.push(Step::StartWorker {
                spec: Box::new(spec.clone()),
                reason: "drain: start again after the GPU change".into(),
            });
        }
    }
    out.steps = stops;
    out.steps.extend(daemon_stops);
    out.steps.extend(gpu_steps);
    out.steps.extend(daemon_starts);
    out.steps.extend(starts);
    Ok(out)
}

/// The MPS daemons the plan wants: one per GPU with `sharing = "mps"` and one per MIG instance
/// with `sharing = "mps"`.
fn daemon_specs(desired: &Desired, inventory: &Inventory, layouts: &Layouts) -> Vec<DaemonSpec> {
    let mut out = Vec::new();
    for (index, d) in &desired.gpus {
        let Some(gpu) = inventory.gpu(*index) else { continue };
        match d.sharing {
            Sharing::Mps => out.push(DaemonSpec {
                name: format!("gpu{index}"),
                gpu: *index,
                instance: None,
                device: gpu.uuid.clone(),
                active_thread_percentage: d.mps.and_then(|m| m.active_thread_percentage),
                pinned_limit_mib: d.mps.and_then(|m| m.pinned_memory_limit).map(crate::plan::units::mib),
            }),
            Sharing::Mig => {
                for p in layouts.get(index).map(Vec::as_slice).unwrap_or_default() {
                    if !d.mig.get(p.want).is_some_and(|m| m.mps) {
                        continue;
                    }
                    let label = format!("{}@{}", p.profile, p.start);
                    let device = p
                        .existing
                        .and_then(|id| gpu.instances.iter().find(|i| i.id == id))
                        .and_then(|i| i.uuid.clone())
                        .unwrap_or_default();
                    out.push(DaemonSpec {
                        name: format!("gpu{index}-{label}"),
                        gpu: *index,
                        instance: Some(label),
                        device,
                        active_thread_percentage: None,
                        pinned_limit_mib: None,
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// MIG mode and instance changes, in the order they must run.
fn gpu_steps(
    desired: &Desired,
    inventory: &Inventory,
    layouts: &Layouts,
    owners: &BTreeMap<u32, WorkerKey>,
    disruptions: &mut Vec<Disruption>,
) -> Vec<Step> {
    let (mut destroys, mut modes_off, mut modes_on, mut creates) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let pids = |gpu: &crate::inventory::Gpu, instance: Option<u32>| -> Vec<(u32, Option<WorkerKey>)> {
        gpu.processes
            .iter()
            .filter(|p| instance.is_none() || p.gpu_instance_id == instance)
            .map(|p| (p.pid, owners.get(&p.pid).cloned()))
            .collect()
    };
    for (index, d) in &desired.gpus {
        let Some(gpu) = inventory.gpu(*index) else { continue };
        let gpu_index = *index;
        let wants_mig = d.sharing == Sharing::Mig;
        let layout = layouts.get(index);
        if wants_mig && layout.is_none() {
            continue;
        }
        let keep: Vec<u32> = layout.map(|l| l.iter().filter_map(|p| p.existing).collect()).unwrap_or_default();
        for inst in gpu.instances.iter().filter(|i| !keep.contains(&i.id)) {
            let reason = if wants_mig { "not in the wanted layout" } else { "the plan turns MIG off" };
            let in_use = pids(gpu, Some(inst.id));
            if !in_use.is_empty() {
                disruptions.push(Disruption {
                    gpu: gpu_index,
                    what: format!("destroy {}@{}", inst.profile, inst.start),
                    pids: in_use,
                });
            }
            destroys.push(Step::DestroyGpuInstance {
                gpu: gpu_index,
                id: inst.id,
                profile: inst.profile.clone(),
                profile_id: inst.profile_id,
                start: inst.start,
                size: inst.size,
                reason: reason.to_string(),
            });
        }
        let mode_differs = gpu.mig_current != wants_mig || gpu.mig_pending != wants_mig;
        if mode_differs {
            // Processes on the whole GPU (instances are handled above) stand in the way of a mode change.
            let in_use: Vec<_> = pids(gpu, None)
                .into_iter()
                .filter(|(pid, _)| gpu.processes.iter().any(|p| p.pid == *pid && p.gpu_instance_id.is_none()))
                .collect();
            let what = if wants_mig { "enable MIG" } else { "disable MIG" };
            if !in_use.is_empty() {
                disruptions.push(Disruption { gpu: gpu_index, what: what.to_string(), pids: in_use });
            }
            if wants_mig {
                let reason = if gpu.mig_pending && !gpu.mig_current {
                    "MIG mode is pending, not current"
                } else {
                    "sharing = \"mig\""
                };
                modes_on.push(Step::EnableMig { gpu: gpu_index, reason: reason.to_string() });
            } else {
                modes_off
                    .push(Step::DisableMig { gpu: gpu_index, reason: format!("sharing = {:?}", d.sharing.as_str()) });
            }
        }
        for p in layout.map(Vec::as_slice).unwrap_or_default().iter().filter(|p| p.existing.is_none()) {
            creates.push(Step::CreateGpuInstance {
                gpu: gpu_index,
                profile: p.profile.clone(),
                profile_id: p.profile_id,
                start: p.start,
                size: p.size,
                reason: "in the wanted layout".to_string(),
            });
        }
    }
    destroys.into_iter().chain(modes_off).chain(modes_on).chain(creates).collect()
}

/// One worker's spec is the other's for what the worker runs with. `other_gpu_minors` is left
/// out: it follows the host's GPU list, and a running worker keeps the device rules it started
/// with rather than restarting when (say) an agent upgrade first fills it in.
fn same(a: &WorkerSpec, b: &WorkerSpec) -> bool {
    differences(a, b).is_empty()
}

/// The model's own settings agree; where it is placed (GPU, device, instance, tier) may differ.
fn same_model(a: &WorkerSpec, b: &WorkerSpec) -> bool {
    const PLACEMENT: &[&str] = &["gpu", "device", "instance", "mps_daemon", "isolation"];
    differences(a, b).iter().all(|d| PLACEMENT.contains(d))
}

fn differences(a: &WorkerSpec, b: &WorkerSpec) -> Vec<&'static str> {
    let checks: [(&'static str, bool); 15] = [
        ("gpu", a.gpu != b.gpu),
        ("device", a.device != b.device && a.gpu == b.gpu),
        ("instance", a.instance != b.instance),
        ("mps_daemon", a.mps_daemon != b.mps_daemon),
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

fn worker_spec(desired: &Desired, inventory: &Inventory, layouts: &Layouts, a: &Assignment) -> Option<WorkerSpec> {
    let model = desired.models.iter().find(|m| m.name == a.key.model)?;
    let gpu = inventory.gpu(a.gpu)?;
    // A whole GPU's UUID; an existing instance's MIG UUID; empty for an instance this apply
    // creates (the executor reads its UUID once it exists).
    let device = match &a.instance {
        None => gpu.uuid.clone(),
        Some(label) => layouts
            .get(&a.gpu)
            .and_then(|l| l.iter().find(|p| format!("{}@{}", p.profile, p.start) == *label))
            .and_then(|p| p.existing)
            .and_then(|id| gpu.instances.iter().find(|i| i.id == id))
            .and_then(|i| i.uuid.clone())
            .unwrap_or_default(),
    };
    Some(WorkerSpec {
        key: a.key.clone(),
        gpu: a.gpu,
        instance: a.instance.clone(),
        mps_daemon: a.mps_daemon.clone(),
        device,
        isolation: a.isolation.as_str().to_string(),
        command: model.command.clone(),
        env: model.env.clone(),
        user: model.user.clone(),
        working_dir: model.working_dir.clone(),
        memory_mib: model.memory_mib,
        compute: model.compute,
        restart: restart_name(model.restart).to_string(),
        stop_timeout: model.stop_timeout,
        health: model.health.as_ref().map(health_spec),
        limits: model.limits.clone(),
        other_gpu_minors: inventory.gpus.iter().filter(|g| g.index != a.gpu).filter_map(|g| g.minor).collect(),
    })
}

fn restart_name(r: Restart) -> &'static str {
    match r {
        Restart::Always => "always",
        Restart::OnFailure => "on-failure",
        Restart::Never => "never",
    }
}

fn health_spec(h: &Health) -> HealthSpec {
    let (http, tcp) = match &h.probe {
        HealthProbe::Http(url) => (Some(url.clone()), None),
        HealthProbe::Tcp(addr) => (None, Some(addr.clone())),
    };
    HealthSpec {
        http,
        tcp,
        interval: h.interval,
        timeout: h.timeout,
        failure_threshold: h.failure_threshold,
        start_timeout: h.start_timeout,
    }
}

#[cfg(test)]
mod tests;
