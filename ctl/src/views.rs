//! The stable JSON shapes of `-o json`. Field names here are the contract
//! (`shared/spec/plan-and-cli.md` in the steering repo); add fields, never rename them.

use gpu_agent_proto::v1 as pb;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Gpus {
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_mib: u64,
    pub memory_used_mib: u64,
    pub mig: Mig,
    /// The plan's sharing for this GPU; null when no plan entry selects it.
    pub sharing: Option<String>,
    pub instances: Vec<Instance>,
    pub pci_device_id: String,
    pub pci_bus_id: String,
    pub compute_mode: String,
    pub sm_count: u32,
    pub processes: Vec<Process>,
    /// Set when the driver could not read this GPU.
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Mig {
    pub current: bool,
    pub pending: bool,
}

#[derive(Debug, Serialize)]
pub struct Instance {
    pub profile: String,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub uuid: Option<String>,
    pub memory_mib: u64,
    pub id: u32,
}

#[derive(Debug, Serialize)]
pub struct Process {
    pub pid: u32,
    pub used_mib: u64,
    pub gpu_instance_id: Option<u32>,
    pub mps_client: bool,
    /// The model and replica the process belongs to; null for a process that is not a worker's.
    pub model: Option<String>,
    pub replica: Option<u32>,
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

impl From<&pb::Gpu> for Gpu {
    fn from(g: &pb::Gpu) -> Self {
        Gpu {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            memory_mib: g.memory_total_mib,
            memory_used_mib: g.memory_used_mib,
            mig: Mig { current: g.mig_current, pending: g.mig_pending },
            sharing: non_empty(&g.sharing),
            instances: g
                .instances
                .iter()
                .map(|i| Instance {
                    profile: i.profile.clone(),
                    profile_id: i.profile_id,
                    start: i.start,
                    size: i.size,
                    uuid: non_empty(&i.uuid),
                    memory_mib: i.memory_mib,
                    id: i.id,
                })
                .collect(),
            pci_device_id: format!("0x{:08x}", g.pci_device_id),
            pci_bus_id: g.pci_bus_id.clone(),
            compute_mode: g.compute_mode.clone(),
            sm_count: g.sm_count,
            error: non_empty(&g.error),
            processes: g
                .processes
                .iter()
                .map(|p| Process {
                    pid: p.pid,
                    used_mib: p.used_mib,
                    gpu_instance_id: p.gpu_instance_id,
                    mps_client: p.mps_client,
                    model: non_empty(&p.model),
                    replica: p.replica,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Profiles {
    pub gpu: u32,
    pub gpu_name: String,
    pub profiles: Vec<Profile>,
}

#[derive(Debug, Serialize)]
pub struct Profile {
    pub id: u32,
    pub name: String,
    pub memory_mib: u64,
    pub sm: u32,
    pub max: u32,
    pub placements: Vec<Placement>,
    pub slices: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
}

#[derive(Debug, Serialize)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

impl From<&pb::ListProfilesReply> for Profiles {
    fn from(r: &pb::ListProfilesReply) -> Self {
        Profiles {
            gpu: r.gpu_index,
            gpu_name: r.gpu_name.clone(),
            profiles: r
                .profiles
                .iter()
                .map(|p| Profile {
                    id: p.id,
                    name: p.name.clone(),
                    memory_mib: p.memory_mib,
                    sm: p.sm,
                    max: p.max,
                    placements: p.placements.iter().map(|pl| Placement { start: pl.start, size: pl.size }).collect(),
                    slices: p.slices,
                    copy_engines: p.copy_engines,
                    decoders: p.decoders,
                    encoders: p.encoders,
                    jpegs: p.jpegs,
                    ofas: p.ofas,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Workers {
    pub workers: Vec<Worker>,
}

#[derive(Debug, Serialize)]
pub struct Worker {
    pub model: String,
    pub replica: u32,
    pub pid: Option<u32>,
    pub state: String,
    pub restarts: u32,
    pub device: String,
    pub isolation: String,
    pub gpu: u32,
    pub memory_budget_mib: u64,
    pub gpu_memory_used_mib: u64,
    pub last_exit: Option<String>,
    pub log_tail: Option<String>,
}

impl From<&pb::Worker> for Worker {
    fn from(w: &pb::Worker) -> Self {
        Worker {
            model: w.model.clone(),
            replica: w.replica,
            pid: (w.pid != 0).then_some(w.pid),
            state: w.state.clone(),
            restarts: w.restarts,
            device: w.device.clone(),
            isolation: w.isolation.clone(),
            gpu: w.gpu,
            memory_budget_mib: w.memory_budget_mib,
            gpu_memory_used_mib: w.gpu_memory_used_mib,
            last_exit: non_empty(&w.last_exit),
            log_tail: non_empty(&w.log_tail),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Steps {
    pub steps: Vec<Step>,
}

#[derive(Debug, Serialize)]
pub struct Step {
    pub action: String,
    pub gpu: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps_daemon: Option<String>,
    pub reason: String,
}

impl From<&pb::Step> for Step {
    fn from(s: &pb::Step) -> Self {
        Step {
            action: s.action.clone(),
            gpu: s.gpu,
            profile: non_empty(&s.profile),
            start: s.start,
            model: non_empty(&s.model),
            replica: s.replica,
            pid: s.pid,
            device: non_empty(&s.device),
            isolation: non_empty(&s.isolation),
            mps_daemon: non_empty(&s.mps_daemon),
            reason: s.reason.clone(),
        }
    }
}

/// What `apply -o json` prints: the plan's steps and how each went.
#[derive(Debug, Serialize)]
pub struct Applied {
    pub steps: Vec<Step>,
    pub results: Vec<StepResult>,
    /// Undo actions, when a failed GPU step rolled the apply back.
    pub rollback: Vec<RollbackAction>,
    pub ok: bool,
    pub dry_run: bool,
    pub rolled_back: bool,
    pub message: String,
}

#[derive(Debug, Serialize)]
pub struct RollbackAction {
    pub action: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct StepResult {
    pub index: u32,
    pub action: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub millis: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    pub path: String,
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.line, self.path.is_empty()) {
            (0, true) => write!(f, "{}", self.message),
            (0, false) => write!(f, "{}: {}", self.path, self.message),
            (line, true) => write!(f, "line {line}: {}", self.message),
            (line, false) => write!(f, "{} (line {line}): {}", self.path, self.message),
        }
    }
}
