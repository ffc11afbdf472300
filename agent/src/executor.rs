//! The thin effectful layer under reconciliation: carries out steps in order and reports each.
//!
//! GPU setting changes are transactional: every step that changed something leaves an undo
//! action behind, and when a MIG step fails everything this apply did is undone in reverse order
//! (instances re-created at the same placements, MIG mode set back, drained workers started again)
//! and reported with the failure. A failed worker start is not a reason to undo: it is reported
//! (the worker's record says why) and the apply goes on, so the host ends in a known state.

use crate::driver::GpuDriver;
use crate::holders;
use crate::mps::{DaemonSpec, MpsManager};
use crate::reconcile::{Step, WorkerKey, WorkerSpec};
use crate::workers::Supervisor;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Progress of one apply, as the RPC layer streams it.
#[derive(Debug, Clone)]
pub enum Progress {
    Started {
        index: usize,
        step: Step,
    },
    Finished {
        index: usize,
        step: Step,
        result: Result<(), String>,
        millis: u64,
    },
    /// One undo action of a rollback.
    RolledBack {
        action: String,
        result: Result<(), String>,
    },
}

#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub steps: usize,
    pub failed: usize,
    /// Set when a failed GPU step made the apply undo what it had done.
    pub rolled_back: Option<RollbackReport>,
}

impl Outcome {
    /// One line for the apply record, events and gpuctl.
    pub fn summary(&self) -> String {
        let mut text = if self.failed == 0 {
            format!("applied {} step(s)", self.steps)
        } else {
            format!("{} of {} step(s) failed", self.failed, self.steps)
        };
        if let Some(r) = &self.rolled_back {
            text += &match r.failed {
                0 => format!("; rolled back: {} action(s) undone, the host is as it was before this apply", r.actions),
                n => format!("; rollback incomplete: {n} of {} undo action(s) failed (see gpuctl events)", r.actions),
            };
        }
        text
    }
}

#[derive(Debug, Clone, Default)]
pub struct RollbackReport {
    pub actions: usize,
    pub failed: usize,
}

/// What the executor needs from the agent.
pub struct Context {
    pub driver: Arc<dyn GpuDriver>,
    pub supervisor: Arc<Supervisor>,
    pub mps: Arc<MpsManager>,
    pub read_only_gpus: bool,
    /// Where the GPUs' device nodes are (`/dev`, or the simulated host's).
    pub device_dir: PathBuf,
}

/// How to take back one step that succeeded.
#[derive(Debug, Clone)]
enum Undo {
    StartWorker(Box<WorkerSpec>),
    StopWorker(WorkerKey),
    CreateGpuInstance { gpu: u32, profile: String, profile_id: u32, start: u32, size: u32 },
    DestroyGpuInstance { gpu: u32, id: u32, label: String },
    SetMig { gpu: u32, enable: bool },
    StartMps(Box<DaemonSpec>),
    StopMps(String),
}

impl Undo {
    fn describe(&self) -> String {
        match self {
            Undo::StartWorker(spec) => format!("start worker {} again", spec.key),
            Undo::StopWorker(key) => format!("stop worker {key}"),
            Undo::CreateGpuInstance { gpu, profile, start, .. } => format!("re-create {profile}@{start} on GPU {gpu}"),
            Undo::DestroyGpuInstance { gpu, label, .. } => format!("destroy {label} on GPU {gpu}"),
            Undo::SetMig { gpu, enable } => format!("turn MIG {} on GPU {gpu}", if *enable { "on" } else { "off" }),
            Undo::StartMps(spec) => format!("start MPS daemon {} again", spec.name),
            Undo::StopMps(name) => format!("stop MPS daemon {name}"),
        }
    }
}

pub async fn execute(steps: &[Step], ctx: &Context, mut progress: impl FnMut(Progress)) -> Outcome {
    let mut outcome = Outcome { steps: steps.len(), ..Outcome::default() };
    let mut undo: Vec<Undo> = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        progress(Progress::Started { index, step: step.clone() });
        let began = Instant::now();
        let span = tracing::info_span!("step", index, action = step.action(), gpu = step.gpu());
        let result = if ctx.read_only_gpus && step.changes_gpu_settings() {
            Err(format!(
                "{} on GPU {} changes a GPU setting, and the agent runs with --read-only-gpus",
                step.action(),
                step.gpu()
            ))
        } else {
            let _guard = span.enter();
            run(step, ctx).await
        };
        let (result, undo_action) = match result {
            Ok(u) => (Ok(()), u),
            Err(e) => (Err(e), None),
        };
        undo.extend(undo_action);
        let failed = result.is_err();
        if let Err(e) = &result {
            outcome.failed += 1;
            tracing::error!(action = step.action(), gpu = step.gpu(), error = %e, "step failed");
        }
        progress(Progress::Finished { index, step: step.clone(), result, millis: began.elapsed().as_millis() as u64 });
        if failed && step.changes_gpu_settings() {
            outcome.rolled_back = Some(rollback(undo, ctx, &mut progress).await);
            break;
        }
    }
    outcome
}

async fn rollback(undo: Vec<Undo>, ctx: &Context, progress: &mut impl FnMut(Progress)) -> RollbackReport {
    let mut report = RollbackReport::default();
    for action in undo.into_iter().rev() {
        report.actions += 1;
        let result = match &action {
            Undo::StartWorker(spec) => start_worker(spec, ctx).await.map(|_| ()),
            Undo::StopWorker(key) => ctx.supervisor.stop(key).await.map_err(|e| e.to_string()),
            Undo::CreateGpuInstance { gpu, profile_id, start, size, .. } => {
                create_instance(ctx, *gpu, *profile_id, *start, *size).await.map(|_| ())
            }
            Undo::DestroyGpuInstance { gpu, id, .. } => blocking(ctx, {
                let (gpu, id) = (*gpu, *id);
                move |d| d.destroy_gpu_instance(gpu, id)
            })
            .await
            .map_err(|e| e.to_string()),
            Undo::SetMig { gpu, enable } => {
                let (gpu, enable) = (*gpu, *enable);
                blocking(ctx, move |d| d.set_mig_mode(gpu, enable)).await.map(|_| ()).map_err(|e| e.to_string())
            }
            Undo::StartMps(spec) => start_mps(spec, ctx).await,
            Undo::StopMps(name) => ctx.mps.stop(name).await,
        };
        if result.is_err() {
            report.failed += 1;
        }
        tracing::warn!(action = %action.describe(), ok = result.is_ok(), "rollback");
        progress(Progress::RolledBack { action: action.describe(), result });
    }
    report
}

/// Runs a blocking driver call off the async threads.
async fn blocking<T: Send + 'static>(
    ctx: &Context,
    f: impl FnOnce(&dyn GpuDriver) -> Result<T, crate::driver::DriverError> + Send + 'static,
) -> Result<T, crate::driver::DriverError> {
    let driver = Arc::clone(&ctx.driver);
    tokio::task::spawn_blocking(move || f(driver.as_ref())).await.expect("driver call does not panic")
}

async fn create_instance(ctx: &Context, gpu: u32, profile_id: u32, start: u32, size: u32) -> Result<u32, String> {
    let id =
        blocking(ctx, move |d| d.create_gpu_instance(gpu, profile_id, start, size)).await.map_err(|e| e.to_string())?;
    if let Err(e) = blocking(ctx, move |d| d.create_compute_instance(gpu, id)).await {
        // Leave no half-made instance behind.
        let cleanup = blocking(ctx, move |d| d.destroy_gpu_instance(gpu, id)).await;
        let also = cleanup.err().map(|c| format!("; removing the GPU instance failed too: {c}")).unwrap_or_default();
        return Err(format!("{e}{also}"));
    }
    Ok(id)
}

/// Starts a worker through the checks every start makes (see `resolve_worker`); one that cannot
/// start is recorded as failed with the reason.
pub async fn start_worker(spec: &WorkerSpec, ctx: &Context) -> Result<u32, String> {
    let resolved = match resolve_worker(spec, ctx).await {
        Ok(spec) => spec,
        Err(e) => {
            // Never lose a worker from view because it could not be started.
            ctx.supervisor.record_failed(spec, &e);
            return Err(e);
        }
    };
    ctx.supervisor.start(resolved).map_err(|e| e.to_string())
}

/// What must hold before a worker starts: an MPS client's daemon answers (a client of a dead
/// daemon silently runs without MPS and without limits), and a MIG worker gets its instance's
/// current MIG device UUID (an instance this apply created, or re-created, has a new one).
async fn resolve_worker(spec: &WorkerSpec, ctx: &Context) -> Result<WorkerSpec, String> {
    let mut spec = spec.clone();
    if let Some(daemon) = &spec.mps_daemon
        && !ctx.mps.answers(daemon).await
    {
        return Err(format!(
            "worker {}: MPS daemon {daemon} does not answer; not starting a client that would run without MPS",
            spec.key
        ));
    }
    if let Some(label) = &spec.instance {
        let gpu = spec.gpu;
        let inventory = blocking(ctx, |d| d.inventory()).await.map_err(|e| e.to_string())?;
        let uuid = inventory
            .gpu(gpu)
            .and_then(|g| g.instances.iter().find(|i| format!("{}@{}", i.profile, i.start) == *label))
            .and_then(|i| i.uuid.clone())
            .ok_or_else(|| format!("worker {}: MIG instance {label} on GPU {gpu} does not exist", spec.key))?;
        spec.device = uuid;
    }
    Ok(spec)
}

async fn run(step: &Step, ctx: &Context) -> Result<Option<Undo>, String> {
    match step {
        Step::StartWorker { spec, .. } => {
            start_worker(spec, ctx).await?;
            Ok(Some(Undo::StopWorker(spec.key.clone())))
        }
        Step::StopWorker { key, .. } => {
            let record = ctx.supervisor.records().into_iter().find(|r| &r.spec.key == key);
            // An MPS client is ended with terminate_client first (killing a client with work in
            // flight can wedge its server); SIGTERM and the stop timeout follow as for any worker.
            if let Some((daemon, pid)) = record.as_ref().and_then(|r| r.spec.mps_daemon.clone().zip(r.pid)) {
                ctx.mps.terminate_client(&daemon, pid).await;
            }
            let old = record.map(|r| r.spec);
            ctx.supervisor.stop(key).await.map_err(|e| e.to_string())?;
            Ok(old.map(|spec| Undo::StartWorker(Box::new(spec))))
        }
        Step::DestroyGpuInstance { gpu, id, profile, profile_id, start, size, .. } => {
            let (g, i) = (*gpu, *id);
            if let Err(e) = blocking(ctx, move |d| d.destroy_gpu_instance(g, i)).await {
                // Compute instances go first: if the GPU instance then refused to go, give it its
                // compute instance back, so the rollback leaves a usable MIG device.
                let _ = blocking(ctx, move |d| d.create_compute_instance(g, i)).await;
                return Err(e.to_string());
            }
            Ok(Some(Undo::CreateGpuInstance {
                gpu: *gpu,
                profile: profile.clone(),
                profile_id: *profile_id,
                start: *start,
                size: *size,
            }))
        }
        Step::CreateGpuInstance { gpu, profile, profile_id, start, size, .. } => {
            let id = create_instance(ctx, *gpu, *profile_id, *start, *size).await?;
            Ok(Some(Undo::DestroyGpuInstance { gpu: *gpu, id, label: format!("{profile}@{start}") }))
        }
        Step::StartMps { daemon, .. } => {
            start_mps(daemon, ctx).await?;
            Ok(Some(Undo::StopMps(daemon.name.clone())))
        }
        Step::StopMps { name, .. } => {
            let old = ctx.mps.records().into_iter().find(|r| &r.spec.name == name).map(|r| r.spec);
            ctx.mps.stop(name).await?;
            Ok(old.map(|spec| Undo::StartMps(Box::new(spec))))
        }
        Step::EnableMig { gpu, .. } | Step::DisableMig { gpu, .. } => {
            let (gpu, enable) = (*gpu, matches!(step, Step::EnableMig { .. }));
            let before = blocking(ctx, move |d| d.inventory()).await.map_err(|e| e.to_string())?;
            let was = before.gpu(gpu).map(|g| g.mig_current).unwrap_or(!enable);
            // What was asked for before this step (a pending request the plan did not make).
            let was_pending = before.gpu(gpu).map(|g| g.mig_pending).unwrap_or(was);
            let mode = blocking(ctx, move |d| d.set_mig_mode(gpu, enable)).await.map_err(|e| {
                let holders = holders::holders(&ctx.device_dir, gpu);
                if holders.is_empty() { e.to_string() } else { format!("{e}; GPU {gpu} is held by {}", list(&holders)) }
            })?;
            if mode.current != enable {
                let holders = holders::holders(&ctx.device_dir, gpu);
                let who = if holders.is_empty() {
                    "nothing the agent can see holds it (in a VM the host may need to reset it)".to_string()
                } else {
                    format!("it is held by {}", list(&holders))
                };
                // Withdraw the request, so the GPU is left as it was (including a pending request
                // that was there before), and say so only when that worked.
                let withdrawn = blocking(ctx, move |d| d.set_mig_mode(gpu, was_pending)).await;
                let left = match withdrawn {
                    Ok(m) if m.current == was && m.pending == was_pending => "the request was withdrawn".to_string(),
                    Ok(m) => format!(
                        "withdrawing the request left MIG mode current {} pending {}",
                        if m.current { "on" } else { "off" },
                        if m.pending { "on" } else { "off" }
                    ),
                    Err(e) => format!("withdrawing the request failed: {e}"),
                };
                return Err(format!(
                    "GPU {gpu}: MIG mode {} is pending: the change needs a GPU reset, which gpu-agent never does, and {who}; {left}; stop those processes and apply again",
                    if enable { "on" } else { "off" }
                ));
            }
            Ok((was != enable).then_some(Undo::SetMig { gpu, enable: was }))
        }
    }
}

/// Starts an MPS daemon; one for a MIG instance this apply created gets that instance's UUID.
async fn start_mps(spec: &DaemonSpec, ctx: &Context) -> Result<(), String> {
    let mut spec = spec.clone();
    if let Some(label) = spec.instance.clone() {
        let gpu = spec.gpu;
        let inventory = blocking(ctx, |d| d.inventory()).await.map_err(|e| e.to_string())?;
        spec.device = inventory
            .gpu(gpu)
            .and_then(|g| g.instances.iter().find(|i| format!("{}@{}", i.profile, i.start) == label))
            .and_then(|i| i.uuid.clone())
            .ok_or_else(|| format!("MPS daemon {}: MIG instance {label} on GPU {gpu} does not exist", spec.name))?;
    }
    ctx.mps.start(spec).await
}

fn list(holders: &[holders::Holder]) -> String {
    holders.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}
