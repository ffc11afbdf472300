//! The supervisor: starts and stops workers, watches each process, and keeps every worker's
//! record in the state file true. Workers run in their own sessions and outlive the agent; a new
//! agent adopts them from the state file (pid plus start time).

use super::proc::{self, Exit};
use super::restart;
use super::spawn::{self, SpawnError};
use crate::events::{Events, Level};
use crate::reconcile::{Observed, WorkerKey, WorkerSpec};
use crate::settings::WorkerPolicy;
use crate::store::{StateFile, StoreError, WorkerRecord, WorkerState};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("worker {0} is not known to the agent")]
    Unknown(WorkerKey),
    #[error("worker {key} (pid {pid}): cannot signal its process group: {source}")]
    Signal { key: WorkerKey, pid: u32, source: nix::Error },
}

pub struct Supervisor {
    state: Arc<StateFile>,
    events: Arc<Events>,
    policy: WorkerPolicy,
    log_dir: PathBuf,
    /// Where MPS daemons keep their pipe directories (for `mps`-tier workers' environment).
    mps_runtime: PathBuf,
    /// Cgroups of workers: the hierarchy and the parent group (None: no usable cgroup fs).
    cgroups: Option<(super::cgroup::Hierarchy, String)>,
    /// Bumped whenever any worker's process exits, so stoppers can wait for it.
    exits: watch::Sender<u64>,
    /// Where restarts due under a worker's restart policy go (the agent starts them, through the
    /// same path as an apply, after the delay).
    restarts: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<(WorkerKey, Duration)>>>,
}

/// The last few lines a worker printed (what a crashed worker said last).
pub fn log_tail(path: &std::path::Path, lines: usize) -> Option<String> {
    let (bytes, _) = crate::logs::tail(path, lines).ok()?;
    let text = String::from_utf8_lossy(&bytes).trim_end().to_string();
    (!text.is_empty()).then_some(text)
}

fn now_unix() -> i64 {
    crate::events::now_unix_ms() / 1000
}

impl Supervisor {
    pub fn new(
        state: Arc<StateFile>,
        events: Arc<Events>,
        policy: WorkerPolicy,
        log_dir: PathBuf,
        mps_runtime: PathBuf,
        cgroups: Option<(super::cgroup::Hierarchy, String)>,
    ) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            state,
            events,
            policy,
            log_dir,
            mps_runtime,
            cgroups,
            exits: watch::channel(0).0,
            restarts: std::sync::Mutex::new(None),
        })
    }

    /// Where restarts due under restart policies are sent.
    pub fn set_restarter(&self, tx: tokio::sync::mpsc::UnboundedSender<(WorkerKey, Duration)>) {
        *self.restarts.lock().expect("restarts lock") = Some(tx);
    }

    /// Re-adopts workers recorded by an earlier agent: a live process with the recorded start
    /// time is watched again; anything else is marked as exited.
    pub async fn adopt(self: &Arc<Self>) -> Result<(), StoreError> {
        let records = self.state.snapshot().workers;
        let mut interrupted = Vec::new();
        for rec in records.into_iter().filter(|r| r.state.active()) {
            let key = rec.spec.key.clone();
            match (rec.pid, rec.start_ticks) {
                (Some(pid), Some(ticks)) if proc::same_process(pid, ticks) => {
                    self.events.emit(
                        Level::Info,
                        "worker_adopted",
                        Some(&key.model),
                        Some(rec.spec.gpu),
                        format!("adopted worker {key} (pid {pid})"),
                    );
                    self.watch(key.clone(), pid);
                    if let Some(health) = rec.spec.health.clone() {
                        self.check_health(key.clone(), pid, health, rec.state == WorkerState::Running);
                    }
                    if rec.state == WorkerState::Stopping {
                        interrupted.push((key, rec.stopping_to.clone()));
                    }
                }
                _ => {
                    self.set(&key, |r| {
                        // A stop that was under way ends as it was meant to. Otherwise its restart
                        // policy decides, its exit (unseen) counting as a failure: `never` leaves
                        // it `failed` (held); else it is not held and the start-up apply starts it.
                        r.pid = None;
                        r.last_exit = Some("exited while the agent was down".into());
                        if let Some((state, reason)) = r.stopping_to.take() {
                            r.state = state;
                            r.last_exit = Some(reason);
                            return;
                        }
                        r.state = if r.spec.restart == "never" { WorkerState::Failed } else { WorkerState::Backoff };
                    })?;
                    self.events.emit(
                        Level::Warning,
                        "worker_lost",
                        Some(&key.model),
                        Some(rec.spec.gpu),
                        format!("worker {key} exited while the agent was down"),
                    );
                }
            }
        }
        // The agent died while stopping these: finish each stop (SIGTERM again, then SIGKILL
        // after its stop timeout) before anything else, so no worker stays `stopping` for ever.
        for (key, keep) in interrupted {
            if let Err(e) = self.stop_with(&key, keep).await {
                tracing::error!(worker = %key, error = %e, "finishing an interrupted stop");
            }
        }
        Ok(())
    }

    /// The workers as the reconciler needs to see them.
    pub fn observed(&self) -> Vec<Observed> {
        self.state
            .snapshot()
            .workers
            .into_iter()
            .map(|r| Observed {
                active: r.state.active(),
                held: matches!(r.state, WorkerState::Stopped | WorkerState::Failed),
                pid: r.pid,
                last_exit: r.last_exit.clone(),
                spec: r.spec,
            })
            .collect()
    }

    /// Which worker each of `pids` belongs to: the worker's own process, or any process in its
    /// session (workers lead their sessions, so their children share the worker's pid as sid).
    pub fn owners(&self, pids: &[u32]) -> std::collections::BTreeMap<u32, WorkerKey> {
        let leaders: std::collections::BTreeMap<u32, WorkerKey> = self
            .records()
            .into_iter()
            .filter(|r| r.state.active())
            .filter_map(|r| r.pid.map(|p| (p, r.spec.key)))
            .collect();
        pids.iter()
            .filter_map(|pid| {
                let sid = proc::session(*pid)?;
                leaders.get(pid).or_else(|| leaders.get(&sid)).map(|k| (*pid, k.clone()))
            })
            .collect()
    }

    pub fn records(&self) -> Vec<WorkerRecord> {
        self.state.snapshot().workers
    }

    /// Kills what is left in a worker's cgroup and removes it, off the async workers (removal
    /// waits briefly for the killed processes to go).
    async fn remove_cgroup(&self, key: &WorkerKey) {
        if let Some(cg) = self.cgroup(key) {
            let _ = tokio::task::spawn_blocking(move || {
                cg.kill_all();
                cg.remove();
            })
            .await;
        }
    }

    /// The cgroup of a worker (None without a usable cgroup fs).
    fn cgroup(&self, key: &WorkerKey) -> Option<super::cgroup::WorkerCgroup> {
        self.cgroups
            .as_ref()
            .map(|(h, parent)| super::cgroup::WorkerCgroup::at(h, parent, &format!("{}.{}", key.model, key.replica)))
    }

    fn log_path(&self, key: &WorkerKey) -> PathBuf {
        self.log_dir.join(format!("{}.{}.log", key.model, key.replica))
    }

    /// Starts a worker and begins watching it. A failed start leaves a `failed` record that says why.
    pub fn start(self: &Arc<Self>, spec: WorkerSpec) -> Result<u32, WorkerError> {
        let key = spec.key.clone();
        let user = spec.user.clone().or_else(|| self.policy.default_user.clone());
        // Starting a worker whose record is still here (it exited, was stopped and kept, or
        // failed to start) is a restart of it; one that left the plan has no record left.
        let previous = self.records().into_iter().find(|r| r.spec.key == key);
        let restarts = previous.as_ref().map(|r| r.restarts + 1).unwrap_or(0);
        let streak = previous.as_ref().map(|r| r.streak).unwrap_or(0);
        // Its cgroup with its limits, joined between fork and exec.
        let joined = match &self.cgroups {
            None => Ok(Vec::new()),
            Some((h, parent)) => super::cgroup::WorkerCgroup::create(
                h,
                parent,
                &format!("{}.{}", key.model, key.replica),
                &spec.limits,
                &spec.other_gpu_minors,
            )
            .and_then(|cg| cg.join_handles())
            .map_err(|e| SpawnError::Exec {
                worker: key.to_string(),
                program: spec.command[0].clone(),
                source: std::io::Error::other(e.to_string()),
            }),
        };
        let spawned =
            joined.and_then(|fds| spawn::spawn(&spec, user.as_deref(), &self.log_path(&key), &self.mps_runtime, &fds));
        match spawned {
            Ok(spawned) => {
                let pid = spawned.pid;
                // A worker with a health check counts as running only once healthy.
                let record = WorkerRecord {
                    spec: spec.clone(),
                    state: if spec.health.is_some() { WorkerState::Starting } else { WorkerState::Running },
                    pid: Some(pid),
                    start_ticks: proc::start_ticks(pid),
                    restarts,
                    last_exit: None,
                    started_at_unix: now_unix(),
                    streak,
                    log_tail: None,
                    unhealthy: false,
                    stopping_to: None,
                };
                // Watch it even if the state file cannot be written: the in-memory record holds
                // it, and an unwatched process would never be reaped or reported.
                let stored = self.put(record);
                self.watch(key.clone(), pid);
                if let Some(health) = spec.health.clone() {
                    self.check_health(key.clone(), pid, health, false);
                }
                stored?;
                self.events.emit(
                    Level::Info,
                    "worker_started",
                    Some(&key.model),
                    Some(spec.gpu),
                    format!("started worker {key} (pid {pid}) on {}", spec.device),
                );
                Ok(pid)
            }
            Err(err) => {
                // A cgroup made for a process that never ran is not left behind.
                if let Some(cg) = self.cgroup(&key) {
                    cg.remove();
                }
                self.record_failed(&spec, &err.to_string());
                Err(err.into())
            }
        }
    }

    /// Records a worker that could not be started (its record says why), so it is never lost
    /// from `gpuctl workers` and `gpuctl apply -f` starts it again (it is held, see `reconcile::Observed::held`).
    pub fn record_failed(&self, spec: &WorkerSpec, error: &str) {
        let previous = self.records().into_iter().find(|r| r.spec.key == spec.key);
        if previous.as_ref().is_some_and(|r| r.state.active()) {
            return;
        }
        let record = WorkerRecord {
            spec: spec.clone(),
            state: WorkerState::Failed,
            pid: None,
            start_ticks: None,
            restarts: previous.as_ref().map(|r| r.restarts).unwrap_or(0),
            last_exit: Some(error.to_string()),
            started_at_unix: now_unix(),
            streak: previous.as_ref().map(|r| r.streak).unwrap_or(0),
            log_tail: None,
            unhealthy: false,
            stopping_to: None,
        };
        let _ = self.put(record);
        self.events.emit(Level::Error, "worker_start_failed", Some(&spec.key.model), Some(spec.gpu), error.to_string());
    }

    /// Stops a worker: SIGTERM to its process group, then SIGKILL after its stop timeout.
    /// Returns once the process is gone; the record is then removed.
    pub async fn stop(self: &Arc<Self>, key: &WorkerKey) -> Result<(), WorkerError> {
        self.stop_with(key, None).await
    }

    /// Stops a worker for a reason of the agent's own (over its GPU memory budget, say): the
    /// record stays, `failed` with that reason, and the restart policy does not bring it back.
    pub async fn stop_failed(self: &Arc<Self>, key: &WorkerKey, reason: String) -> Result<(), WorkerError> {
        self.stop_with(key, Some((WorkerState::Failed, reason))).await
    }

    /// Stops a worker on an operator's request (`gpuctl stop`): the record stays, `stopped`.
    pub async fn stop_keep(self: &Arc<Self>, key: &WorkerKey, reason: String) -> Result<(), WorkerError> {
        self.stop_with(key, Some((WorkerState::Stopped, reason))).await
    }

    /// The log file of a worker.
    pub fn log_file(&self, key: &WorkerKey) -> PathBuf {
        self.log_path(key)
    }

    async fn stop_with(
        self: &Arc<Self>,
        key: &WorkerKey,
        keep: Option<(WorkerState, String)>,
    ) -> Result<(), WorkerError> {
        let record =
            self.records().into_iter().find(|r| &r.spec.key == key).ok_or_else(|| WorkerError::Unknown(key.clone()))?;
        if let Some(pid) = record.pid {
            // Only a record that still names this live process becomes `stopping`; if it exited
            // in between, there is nothing left to signal.
            let stopping = self.set(key, |r| {
                let live = r.pid == Some(pid) && r.state.active();
                if live {
                    r.state = WorkerState::Stopping;
                    r.stopping_to = keep.clone();
                }
                live
            })?;
            if stopping {
                self.terminate(key, pid, &record).await?;
            }
        }
        if let Some((state, reason)) = keep {
            let ours = self.set(key, |r| {
                // Only the record of the process stopped here (or of none): a worker started
                // meanwhile (a restart under the apply lock) keeps its own.
                if r.pid.is_some() && r.pid != record.pid {
                    return false;
                }
                // An operator's stop or restart ends a crash loop's count.
                if state == WorkerState::Stopped {
                    r.streak = 0;
                }
                r.state = state;
                r.pid = None;
                r.last_exit = Some(reason);
                r.stopping_to = None;
                true
            })?;
            if ours {
                self.remove_cgroup(key).await;
            }
            return Ok(());
        }
        // No orphan survives: whatever is left in the worker's cgroup goes, and so does the cgroup.
        if let Some(cg) = self.cgroup(key) {
            cg.kill_all();
            cg.remove();
        }
        self.state.update(|s| s.workers.retain(|r| &r.spec.key != key))?;
        self.events.emit(
            Level::Info,
            "worker_stopped",
            Some(&key.model),
            Some(record.spec.gpu),
            format!("stopped worker {key}"),
        );
        Ok(())
    }

    /// SIGTERM to the worker's process group, SIGKILL to its whole session after the stop
    /// timeout; returns once the worker's process is gone.
    async fn terminate(self: &Arc<Self>, key: &WorkerKey, pid: u32, record: &WorkerRecord) -> Result<(), WorkerError> {
        let mut exits = self.exits.subscribe();
        let alive = || self.records().iter().any(|r| &r.spec.key == key && r.pid == Some(pid));
        if let Err(e) = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM)
            && e != nix::errno::Errno::ESRCH
        {
            return Err(WorkerError::Signal { key: key.clone(), pid, source: e });
        }
        let deadline = tokio::time::Instant::now().checked_add(record.spec.stop_timeout);
        while alive() {
            let timed_out = match deadline {
                Some(d) => tokio::time::timeout_at(d, exits.changed()).await.is_err(),
                None => exits.changed().await.is_err(),
            };
            if timed_out {
                self.events.emit(
                    Level::Warning,
                    "worker_killed",
                    Some(&key.model),
                    Some(record.spec.gpu),
                    format!(
                        "worker {key} (pid {pid}) ignored SIGTERM for {:?}: sending SIGKILL",
                        record.spec.stop_timeout
                    ),
                );
                proc::kill_session(pid);
                if let Some(cg) = self.cgroup(key) {
                    cg.kill_all();
                }
                // SIGKILL cannot be ignored; wait for the watcher to see the exit.
                while alive() {
                    if tokio::time::timeout(Duration::from_secs(5), exits.changed()).await.is_err() {
                        break;
                    }
                }
                break;
            }
        }
        Ok(())
    }

    /// Drops records of workers that have no process and are not in `keep`.
    pub fn forget_inactive(&self, keep: &[WorkerKey]) -> Result<(), StoreError> {
        self.state.update(|s| s.workers.retain(|r| r.state.active() || keep.contains(&r.spec.key)))
    }

    /// Probes a worker's health: `starting` turns `running` at the first healthy answer; a
    /// worker that is not healthy within its start timeout, or fails `failure_threshold` checks in
    /// a row once it was, is ended (SIGTERM, SIGKILL after its stop timeout) and its restart
    /// policy decides what comes next.
    /// `running`: the worker was already healthy (adopted as `running`), so its first failures
    /// count against it at once instead of as start-up grace.
    fn check_health(self: &Arc<Self>, key: WorkerKey, pid: u32, health: crate::reconcile::HealthSpec, running: bool) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut failures = 0u32;
            let mut healthy_once = running;
            loop {
                // While starting, look often, so a ready worker is `running` soon.
                let pause =
                    if healthy_once { health.interval } else { health.interval.min(Duration::from_millis(200)) };
                tokio::time::sleep(pause).await;
                let Some(record) = me.records().into_iter().find(|r| r.spec.key == key) else { return };
                if record.pid != Some(pid) || !matches!(record.state, WorkerState::Starting | WorkerState::Running) {
                    return;
                }
                match super::health::probe(&health).await {
                    Ok(()) => {
                        failures = 0;
                        if !healthy_once {
                            healthy_once = true;
                            let _ = me.set(&key, |r| {
                                if r.pid == Some(pid) && r.state == WorkerState::Starting {
                                    r.state = WorkerState::Running;
                                }
                            });
                            me.events.emit(
                                Level::Info,
                                "worker_healthy",
                                Some(&key.model),
                                Some(record.spec.gpu),
                                format!(
                                    "worker {key} (pid {pid}) is healthy after {} ms",
                                    started.elapsed().as_millis()
                                ),
                            );
                        }
                    }
                    Err(e) => {
                        failures += 1;
                        let give_up = if healthy_once {
                            failures >= health.failure_threshold
                        } else {
                            started.elapsed() >= health.start_timeout
                        };
                        if !give_up {
                            continue;
                        }
                        let why = if healthy_once {
                            format!("{failures} health checks failed in a row ({e})")
                        } else {
                            format!("not healthy within {} ms ({e})", health.start_timeout.as_millis())
                        };
                        me.events.emit(
                            Level::Error,
                            "worker_unhealthy",
                            Some(&key.model),
                            Some(record.spec.gpu),
                            format!("worker {key} (pid {pid}): {why}; ending it"),
                        );
                        let _ = me.set(&key, |r| r.unhealthy = r.pid == Some(pid));
                        let _ = me.terminate(&key, pid, &record).await;
                        return;
                    }
                }
            }
        });
    }

    fn watch(self: &Arc<Self>, key: WorkerKey, pid: u32) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let exit = proc::wait_exit(pid).await;
            me.exited(&key, pid, exit);
        });
    }

    fn exited(&self, key: &WorkerKey, pid: u32, exit: Exit) {
        // What the worker left behind in its cgroup (also what escaped its session) goes with it.
        if let Some(cg) = self.cgroup(key) {
            cg.kill_all();
        }
        let tail = log_tail(&self.log_path(key), 5);
        let mut outcome = None;
        let updated = self.set(key, |r| {
            if r.pid != Some(pid) {
                return false;
            }
            let stopping = r.state == WorkerState::Stopping;
            r.pid = None;
            r.last_exit = Some(exit.to_string());
            r.log_tail = tail.clone();
            if stopping {
                r.state = WorkerState::Stopped;
                return false;
            }
            let ran_for = Duration::from_secs(now_unix().saturating_sub(r.started_at_unix).max(0) as u64);
            let success = exit.success() && !r.unhealthy;
            let decision = restart::decide(
                &r.spec.restart,
                success,
                ran_for,
                r.streak,
                self.policy.restart_backoff,
                fastrand::f64(),
            );
            r.state = match decision {
                restart::Decision::Restart { streak, .. } => {
                    r.streak = streak;
                    WorkerState::Backoff
                }
                restart::Decision::GiveUp { streak } => {
                    r.streak = streak;
                    WorkerState::Failed
                }
                restart::Decision::Stay if success => WorkerState::Stopped,
                restart::Decision::Stay => WorkerState::Failed,
            };
            if r.unhealthy {
                r.last_exit = Some(format!("ended after failing its health check; {exit}"));
            }
            outcome = Some((r.spec.gpu, decision));
            true
        });
        if let (Ok(true), Some((_, decision))) = (&updated, &outcome)
            && !matches!(decision, restart::Decision::Restart { .. })
            && let Some(cg) = self.cgroup(key)
        {
            // Not coming back on its own: its (now empty) cgroup goes; a start makes it anew.
            tokio::task::spawn_blocking(move || cg.remove());
        }
        if let (Ok(true), Some((gpu, decision))) = (updated, outcome) {
            let said =
                tail.as_deref().map(|t| format!("; it last printed: {}", t.replace('\n', " | "))).unwrap_or_default();
            let (level, kind, what) = match decision {
                restart::Decision::Restart { delay, streak } => (
                    Level::Warning,
                    "worker_backoff",
                    format!("restarting in {} ms (exit {streak} in a row)", delay.as_millis()),
                ),
                restart::Decision::GiveUp { streak } => (
                    Level::Error,
                    "worker_failed",
                    format!(
                        "crash loop: {streak} quick exits in a row, not restarting it until `gpuctl apply -f` or `gpuctl restart`"
                    ),
                ),
                restart::Decision::Stay if exit.success() => {
                    (Level::Info, "worker_exited", "restart policy: stays exited".into())
                }
                restart::Decision::Stay => (Level::Error, "worker_exited", "restart policy: stays exited".into()),
            };
            self.events.emit(
                level,
                kind,
                Some(&key.model),
                Some(gpu),
                format!("worker {key} (pid {pid}) {exit}; {what}{said}"),
            );
            if let restart::Decision::Restart { delay, .. } = decision
                && let Some(tx) = self.restarts.lock().expect("restarts lock").as_ref()
            {
                let _ = tx.send((key.clone(), delay));
            }
        }
        self.exits.send_modify(|n| *n += 1);
    }

    /// A restart that could not start the worker counts as one more quick exit.
    pub fn restart_failed(&self, key: &WorkerKey, error: &str) {
        let mut next = None;
        let _ = self.set(key, |r| {
            let decision = restart::decide(
                &r.spec.restart,
                false,
                Duration::ZERO,
                r.streak,
                self.policy.restart_backoff,
                fastrand::f64(),
            );
            r.last_exit = Some(error.to_string());
            match decision {
                restart::Decision::Restart { delay, streak } => {
                    r.state = WorkerState::Backoff;
                    r.streak = streak;
                    next = Some(delay);
                }
                _ => r.state = WorkerState::Failed,
            }
        });
        match next {
            Some(delay) => {
                if let Some(tx) = self.restarts.lock().expect("restarts lock").as_ref() {
                    let _ = tx.send((key.clone(), delay));
                }
            }
            None => self.events.emit(
                Level::Error,
                "worker_failed",
                Some(&key.model),
                None,
                format!("worker {key}: {error}; giving up"),
            ),
        }
    }

    fn put(&self, record: WorkerRecord) -> Result<(), StoreError> {
        self.state.update(|s| {
            s.workers.retain(|r| r.spec.key != record.spec.key);
            s.workers.push(record);
            s.workers.sort_by(|a, b| a.spec.key.cmp(&b.spec.key));
        })
    }

    fn set<R: Default>(&self, key: &WorkerKey, f: impl FnOnce(&mut WorkerRecord) -> R) -> Result<R, StoreError> {
        self.state.update(|s| s.workers.iter_mut().find(|r| &r.spec.key == key).map(f).unwrap_or_default())
    }
}
