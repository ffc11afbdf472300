//! The environment the real tool reads, with its defaults. The daemon, its command interface
//! and its clients must agree on these, exactly as with NVIDIA's binaries.

use std::path::PathBuf;

pub const PIPE_DIR_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
pub const LOG_DIR_ENV: &str = "CUDA_MPS_LOG_DIRECTORY";
pub const VISIBLE_DEVICES_ENV: &str = "CUDA_VISIBLE_DEVICES";
pub const ACTIVE_THREAD_PCT_ENV: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
pub const PINNED_LIMIT_ENV: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// Test-only (not in the real tool): milliseconds a new server stays INITIALIZING.
pub const SERVER_START_MS_ENV: &str = "FAKE_MPS_SERVER_START_MS";

pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
pub const DEFAULT_LOG_DIR: &str = "/var/log/nvidia-mps";

/// Files in the pipe directory, named as the real daemon names them.
pub const CONTROL_SOCKET: &str = "control";
pub const PRIVILEGED_SOCKET: &str = "control_privileged";
pub const LOCK_FILE: &str = "control_lock";
pub const LOG_FIFO: &str = "log";
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

#[derive(Debug, Clone)]
pub struct Config {
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
    /// The daemon's `CUDA_VISIBLE_DEVICES` (first entry), if any.
    pub device: Option<String>,
    /// `GPU_SIM_STATE`: the simulated NVML state the daemon registers its servers in.
    pub sim_state: Option<PathBuf>,
}

impl Config {
    pub fn from_env() -> Config {
        let path = |name: &str, default: &str| {
            std::env::var_os(name).filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        let device = std::env::var(VISIBLE_DEVICES_ENV)
            .ok()
            .and_then(|v| v.split(',').next().map(|d| d.trim().to_string()))
            .filter(|d| !d.is_empty());
        Config {
            pipe_dir: path(PIPE_DIR_ENV, DEFAULT_PIPE_DIR),
            log_dir: path(LOG_DIR_ENV, DEFAULT_LOG_DIR),
            device,
            sim_state: std::env::var_os(gpu_sim::state::STATE_ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
        }
    }
}
