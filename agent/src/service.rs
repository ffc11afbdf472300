//! The agent's operations, one `do_*` method per RPC, in domain types. The RPC layer (`rpc`) only
//! converts to and from protobuf and maps [`AgentError`] to status codes.

use crate::driver::{DriverError, GpuDriver};
use crate::events::{Event, Events, Level};
use crate::executor::{self, Outcome, Progress};
use crate::inventory::{Gpu, Inventory};
use crate::mps::MpsManager;
use crate::mps::daemons::{DaemonRecord, MpsSettings};
use crate::plan::check::{self, Desired};
use crate::plan::{Problem, parse};
use crate::reconcile::{self, Step};
use crate::settings::Settings;
use crate::store::{AgentState, AppliedPlan, ApplyRecord, StateFile, StoreError, WorkerRecord};
use crate::workers::Supervisor;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the plan has {} problem(s)", .0.len())]
    InvalidPlan(Vec<Problem>),
    #[error("{0}")]
    NotFound(String),
    #[error("refused, nothing was changed: {}", .0.join("; "))]
    Refused(Vec<String>),
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

pub struct Agent {
    pub settings: Settings,
    driver: Arc<dyn GpuDriver>,
    state: Arc<StateFile>,
    supervisor: Arc<Supervisor>,
    mps: Arc<MpsManager>,
    events: Arc<Events>,
    /// One apply at a time; a second waits for the first.
    apply_lock: Arc<tokio::sync::Mutex<()>>,
    started: Instant,
}

/// A validated plan and what applying it would do.
pub struct Prepared {
    pub unplaced: Vec<reconcile::Unplaced>,
    pub desired: Desired,
    pub steps: Vec<Step>,
    pub disruptions: Vec<reconcile::Disruption>,
    pub text: String,
    pub source: String,
}

/// A GPU with the sharing the current plan gives it.
pub struct GpuView {
    pub gpu: Gpu,
    pub sharing: Option<String>,
}

pub struct StatusView {
    pub driver_version: String,
    pub gpus: Vec<GpuView>,
    pub workers: Vec<WorkerRecord>,
    pub state: AgentState,
    pub uptime_secs: u64,
}

impl Agent {
    pub fn new(
        settings: Settings,
        driver: Arc<dyn GpuDriver>,
        state: Arc<StateFile>,
        events: Arc<Events>,
    ) -> Arc<Agent> {
        let supervisor = Supervisor::new(
            Arc::clone(&state),
            Arc::clone(&events),
            settings.workers.clone(),
            settings.state_dir.join("logs"),
            settings.runtime_dir.clone(),
            settings.cgroups.clone(),
        );
        let apply_lock = Arc::new(tokio::sync::Mutex::new(()));
        let mps = MpsManager::new(
            MpsSettings {
                binary: settings.mps_control.clone(),
                runtime_dir: settings.runtime_dir.clone(),
                env: settings.mps_env.clone(),
            },
            Arc::clone(&state),
            Arc::clone(&events),
            Arc::clone(&supervisor),
            Arc::clone(&driver),
            Arc::clone(&apply_lock),
        );
        Arc::new(Agent { settings, driver, state, supervisor, mps, events, apply_lock, started: Instant::now() })
    }

    fn context(&self) -> executor::Context {
        executor::Context {
            driver: Arc::clone(&self.driver),
            supervisor: Arc::clone(&self.supervisor),
            mps: Arc::clone(&self.mps),
            read_only_gpus: self.settings.read_only_gpus,
            device_dir: self.settings.device_dir.clone(),
        }
    }

    /// Starts the task that carries out restarts due under workers' restart policies: after the
    /// backoff, under the apply lock (so an apply and a restart never act on one worker at once),
    /// and only if the worker is still waiting for it; through the same start path as an apply (an
    /// MPS client only once its daemon answers, a MIG worker with its instance's current UUID).
    pub fn start_restarter(self: &Arc<Self>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(reconcile::WorkerKey, std::time::Duration)>();
        self.supervisor.set_restarter(tx);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            while let Some((key, delay)) = rx.recv().await {
                let me = Arc::clone(&me);
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _apply = me.apply_lock.lock().await;
                    let waiting = me
                        .supervisor
                        .records()
                        .into_iter()
                        .find(|r| r.spec.key == key && r.state == crate::store::WorkerState::Backoff);
                    let Some(record) = waiting else { return };
                    if me.state.snapshot().drained.contains(&record.spec.gpu) {
                        // Its GPU was drained meanwhile: it stays waiting (not held), so the
                        // undrain's apply starts it.
                        me.events.emit(
                            Level::Info,
                            "worker_restart_skipped",
                            Some(&key.model),
                            Some(record.spec.gpu),
                            format!("worker {key}: not restarted, GPU {} is drained", record.spec.gpu),
                        );
                        return;
                    }
                    if let Err(e) = executor::start_worker(&record.spec, &me.context()).await {
                        me.supervisor.restart_failed(&key, &e);
                    }
                });
            }
        });
    }

    /// Starts the task that honours memory budgets where nothing else does: a `time-slicing`
    /// worker whose processes (its own and its children's, from the driver's process lists) use
    /// more GPU memory than its `memory` for longer than the grace period is stopped with a clear
    /// event and left `failed`; its neighbours are not touched. (`mps` clients have their pinned
    /// limit, `mig` and `exclusive` workers their own memory.)
    pub fn start_budget_watch(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let grace = me.settings.workers.memory_grace;
            // Keyed by worker and pid: a restarted worker starts its grace afresh.
            let mut over_since: std::collections::BTreeMap<(reconcile::WorkerKey, u32), Instant> = Default::default();
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
            loop {
                tick.tick().await;
                let Ok(inventory) = me.inventory().await else { continue };
                let procs: Vec<(u32, u64)> =
                    inventory.gpus.iter().flat_map(|g| g.processes.iter().map(|p| (p.pid, p.used_mib))).collect();
                let owners = me.owners(&procs.iter().map(|(p, _)| *p).collect::<Vec<_>>());
                let mut used: std::collections::BTreeMap<reconcile::WorkerKey, u64> = Default::default();
                for (pid, mib) in procs {
                    if let Some(key) = owners.get(&pid) {
                        *used.entry(key.clone()).or_default() += mib;
                    }
                }
                let records = me.supervisor.records();
                over_since.retain(|(k, pid), _| {
                    records.iter().any(|r| &r.spec.key == k && r.pid == Some(*pid) && r.state.active())
                });
                for r in records.iter().filter(|r| {
                    matches!(r.state, crate::store::WorkerState::Running | crate::store::WorkerState::Starting)
                        && r.spec.isolation == "time-slicing"
                }) {
                    let Some(pid) = r.pid else { continue };
                    let id = (r.spec.key.clone(), pid);
                    let mib = used.get(&r.spec.key).copied().unwrap_or(0);
                    if mib <= r.spec.memory_mib {
                        over_since.remove(&id);
                        continue;
                    }
                    let since = *over_since.entry(id.clone()).or_insert_with(Instant::now);
                    if since.elapsed() < grace {
                        continue;
                    }
                    over_since.remove(&id);
                    let reason = format!(
                        "stopped by the agent: it used {mib} MiB of GPU memory, over its {} MiB budget, for {} ms",
                        r.spec.memory_mib,
                        since.elapsed().as_millis()
                    );
                    me.events.emit(
                        Level::Error,
                        "worker_over_budget",
                        Some(&r.spec.key.model),
                        Some(r.spec.gpu),
                        format!("worker {}: {reason}", r.spec.key),
                    );
                    let me2 = Arc::clone(&me);
                    let key = r.spec.key.clone();
                    tokio::spawn(async move {
                        // Under the apply lock, and only if the same process still runs: an apply
                        // or restart in between owns the worker now.
                        let _apply = me2.apply_lock.lock().await;
                        let same = me2.supervisor.records().iter().any(|r| r.spec.key == key && r.pid == Some(pid));
                        if same {
                            let _ = me2.supervisor.stop_failed(&key, reason).await;
                        }
                    });
                }
            }
        });
    }

    /// Rotates worker logs that grew past their bound (see `logs`).
    pub fn start_log_rotation(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            // Every second: a worker writing fast overshoots the bound by at most a second's
            // output. The copies are file I/O, so off the async workers.
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                let paths: Vec<_> =
                    me.supervisor.records().iter().map(|r| me.supervisor.log_file(&r.spec.key)).collect();
                let _ = tokio::task::spawn_blocking(move || {
                    for path in paths {
                        if let Err(e) = crate::logs::rotate_if_large(&path, crate::logs::MAX_BYTES, crate::logs::KEEP) {
                            tracing::warn!(log = %path.display(), error = %e, "log rotation");
                        }
                    }
                })
                .await;
            }
        });
    }

    /// The log files of a model's workers (one replica, or all), oldest replica first.
    pub fn log_files(&self, model: &str, replica: Option<u32>) -> Result<Vec<(u32, std::path::PathBuf)>, AgentError> {
        let files: Vec<_> = self
            .supervisor
            .records()
            .into_iter()
            .filter(|r| r.spec.key.model == model && replica.is_none_or(|n| r.spec.key.replica == n))
            .map(|r| (r.spec.key.replica, self.supervisor.log_file(&r.spec.key)))
            .collect();
        if files.is_empty() {
            let what = match replica {
                Some(n) => format!("model {model:?} has no replica {n}"),
                None => format!("no model {model:?} runs on this host"),
            };
            return Err(AgentError::NotFound(what));
        }
        Ok(files)
    }

    /// `gpuctl stop MODEL` / `gpuctl restart MODEL`: acts on every replica of the model, one at a
    /// time, under the apply lock. Stopped workers stay `stopped` (held) until `gpuctl apply -f`
    /// or `gpuctl restart`; a restart starts each again through the apply's start path. Nothing is
    /// restarted on a drained GPU.
    pub async fn do_model_action(&self, model: &str, action: &str) -> Result<Vec<String>, AgentError> {
        let _apply = self.apply_lock.lock().await;
        let records: Vec<_> = self.supervisor.records().into_iter().filter(|r| r.spec.key.model == model).collect();
        if records.is_empty() {
            return Err(AgentError::NotFound(format!("no model {model:?} runs on this host")));
        }
        let drained = self.state.snapshot().drained;
        if action == "restart"
            && let Some(r) = records.iter().find(|r| drained.contains(&r.spec.gpu))
        {
            return Err(AgentError::Refused(vec![format!(
                "{} runs on GPU {}, which is drained; undrain it first",
                r.spec.key, r.spec.gpu
            )]));
        }
        let ctx = self.context();
        let mut done = Vec::new();
        for r in records {
            let key = r.spec.key.clone();
            if let (Some(daemon), Some(pid)) = (&r.spec.mps_daemon, r.pid) {
                self.mps.terminate_client(daemon, pid).await;
            }
            match action {
                "stop" => {
                    self.supervisor
                        .stop_keep(&key, "stopped by gpuctl stop".into())
                        .await
                        .map_err(|e| AgentError::Internal(e.to_string()))?;
                    done.push(format!("stopped {key}"));
                }
                "restart" => {
                    self.supervisor
                        .stop_keep(&key, "restarting (gpuctl restart)".into())
                        .await
                        .map_err(|e| AgentError::Internal(e.to_string()))?;
                    let pid = executor::start_worker(&r.spec, &ctx).await.map_err(AgentError::Internal)?;
                    done.push(format!("restarted {key} (pid {pid})"));
                }
                other => return Err(AgentError::NotFound(format!("unknown action {other:?}: stop or restart"))),
            }
            self.events.emit(
                Level::Info,
                "model_action",
                Some(model),
                Some(r.spec.gpu),
                done.last().cloned().unwrap_or_default(),
            );
        }
        Ok(done)
    }

    /// Adopts the workers and MPS daemons that an earlier agent left running.
    pub async fn adopt_workers(&self) -> Result<(), StoreError> {
        self.supervisor.adopt().await
    }

    /// At shutdown, once the socket is closed: waits for an apply, model action, budget stop or
    /// policy restart under way to finish, and keeps any new one from starting (the guard is held
    /// until the agent exits), so the agent never stops halfway through one.
    pub async fn finish_in_flight(&self) -> tokio::sync::OwnedMutexGuard<()> {
        Arc::clone(&self.apply_lock).lock_owned().await
    }

    /// Supervises the MPS daemons an earlier agent left; after the start-up apply.
    pub fn adopt_mps(&self) {
        self.mps.adopt();
    }

    pub async fn inventory(&self) -> Result<Inventory, AgentError> {
        let driver = Arc::clone(&self.driver);
        // NVML calls block; keep them off the async workers.
        tokio::task::spawn_blocking(move || driver.inventory())
            .await
            .map_err(|e| AgentError::Internal(e.to_string()))?
            .map_err(AgentError::from)
    }

    /// Sharing of each GPU according to the stored plan (GPUs no entry selects have none).
    async fn sharing_by_gpu(&self, inventory: &Inventory) -> std::collections::BTreeMap<u32, String> {
        let Some(plan) = self.state.snapshot().plan else { return Default::default() };
        let parsed = parse::parse(&plan.text);
        let (desired, _) = check::check(&parsed.plan, &parsed.spans, inventory, &self.settings.workers);
        desired.gpus.iter().map(|(i, d)| (*i, d.sharing.as_str().to_string())).collect()
    }

    pub async fn do_gpus(&self) -> Result<(Vec<GpuView>, Vec<crate::inventory::Unavailable>), AgentError> {
        let inventory = self.inventory().await?;
        let sharing = self.sharing_by_gpu(&inventory).await;
        let gpus =
            inventory.gpus.into_iter().map(|gpu| GpuView { sharing: sharing.get(&gpu.index).cloned(), gpu }).collect();
        Ok((gpus, inventory.unavailable))
    }

    pub async fn do_status(&self) -> Result<StatusView, AgentError> {
        let inventory = self.inventory().await?;
        let sharing = self.sharing_by_gpu(&inventory).await;
        let state = self.state.snapshot();
        Ok(StatusView {
            driver_version: inventory.driver_version.clone(),
            gpus: inventory
                .gpus
                .into_iter()
                .map(|gpu| GpuView { sharing: sharing.get(&gpu.index).cloned(), gpu })
                .collect(),
            workers: state.workers.clone(),
            state,
            uptime_secs: self.started.elapsed().as_secs(),
        })
    }

    pub async fn do_profiles(&self, which: &str) -> Result<Gpu, AgentError> {
        let inventory = self.inventory().await?;
        let count = inventory.gpus.len();
        inventory.find(which).cloned().ok_or_else(|| {
            AgentError::NotFound(format!(
                "no GPU {which:?} on this host (it has {count} GPUs, indices 0-{})",
                count.saturating_sub(1)
            ))
        })
    }

    /// The worker each of these GPU process ids belongs to (its own process or one in its session).
    pub fn owners(&self, pids: &[u32]) -> std::collections::BTreeMap<u32, reconcile::WorkerKey> {
        self.supervisor.owners(pids)
    }

    pub fn do_mps(&self) -> Vec<DaemonRecord> {
        self.mps.records()
    }

    pub fn do_workers(&self) -> Vec<WorkerRecord> {
        self.supervisor.records()
    }

    pub fn do_events(&self) -> Vec<Event> {
        self.events.list()
    }

    /// Parses and checks a plan against the live host and computes its steps. Changes nothing.
    pub async fn prepare(&self, text: &str, source: &str) -> Result<Prepared, AgentError> {
        self.prepare_with(text, source, &self.state.snapshot().drained, true).await
    }

    /// `prepare` with the drained GPUs given (a drain checks the set it would make before saving
    /// it) and whether held workers (`stopped`, `failed`) start again: only for an operator's
    /// own plan.
    async fn prepare_with(
        &self,
        text: &str,
        source: &str,
        drained: &std::collections::BTreeSet<u32>,
        start_held: bool,
    ) -> Result<Prepared, AgentError> {
        let parsed = parse::parse(text);
        if !parsed.problems.is_empty() && parsed.plan.gpus.is_empty() && parsed.plan.models.is_empty() {
            return Err(AgentError::InvalidPlan(parsed.problems));
        }
        let inventory = self.inventory().await?;
        let (mut desired, mut problems) = check::check(&parsed.plan, &parsed.spans, &inventory, &self.settings.workers);
        problems.splice(0..0, parsed.problems);
        if !problems.is_empty() {
            return Err(AgentError::InvalidPlan(problems));
        }
        desired.start_held = start_held;
        let whole = desired.clone();
        // Drained GPUs are out of the plan's reach: left as they are, nothing placed there.
        if !drained.is_empty() {
            desired.gpus.retain(|gpu, _| !drained.contains(gpu));
            desired.tolerate_unplaced = true;
        }
        let observed = self.supervisor.observed();
        let pids: Vec<u32> = inventory.gpus.iter().flat_map(|g| g.processes.iter().map(|p| p.pid)).collect();
        let owners = self.supervisor.owners(&pids);
        // MPS servers are the agent's own and go with their daemon's stop step.
        let servers = self.mps.daemon_processes(&pids);
        let mut inventory = inventory;
        for gpu in &mut inventory.gpus {
            gpu.processes.retain(|p| !servers.contains(&p.pid));
        }
        let daemons = self.mps.observed();
        let unplaceable = |e: reconcile::PlacementError| {
            AgentError::InvalidPlan(
                e.unplaced
                    .iter()
                    .map(|u| {
                        let index = desired.models.iter().find(|m| m.name == u.model).map(|m| m.index).unwrap_or(0);
                        parsed.spans.problem(
                            &format!("models[{index}]"),
                            format!("replica {} of {:?} cannot be placed: {}", u.replica, u.model, u.reason),
                        )
                    })
                    .collect(),
            )
        };
        // Only the drain may leave replicas unplaced: a plan that would not fit the whole host
        // is refused as it would be without the drain.
        if !drained.is_empty() {
            reconcile::reconcile(&whole, &inventory, &observed, &daemons, &owners).map_err(unplaceable)?;
        }
        let reconciled =
            reconcile::reconcile(&desired, &inventory, &observed, &daemons, &owners).map_err(unplaceable)?;
        Ok(Prepared {
            unplaced: reconciled.unplaced,
            desired,
            steps: reconciled.steps,
            disruptions: reconciled.disruptions,
            text: text.to_string(),
            source: source.to_string(),
        })
    }

    /// Why a prepared change may not run as asked: GPU settings under --read-only-gpus, or
    /// processes it would kill without --drain (and processes that are not ours, always).
    pub fn refusals(&self, prepared: &Prepared, drain: bool) -> Vec<String> {
        let mut out = Vec::new();
        if self.settings.read_only_gpus {
            for step in prepared.steps.iter().filter(|s| s.changes_gpu_settings()) {
                out.push(format!(
                    "{} on GPU {} changes a GPU setting, and the agent runs with --read-only-gpus",
                    step.action(),
                    step.gpu()
                ));
            }
        }
        for d in &prepared.disruptions {
            let ours: Vec<String> = d
                .pids
                .iter()
                .filter_map(|(pid, owner)| owner.as_ref().map(|k| format!("pid {pid} (model {k})")))
                .collect();
            let foreign: Vec<String> =
                d.pids.iter().filter(|(_, owner)| owner.is_none()).map(|(pid, _)| format!("pid {pid}")).collect();
            if !foreign.is_empty() {
                out.push(format!(
                    "{} on GPU {} would kill {}, which {} not run by this agent; stop {} first",
                    d.what,
                    d.gpu,
                    foreign.join(", "),
                    if foreign.len() == 1 { "is" } else { "are" },
                    if foreign.len() == 1 { "it" } else { "them" }
                ));
            }
            if !ours.is_empty() && !drain {
                out.push(format!(
                    "{} on GPU {} would kill {}; pass --drain to stop those workers first and start them again where the plan puts them",
                    d.what,
                    d.gpu,
                    ours.join(", ")
                ));
            }
        }
        out
    }

    /// What an input asks for: the plan text, its source, the drained GPUs it applies under
    /// and whether held workers start again.
    async fn resolve(&self, input: &PlanInput) -> Result<Resolved, AgentError> {
        let mut drained = self.state.snapshot().drained;
        let (text, source, start_held) = match input {
            PlanInput::Text { text, source } => (text.clone(), source.clone(), true),
            PlanInput::Startup { text, source } => (text.clone(), source.clone(), false),
            PlanInput::Partition { gpu, layout } => {
                let (text, source) = self.partition_plan(gpu, layout.as_deref()).await?;
                (text, source, false)
            }
            PlanInput::Drain { gpu, drain } => {
                let inventory = self.inventory().await?;
                let index = inventory
                    .find(gpu)
                    .map(|g| g.index)
                    .ok_or_else(|| AgentError::NotFound(format!("no GPU {gpu:?} on this host")))?;
                if *drain {
                    drained.insert(index);
                } else {
                    drained.remove(&index);
                }
                let verb = if *drain { "drain" } else { "undrain" };
                let text = self.stored_plan().map(|p| p.text).unwrap_or_else(|| "version = 1\n".into());
                (text, format!("gpuctl {verb} {index}"), false)
            }
        };
        Ok(Resolved { text, source, drained, start_held })
    }

    /// `prepare` for an input as `do_apply` would see it now: what a dry run shows.
    pub async fn prepare_input(&self, input: &PlanInput) -> Result<Prepared, AgentError> {
        let r = self.resolve(input).await?;
        self.prepare_with(&r.text, &r.source, &r.drained, r.start_held).await
    }

    /// Applies a plan, reporting progress. Prepares it under the apply lock, so two applies in a
    /// row never act on stale observations. A failed GPU step rolls the whole apply back; the
    /// stored plan then stays the one before.
    pub async fn do_apply(
        &self,
        input: PlanInput,
        drain: bool,
        mut progress: impl FnMut(ApplyProgress),
    ) -> Result<Outcome, AgentError> {
        let _apply = self.apply_lock.lock().await;
        // A partition edit is made to the stored plan as it is now, under the lock, so two edits
        // of different GPUs at once both land.
        let resolved = self.resolve(&input).await?;
        let (text, source) = (resolved.text.as_str(), resolved.source.as_str());
        // The drained set is saved only once the plan under it checks out, so a refused drain
        // changes nothing.
        let prepared = self.prepare_with(text, source, &resolved.drained, resolved.start_held).await?;
        let refusals = self.refusals(&prepared, drain);
        if !refusals.is_empty() {
            return Err(AgentError::Refused(refusals));
        }
        if resolved.drained != self.state.snapshot().drained {
            self.state.update(|s| s.drained = resolved.drained.clone())?;
        }
        progress(ApplyProgress::Plan(prepared.steps.clone()));
        self.events.emit(
            Level::Info,
            "apply_started",
            None,
            None,
            format!("applying {} ({} steps)", source, prepared.steps.len()),
        );
        let ctx = self.context();
        let outcome = executor::execute(&prepared.steps, &ctx, |p| progress(ApplyProgress::Step(p))).await;
        let rolled_back = outcome.rolled_back.is_some();
        if !rolled_back {
            let keep: Vec<_> = prepared
                .desired
                .models
                .iter()
                .flat_map(|m| (0..m.replicas).map(move |r| reconcile::WorkerKey { model: m.name.clone(), replica: r }))
                .collect();
            self.supervisor.forget_inactive(&keep)?;
        }
        let ok = outcome.failed == 0;
        let message = outcome.summary();
        self.state.update(|s| {
            if !rolled_back {
                s.plan = Some(AppliedPlan { source: source.to_string(), text: text.to_string() });
            }
            s.last_apply = Some(ApplyRecord {
                at_unix: crate::events::now_unix_ms() / 1000,
                ok,
                source: source.to_string(),
                steps: outcome.steps as u32,
                message: message.clone(),
            });
        })?;
        let level = if ok { Level::Info } else { Level::Error };
        self.events.emit(level, "apply_finished", None, None, format!("{source}: {message}"));
        for u in &prepared.unplaced {
            self.events.emit(
                Level::Warning,
                "worker_unplaced",
                Some(&u.model),
                None,
                format!("{}/{} does not run while GPUs are drained: {}", u.model, u.replica, u.reason),
            );
        }
        Ok(outcome)
    }

    /// The stored plan with one GPU's MIG layout replaced (`layout` None: MIG off), as plan text.
    /// `partition set` and `partition clear` apply this, so the plan stays the one source of truth.
    pub async fn partition_plan(&self, gpu: &str, layout: Option<&[String]>) -> Result<(String, String), AgentError> {
        let inventory = self.inventory().await?;
        let target = inventory.find(gpu).ok_or_else(|| {
            AgentError::NotFound(format!("no GPU {gpu:?} on this host (it has {} GPUs)", inventory.gpus.len()))
        })?;
        // Check the layout here first, so its problems name the items as the operator typed them.
        if let Some(items) = layout {
            let mut wants = Vec::new();
            let mut problems = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match crate::plan::parse::parse_mig_item(item) {
                    Ok(m) => wants.push(crate::mig::Want { profile: m.profile, start: m.start }),
                    Err(message) => {
                        problems.push(Problem { path: format!("profiles[{i}]"), line: 0, column: 0, message })
                    }
                }
            }
            if problems.is_empty() {
                let name = format!("GPU {} ({})", target.index, target.name);
                if let Err(errors) = crate::mig::plan_layout(&name, &target.profiles, &target.instances, &wants) {
                    problems.extend(errors.into_iter().map(|e| Problem {
                        path: e.want.map(|w| items[w].clone()).unwrap_or_default(),
                        line: 0,
                        column: 0,
                        message: e.message,
                    }));
                }
            }
            if !problems.is_empty() {
                return Err(AgentError::InvalidPlan(problems));
            }
        }
        let stored = self.stored_plan().map(|p| p.text);
        let text = crate::plan::edit::set_partition(stored.as_deref(), &inventory, target.index, layout)
            .map_err(|e| AgentError::InvalidPlan(vec![e]))?;
        let source = match layout {
            Some(items) => format!("gpuctl partition set {} {}", target.index, items.join(" ")),
            None => format!("gpuctl partition clear {}", target.index),
        };
        Ok((text, source))
    }

    /// Records a plan that failed before any step ran (the state is unchanged).
    pub fn record_rejected(&self, source: &str, err: &AgentError) {
        let message = match err {
            AgentError::InvalidPlan(problems) => {
                problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
            }
            other => other.to_string(),
        };
        let _ = self.state.update(|s| {
            s.last_apply = Some(ApplyRecord {
                at_unix: crate::events::now_unix_ms() / 1000,
                ok: false,
                source: source.to_string(),
                steps: 0,
                message: message.clone(),
            });
        });
        self.events.emit(Level::Error, "apply_rejected", None, None, format!("{source}: {message}"));
    }

    pub fn stored_plan(&self) -> Option<AppliedPlan> {
        self.state.snapshot().plan
    }
}

/// A `PlanInput` made concrete (see `Agent::resolve`).
struct Resolved {
    text: String,
    source: String,
    drained: std::collections::BTreeSet<u32>,
    start_held: bool,
}

/// What an apply applies: a plan's text, or the stored plan with one GPU's MIG layout replaced
/// (`None`: MIG off), or the stored plan under a changed drained set.
pub enum PlanInput {
    /// An operator's plan (`gpuctl apply -f`): held workers start again too.
    Text {
        text: String,
        source: String,
    },
    /// The plan the agent applies as it starts: held workers stay as they are.
    Startup {
        text: String,
        source: String,
    },
    Partition {
        gpu: String,
        layout: Option<Vec<String>>,
    },
    /// The stored plan again, after drain (or undrain) of one GPU.
    Drain {
        gpu: String,
        drain: bool,
    },
}

// Short-lived values passed to a callback: boxing the common variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum ApplyProgress {
    Plan(Vec<Step>),
    Step(Progress),
}
