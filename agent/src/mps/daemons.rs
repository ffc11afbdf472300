//! MPS daemons under supervision. Each daemon has a supervising task that waits for the daemon's
//! process to exit (pidfd) and polls its server for FAULT; either way it restarts the daemon
//! with backoff, then restarts that daemon's workers (a daemon's clients die with it, and a client
//! of a dead daemon would run without MPS and without limits, so none is started before its
//! daemon answers). It also checks that the agent's `mps` workers really are MPS clients.

use super::control::{Control, MpsError};
use crate::driver::GpuDriver;
use crate::events::{Events, Level};
use crate::reconcile::WorkerKey;
use crate::store::{StateFile, StoreError};
use crate::workers::{Supervisor, proc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What one daemon should be: its device and the defaults its servers get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonSpec {
    /// `gpu1`, or `gpu0-1g.18gb@6` for a MIG instance.
    pub name: String,
    pub gpu: u32,
    /// `PROFILE@START` of its MIG instance.
    pub instance: Option<String>,
    /// `GPU-...` or `MIG-...`; empty until an instance this apply creates exists.
    pub device: String,
    pub active_thread_percentage: Option<u32>,
    pub pinned_limit_mib: Option<u64>,
}

/// A daemon the agent runs, as the reconciler sees it.
#[derive(Debug, Clone)]
pub struct ObservedDaemon {
    pub spec: DaemonSpec,
    pub running: bool,
}

/// The durable record of a daemon (in the agent's state file), so a new agent adopts it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonRecord {
    pub spec: DaemonSpec,
    pub pid: Option<u32>,
    /// Start time of the daemon's process (/proc start ticks): pid plus this tells a reused pid
    /// from the daemon.
    #[serde(default)]
    pub start_ticks: Option<u64>,
    pub restarts: u32,
    /// running | restarting | failed
    pub state: String,
    pub last_error: Option<String>,
}

/// What the manager needs to know about the host.
pub struct MpsSettings {
    pub binary: PathBuf,
    pub runtime_dir: PathBuf,
    pub env: Vec<(String, String)>,
}

pub struct MpsManager {
    settings: MpsSettings,
    state: Arc<StateFile>,
    events: Arc<Events>,
    supervisor: Arc<Supervisor>,
    driver: Arc<dyn GpuDriver>,
    /// A stop switch per supervised daemon.
    watchers: Mutex<BTreeMap<String, watch::Sender<bool>>>,
    /// Workers already reported as not being MPS clients (reported once).
    reported: Mutex<BTreeSet<WorkerKey>>,
    /// The agent's apply lock: a supervisor's restart of a daemon and its clients never runs
    /// during an apply (which may be stopping or replacing that very daemon).
    apply_lock: Arc<tokio::sync::Mutex<()>>,
}

fn alive(record: &DaemonRecord) -> bool {
    match (record.pid, record.start_ticks) {
        (Some(pid), Some(ticks)) => proc::same_process(pid, ticks),
        (Some(pid), None) => proc::alive(pid),
        _ => false,
    }
}

const FAULT_POLL: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A daemon up this long counts as stable: the next failure starts the backoff afresh.
const STABLE: Duration = Duration::from_secs(60);

impl MpsManager {
    pub fn new(
        settings: MpsSettings,
        state: Arc<StateFile>,
        events: Arc<Events>,
        supervisor: Arc<Supervisor>,
        driver: Arc<dyn GpuDriver>,
        apply_lock: Arc<tokio::sync::Mutex<()>>,
    ) -> Arc<MpsManager> {
        Arc::new(MpsManager {
            settings,
            state,
            events,
            supervisor,
            driver,
            watchers: Mutex::new(BTreeMap::new()),
            reported: Mutex::new(BTreeSet::new()),
            apply_lock,
        })
    }

    pub fn control(&self, spec: &DaemonSpec) -> Control {
        Control::new(&self.settings.binary, &self.settings.runtime_dir, &spec.name, &spec.device, &self.settings.env)
    }

    pub fn records(&self) -> Vec<DaemonRecord> {
        self.state.snapshot().mps
    }

    pub fn observed(&self) -> Vec<ObservedDaemon> {
        self.records()
            .into_iter()
            .map(|r| ObservedDaemon { running: r.state == "running" && alive(&r), spec: r.spec })
            .collect()
    }

    fn record(&self, name: &str) -> Option<DaemonRecord> {
        self.records().into_iter().find(|r| r.spec.name == name)
    }

    fn put(&self, record: DaemonRecord) -> Result<(), StoreError> {
        self.state.update(|s| {
            s.mps.retain(|r| r.spec.name != record.spec.name);
            s.mps.push(record);
            s.mps.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        })
    }

    /// Which of these GPU processes belong to the agent's MPS daemons (their servers run in the
    /// daemon's session). The steps that stop a daemon also end its servers, so these never stand
    /// in the way of a GPU change.
    pub fn daemon_processes(&self, pids: &[u32]) -> BTreeSet<u32> {
        let daemons: BTreeSet<u32> = self.records().iter().filter_map(|r| r.pid).collect();
        pids.iter()
            .copied()
            .filter(|p| daemons.contains(p) || proc::session(*p).is_some_and(|s| daemons.contains(&s)))
            .collect()
    }

    /// Whether daemon `name` answers now (a client must not start otherwise).
    pub async fn answers(&self, name: &str) -> bool {
        let Some(record) = self.record(name) else { return false };
        let control = self.control(&record.spec);
        tokio::task::spawn_blocking(move || control.answers()).await.unwrap_or(false)
    }

    /// Starts a daemon and sets its defaults before any client can come, then supervises it.
    /// Whatever answered on its pipe directory before is asked to quit first; a daemon that
    /// started but could not be set up is quit again. A failed start is recorded (`failed`) and
    /// its supervisor keeps retrying with backoff.
    pub async fn start(self: &Arc<Self>, spec: DaemonSpec) -> Result<(), String> {
        let control = self.control(&spec);
        let (pct, pinned) = (spec.active_thread_percentage, spec.pinned_limit_mib);
        let started = tokio::task::spawn_blocking(move || -> Result<u32, MpsError> {
            control.quit()?;
            control.start()?;
            if let Err(e) = control.set_defaults(pct, pinned) {
                let _ = control.quit();
                return Err(e);
            }
            Ok(control.pid().unwrap_or(0))
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
        let restarts = self.record(&spec.name).map(|r| r.restarts).unwrap_or(0);
        let (record, result) = match started {
            Ok(pid) => (
                DaemonRecord {
                    spec: spec.clone(),
                    pid: Some(pid),
                    start_ticks: proc::start_ticks(pid),
                    restarts,
                    state: "running".into(),
                    last_error: None,
                },
                Ok(pid),
            ),
            Err(e) => (
                DaemonRecord {
                    spec: spec.clone(),
                    pid: None,
                    start_ticks: None,
                    restarts,
                    state: "failed".into(),
                    last_error: Some(e.clone()),
                },
                Err(e),
            ),
        };
        self.put(record).map_err(|e| e.to_string())?;
        match &result {
            Ok(pid) => self.events.emit(
                Level::Info,
                "mps_started",
                None,
                Some(spec.gpu),
                format!("MPS daemon {} (pid {pid}) on {}", spec.name, spec.device),
            ),
            Err(e) => self.events.emit(
                Level::Error,
                "mps_start_failed",
                None,
                Some(spec.gpu),
                format!("MPS daemon {}: {e}", spec.name),
            ),
        }
        self.supervise(spec.name.clone());
        result.map(|_| ())
    }

    /// Stops supervising daemon `name` and asks it to quit (its clients must be stopped first).
    pub async fn stop(&self, name: &str) -> Result<(), String> {
        if let Some(tx) = self.watchers.lock().expect("watchers lock").remove(name) {
            let _ = tx.send(true);
        }
        let Some(record) = self.record(name) else { return Ok(()) };
        let control = self.control(&record.spec);
        tokio::task::spawn_blocking(move || control.quit())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        self.state.update(|s| s.mps.retain(|r| r.spec.name != name)).map_err(|e| e.to_string())?;
        self.events.emit(Level::Info, "mps_stopped", None, Some(record.spec.gpu), format!("MPS daemon {name} quit"));
        Ok(())
    }

    /// Ends one client the safe way, if it is one; the caller then stops the worker as usual.
    pub async fn terminate_client(&self, name: &str, pid: u32) {
        let Some(record) = self.record(name) else { return };
        let control = self.control(&record.spec);
        let _ = tokio::task::spawn_blocking(move || control.terminate_client(pid)).await;
    }

    /// Supervises the daemons an earlier agent left (a dead one is restarted by its supervisor).
    /// Called after the start-up apply, which replaces what the plan changed (and re-creates MIG
    /// instances first), so no supervisor restarts a daemon on an instance that is gone.
    pub fn adopt(self: &Arc<Self>) {
        let watched: BTreeSet<String> = self.watchers.lock().expect("watchers lock").keys().cloned().collect();
        for record in self.records().into_iter().filter(|r| !watched.contains(&r.spec.name)) {
            self.events.emit(
                Level::Info,
                "mps_adopted",
                None,
                Some(record.spec.gpu),
                format!("MPS daemon {} (pid {:?})", record.spec.name, record.pid),
            );
            self.supervise(record.spec.name.clone());
        }
    }

    fn supervise(self: &Arc<Self>, name: String) {
        let (tx, rx) = watch::channel(false);
        if let Some(old) = self.watchers.lock().expect("watchers lock").insert(name.clone(), tx) {
            let _ = old.send(true);
        }
        let me = Arc::clone(self);
        tokio::spawn(async move { me.supervise_loop(name, rx).await });
    }

    async fn supervise_loop(self: Arc<Self>, name: String, mut stop: watch::Receiver<bool>) {
        let mut backoff = Duration::from_secs(1);
        let mut last_restart: Option<Instant> = None;
        loop {
            let Some(record) = self.record(&name) else { return };
            let why = tokio::select! {
                _ = stop.changed() => return,
                why = self.trouble(&record) => why,
            };
            if *stop.borrow() {
                return;
            }
            let down_at = Instant::now();
            self.events.emit(
                Level::Error,
                "mps_down",
                None,
                Some(record.spec.gpu),
                format!("MPS daemon {name}: {why}"),
            );
            self.mark(&name, "restarting", Some(why.clone()));
            // A daemon that dies again soon after a restart waits out a growing backoff first.
            match last_restart {
                Some(t) if t.elapsed() < STABLE => {
                    tokio::select! {
                        _ = stop.changed() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                _ => backoff = Duration::from_secs(1),
            }
            // Restart the daemon, then its clients, between applies; an apply may have stopped or
            // replaced the daemon meanwhile, in which case this supervisor is done.
            let restarted = loop {
                let _apply = self.apply_lock.lock().await;
                if *stop.borrow() {
                    return;
                }
                let Some(record) = self.record(&name) else { return };
                if alive(&record) && record.state == "running" {
                    break 0;
                }
                let control = self.control(&record.spec);
                let (pct, pinned) = (record.spec.active_thread_percentage, record.spec.pinned_limit_mib);
                let result = tokio::task::spawn_blocking(move || -> Result<Option<u32>, MpsError> {
                    // A faulted daemon may still run: make room for the new one.
                    control.quit()?;
                    control.start()?;
                    if let Err(e) = control.set_defaults(pct, pinned) {
                        let _ = control.quit();
                        return Err(e);
                    }
                    Ok(control.pid())
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
                match result {
                    Ok(pid) => {
                        let _ = self.state.update(|s| {
                            if let Some(r) = s.mps.iter_mut().find(|r| r.spec.name == name) {
                                r.pid = pid;
                                r.start_ticks = pid.and_then(proc::start_ticks);
                                r.restarts += 1;
                                r.state = "running".into();
                            }
                        });
                        break self.restart_workers(&name).await;
                    }
                    Err(e) => {
                        self.mark(&name, "failed", Some(e.clone()));
                        self.events.emit(
                            Level::Error,
                            "mps_restart_failed",
                            None,
                            Some(record.spec.gpu),
                            format!("MPS daemon {name}: {e}; retrying in {backoff:?}"),
                        );
                    }
                }
                drop(_apply);
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            };
            last_restart = Some(Instant::now());
            self.events.emit(
                Level::Info,
                "mps_recovered",
                None,
                Some(record.spec.gpu),
                format!(
                    "MPS daemon {name} restarted and {restarted} worker(s) started again, {} ms after it went down",
                    down_at.elapsed().as_millis()
                ),
            );
        }
    }

    fn mark(&self, name: &str, state: &str, error: Option<String>) {
        let _ = self.state.update(|s| {
            if let Some(r) = s.mps.iter_mut().find(|r| r.spec.name == name) {
                r.state = state.to_string();
                r.last_error = error;
            }
        });
    }

    /// Waits until the daemon exits or its server reports FAULT, checking on the way that the
    /// daemon's workers are MPS clients; returns what went wrong.
    async fn trouble(&self, record: &DaemonRecord) -> String {
        let Some(pid) = record.pid.filter(|_| alive(record)) else {
            return "its process is gone".to_string();
        };
        // A daemon that stops answering its command interface is as good as dead.
        let mut silent = 0;
        let exited = proc::wait_gone(pid);
        tokio::pin!(exited);
        let mut tick = tokio::time::interval(FAULT_POLL);
        loop {
            tokio::select! {
                _ = &mut exited => return format!("its process (pid {pid}) exited"),
                _ = tick.tick() => {
                    let control = self.control(&record.spec);
                    let checked = tokio::task::spawn_blocking(move || -> Result<Option<u32>, MpsError> {
                        let servers = control.servers()?;
                        Ok(servers.into_iter().find(|s| control.server_status(*s).is_ok_and(|st| st == "FAULT")))
                    }).await;
                    match checked {
                        Ok(Ok(Some(server))) => return format!("its server (pid {server}) is in FAULT"),
                        Ok(Ok(None)) => silent = 0,
                        _ => {
                            silent += 1;
                            if silent >= 3 {
                                return "it stopped answering its command interface".to_string();
                            }
                        }
                    }
                    self.check_clients(&record.spec).await;
                }
            }
        }
    }

    /// Reports (once per worker) an `mps` worker whose GPU process is not an MPS client: it runs
    /// without MPS and without its limits.
    async fn check_clients(&self, spec: &DaemonSpec) {
        let driver = Arc::clone(&self.driver);
        let Ok(Ok(inventory)) = tokio::task::spawn_blocking(move || driver.inventory()).await else { return };
        let Some(gpu) = inventory.gpu(spec.gpu) else { return };
        let pids: Vec<u32> = gpu.processes.iter().map(|p| p.pid).collect();
        let owners = self.supervisor.owners(&pids);
        for p in &gpu.processes {
            let Some(key) = owners.get(&p.pid) else { continue };
            let ours = self
                .supervisor
                .records()
                .into_iter()
                .any(|r| &r.spec.key == key && r.spec.mps_daemon.as_deref() == Some(&spec.name));
            if ours && !p.mps_client && self.reported.lock().expect("reported lock").insert(key.clone()) {
                self.events.emit(
                    Level::Error,
                    "mps_not_client",
                    Some(&key.model),
                    Some(spec.gpu),
                    format!(
                        "worker {key} (pid {}) is not an MPS client of {}: it runs without MPS limits",
                        p.pid, spec.name
                    ),
                );
            }
        }
    }

    /// Starts every worker of daemon `name` again (stopping those still running first).
    async fn restart_workers(self: &Arc<Self>, name: &str) -> usize {
        let records: Vec<_> =
            self.supervisor.records().into_iter().filter(|r| r.spec.mps_daemon.as_deref() == Some(name)).collect();
        let mut n = 0;
        for r in records {
            self.reported.lock().expect("reported lock").remove(&r.spec.key);
            if r.state.active() {
                let _ = self.supervisor.stop(&r.spec.key).await;
            }
            if self.supervisor.start(r.spec).is_ok() {
                n += 1;
            }
        }
        n
    }
}
