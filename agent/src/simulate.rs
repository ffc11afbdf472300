//! `--simulate`: prepares the simulated host's state file under the state directory and finds the
//! fake `libnvidia-ml.so` that the workspace builds beside the agent binary. From then on the agent
//! runs its ordinary NVML code path against that library.

use gpu_sim::{STATE_ENV, SimHost, SimSpec};
use std::path::{Path, PathBuf};

pub const FAKE_LIBRARY: &str = "libfake_nvml.so";

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("--simulate {spec:?}: {source}")]
    Spec { spec: String, source: gpu_sim::spec::SpecError },
    #[error(transparent)]
    State(#[from] gpu_sim::state::StateError),
    #[error(
        "--simulate: cannot find {FAKE_LIBRARY}; looked in {looked}. Build the workspace (cargo build) or pass --nvml-library"
    )]
    NoLibrary { looked: String },
}

/// The state file of the simulated driver inside the agent's state directory.
pub fn state_path(state_dir: &Path) -> PathBuf {
    state_dir.join("sim").join("nvml.json")
}

/// Creates (or checks) the simulated host and returns the path of its state file.
pub fn prepare(spec_text: &str, state_dir: &Path) -> Result<PathBuf, SimulateError> {
    let spec: SimSpec =
        spec_text.parse().map_err(|source| SimulateError::Spec { spec: spec_text.to_string(), source })?;
    let path = state_path(state_dir);
    SimHost::prepare(&path, &spec)?;
    Ok(path)
}

/// Tells the fake library where the state is. Must run before any other thread exists.
///
/// # Safety
/// The caller guarantees no other thread reads or writes the environment concurrently.
pub unsafe fn export_state_path(path: &Path) {
    // SAFETY: the caller guarantees the process is still single-threaded.
    unsafe { std::env::set_var(STATE_ENV, path) };
}

/// Finds the fake library: beside the binary, or in cargo's `deps/` directory beside it.
pub fn find_library() -> Result<PathBuf, SimulateError> {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let candidates = [dir.join(FAKE_LIBRARY), dir.join("deps").join(FAKE_LIBRARY), dir.join("..").join(FAKE_LIBRARY)];
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| SimulateError::NoLibrary {
        looked: candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
    })
}
