//! Durable agent state (`state.json` in the state directory): the applied plan, the last apply,
//! and every worker with its pid and process start time, so a restarted agent finds its workers.
//!
//! Invariant: the file is only ever replaced whole (temp file, fsync, rename, fsync of the
//! directory), so a crash leaves either the old state or the new one, never a torn one.

use crate::reconcile::WorkerSpec;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("state file {path} is not valid agent state ({source}); move it aside to start afresh")]
    Parse { path: PathBuf, source: serde_json::Error },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AgentState {
    /// The plan last applied, re-applied at start when no --plan is given. An apply whose GPU
    /// step failed and was rolled back leaves the plan before it here; one where only a worker
    /// failed to start stores its plan (the next start tries that worker again).
    pub plan: Option<AppliedPlan>,
    pub last_apply: Option<ApplyRecord>,
    pub workers: Vec<WorkerRecord>,
    /// MPS daemons the agent runs.
    #[serde(default)]
    pub mps: Vec<crate::mps::daemons::DaemonRecord>,
    /// GPUs drained by `gpuctl drain`: no worker is placed there and the plan leaves them as they
    /// are, until `gpuctl undrain`.
    #[serde(default)]
    pub drained: std::collections::BTreeSet<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppliedPlan {
    pub source: String,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApplyRecord {
    pub at_unix: i64,
    pub ok: bool,
    pub source: String,
    pub steps: u32,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    Starting,
    Running,
    Stopping,
    Stopped,
    Backoff,
    Failed,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::Running => "running",
            WorkerState::Stopping => "stopping",
            WorkerState::Stopped => "stopped",
            WorkerState::Backoff => "backoff",
            WorkerState::Failed => "failed",
        }
    }

    /// A process exists (or is about to) for this worker.
    pub fn active(self) -> bool {
        matches!(self, WorkerState::Starting | WorkerState::Running | WorkerState::Stopping)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub spec: WorkerSpec,
    pub state: WorkerState,
    pub pid: Option<u32>,
    /// Start time of the process in clock ticks since boot (/proc/PID/stat field 22): a pid plus
    /// this identifies the process even after the pid is reused.
    pub start_ticks: Option<u64>,
    pub restarts: u32,
    pub last_exit: Option<String>,
    pub started_at_unix: i64,
    /// Quick exits in a row (see `workers::restart`).
    #[serde(default)]
    pub streak: u32,
    /// The last lines the worker printed before it last exited.
    #[serde(default)]
    pub log_tail: Option<String>,
    /// Its health check failed and the agent ended it: its exit counts as a failure.
    #[serde(default)]
    pub unhealthy: bool,
    /// While `stopping` for `gpuctl stop` or a budget stop: the state it is to be kept in, and
    /// why, so an agent that dies mid-stop finishes it the same way (None: the record goes).
    #[serde(default)]
    pub stopping_to: Option<(WorkerState, String)>,
}

/// The state file and its in-memory copy. Every change goes through [`StateFile::update`].
pub struct StateFile {
    path: PathBuf,
    state: Mutex<AgentState>,
}

impl StateFile {
    pub fn open(dir: &Path) -> Result<StateFile, StoreError> {
        let path = dir.join("state.json");
        let state = match fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| StoreError::Parse { path: path.clone(), source })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => AgentState::default(),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        Ok(StateFile { path, state: Mutex::new(state) })
    }

    pub fn snapshot(&self) -> AgentState {
        self.state.lock().expect("state lock").clone()
    }

    /// Changes the state and writes it out before returning. The in-memory copy changes even
    /// when the write fails (the process state it describes has already changed); the error says
    /// the file is behind.
    pub fn update<R>(&self, f: impl FnOnce(&mut AgentState) -> R) -> Result<R, StoreError> {
        let mut state = self.state.lock().expect("state lock");
        let result = f(&mut state);
        let bytes = serde_json::to_vec_pretty(&*state).expect("state serializes");
        write_atomic(&self.path, &bytes)?;
        Ok(result)
    }
}

/// Replaces `path` with `bytes` atomically: temp file beside it, fsync, rename, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let io = |source| StoreError::Io { path: path.to_path_buf(), source };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    tmp.write_all(bytes).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_persists_and_reopen_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::open(dir.path()).unwrap();
        file.update(|s| s.plan = Some(AppliedPlan { source: "p.toml".into(), text: "version = 1".into() })).unwrap();
        let again = StateFile::open(dir.path()).unwrap();
        assert_eq!(again.snapshot().plan.unwrap().source, "p.toml");
        // No temp files are left behind.
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[test]
    fn corrupt_state_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("state.json"), "{not json").unwrap();
        let err = StateFile::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("state.json") && err.contains("move it aside"), "{err}");
    }
}
