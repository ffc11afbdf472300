//! The agent's operations, one `do_*` method per RPC, in domain types. The RPC layer (`rpc`) only
//! converts to and from protobuf and maps [`AgentError`] to status codes.

use crate::driver::{DriverError, GpuDriver};
use crate::events::{Event, Events, Level};
use crate::executor::{self, Outcome, Progress};
use crate::inventory::{Gpu, Inventory};
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
    events: Arc<Events>,
    /// One apply at a time; a second waits for the first.
    apply_lock: tokio::sync::Mutex<()>,
    started: Instant,
}

/// A validated plan and what applying it would do.
pub struct Prepared {
    pub desired: Desired,
    pub steps: Vec<Step>,
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
        );
        Arc::new(Agent {
            settings,
            driver,
            state,
            supervisor,
            events,
            apply_lock: tokio::sync::Mutex::new(()),
            started: Instant::now(),
        })
    }

    /// Adopts workers that an earlier agent left running.
    pub fn adopt_workers(&self) -> Result<(), StoreError> {
        self.supervisor.adopt()
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

    pub async fn do_gpus(&self) -> Result<Vec<GpuView>, AgentError> {
        let inventory = self.inventory().await?;
        let sharing = self.sharing_by_gpu(&inventory).await;
        Ok(inventory.gpus.into_iter().map(|gpu| GpuView { sharing: sharing.get(&gpu.index).cloned(), gpu }).collect())
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

    pub fn do_workers(&self) -> Vec<WorkerRecord> {
        self.supervisor.records()
    }

    pub fn do_events(&self) -> Vec<Event> {
        self.events.list()
    }

    /// Parses and checks a plan against the live host and computes its steps. Changes nothing.
    pub async fn prepare(&self, text: &str, source: &str) -> Result<Prepared, AgentError> {
        let parsed = parse::parse(text);
        if !parsed.problems.is_empty() && parsed.plan.gpus.is_empty() && parsed.plan.models.is_empty() {
            return Err(AgentError::InvalidPlan(parsed.problems));
        }
        let inventory = self.inventory().await?;
        let (desired, mut problems) = check::check(&parsed.plan, &parsed.spans, &inventory, &self.settings.workers);
        problems.splice(0..0, parsed.problems);
        if !problems.is_empty() {
            return Err(AgentError::InvalidPlan(problems));
        }
        let observed = self.supervisor.observed();
        let steps = reconcile::reconcile(&desired, &inventory, &observed).map_err(|e| {
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
        })?;
        Ok(Prepared { desired, steps, text: text.to_string(), source: source.to_string() })
    }

    /// Applies a prepared plan, reporting progress. Recomputes the steps under the apply lock, so
    /// two applies in a row never act on stale observations.
    pub async fn do_apply(
        &self,
        text: &str,
        source: &str,
        mut progress: impl FnMut(ApplyProgress),
    ) -> Result<Outcome, AgentError> {
        let _apply = self.apply_lock.lock().await;
        let prepared = self.prepare(text, source).await?;
        progress(ApplyProgress::Plan(prepared.steps.clone()));
        self.events.emit(
            Level::Info,
            "apply_started",
            None,
            None,
            format!("applying {} ({} steps)", source, prepared.steps.len()),
        );
        let outcome = executor::execute(&prepared.steps, &self.supervisor, self.settings.read_only_gpus, |p| {
            progress(ApplyProgress::Step(p))
        })
        .await;
        let keep: Vec<_> = prepared
            .desired
            .models
            .iter()
            .flat_map(|m| (0..m.replicas).map(move |r| reconcile::WorkerKey { model: m.name.clone(), replica: r }))
            .collect();
        self.supervisor.forget_inactive(&keep)?;
        let ok = outcome.failed == 0;
        let message = if ok {
            format!("applied {} step(s)", outcome.steps)
        } else {
            format!("{} of {} step(s) failed", outcome.failed, outcome.steps)
        };
        self.state.update(|s| {
            s.plan = Some(AppliedPlan { source: source.to_string(), text: text.to_string() });
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
        Ok(outcome)
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

// Short-lived values passed to a callback: boxing the common variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum ApplyProgress {
    Plan(Vec<Step>),
    Step(Progress),
}
