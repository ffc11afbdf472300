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
    #[error("--simulate: MPS control link {path}: {source}")]
    Mps { path: PathBuf, source: std::io::Error },
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

/// The name the real MPS control binary has; the agent answers as the fake one under it.
pub const MPS_CONTROL_NAME: &str = "nvidia-cuda-mps-control";

/// Under --simulate, MPS daemons are the fake control (this very binary, called by the real
/// tool's name through a symlink in the simulated host's directory), their pipe and log
/// directories live under the state directory, and they see the simulated driver's state.
pub fn prepare_mps(settings: &mut crate::settings::Settings, state: &Path) -> Result<(), SimulateError> {
    let dir = state.parent().unwrap_or(Path::new(".")).join("bin");
    let link = dir.join(MPS_CONTROL_NAME);
    let io = |source| SimulateError::Mps { path: link.clone(), source };
    std::fs::create_dir_all(&dir).map_err(io)?;
    let exe = std::env::current_exe().map_err(io)?;
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&exe, &link).map_err(io)?;
    // A control binary given on purpose (a test pointing at a broken one, say) wins over the fake.
    if settings.mps_control == Path::new(MPS_CONTROL_NAME) {
        settings.mps_control = link.clone();
    }
    settings.runtime_dir = state.parent().unwrap_or(Path::new(".")).join("run");
    settings.mps_env = vec![(STATE_ENV.to_string(), state.display().to_string())];
    Ok(())
}

/// Finds the fake library: beside the binary, or in cargo's `deps/` directory beside it (the newest).
pub fn find_library() -> Result<PathBuf, SimulateError> {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let candidates = [dir.join(FAKE_LIBRARY), dir.join("deps").join(FAKE_LIBRARY), dir.join("..").join(FAKE_LIBRARY)];
    // Cargo puts the library in deps/ whenever it builds the agent, and copies it beside the
    // binaries only when fake-nvml itself is built: the newest one is the current one.
    let newest = candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok().filter(|m| m.is_file())?.modified().ok()?, p)))
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p.clone());
    newest.ok_or_else(|| SimulateError::NoLibrary {
        looked: candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
    })
}
