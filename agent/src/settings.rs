//! Agent settings: a TOML file (`--config`) with every flag's key, overridden by flags.

use clap::Parser;
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const DEFAULT_SOCKET: &str = "/run/gpu-agent/agent.sock";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpu-agent";

/// Command-line flags of `gpu-agent`. Each can also be set in the settings file.
#[derive(Debug, Parser, Default)]
#[command(name = "gpu-agent", version, about = "Per-host GPU agent: partitions GPUs and supervises model workers")]
pub struct Flags {
    /// Agent settings file (TOML); flags override it
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// gRPC Unix socket [default: /run/gpu-agent/agent.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Durable state directory [default: /var/lib/gpu-agent]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Host plan to apply at start
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,
    /// Simulated GPUs instead of the real driver, e.g. h200:8 or a100-40gb:2,h100-80gb:2
    #[arg(long, value_name = "SPEC")]
    pub simulate: Option<String>,
    /// Serve Prometheus metrics on http://ADDR/metrics
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Also serve gRPC on TCP with mutual TLS
    #[arg(long, value_name = "ADDR")]
    pub tcp_listen: Option<String>,
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Never change a GPU setting (MIG mode or layout, compute mode, time-slice)
    #[arg(long)]
    pub read_only_gpus: bool,
    /// Log format: text or json
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Path of libnvidia-ml.so to load (default: the system's; with --simulate, the fake one
    /// built beside this binary)
    #[arg(long, value_name = "FILE")]
    pub nvml_library: Option<PathBuf>,
    /// MPS control binary [default: nvidia-cuda-mps-control from PATH; with --simulate, the fake]
    #[arg(long, value_name = "FILE")]
    pub mps_control: Option<PathBuf>,
    /// Runtime directory for MPS pipe and log directories [default: /run/gpu-agent]
    #[arg(long, value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,
}

/// The settings file. Unknown keys are an error, so a typo never silently does nothing.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    pub socket: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub plan: Option<PathBuf>,
    pub simulate: Option<String>,
    pub metrics_listen: Option<String>,
    pub tcp_listen: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub read_only_gpus: Option<bool>,
    pub log_format: Option<String>,
    pub nvml_library: Option<PathBuf>,
    /// Let plans run workers as root (off by default).
    pub allow_root_workers: Option<bool>,
    /// Run-as user of models that name none (default "nobody" when the agent runs as root).
    pub default_user: Option<String>,
    /// Group that may use the socket (mode 0660); default: the agent's own group.
    pub socket_group: Option<String>,
    /// Delay of a crashing worker's second restart, doubling up to a minute (default "1s").
    pub restart_backoff: Option<String>,
    /// How long a time-slicing worker may stay above its GPU memory budget before the agent stops
    /// it (default "10s").
    pub memory_grace: Option<String>,
    /// Where cgroup file systems are mounted (default /sys/fs/cgroup); "" turns worker cgroups off.
    pub cgroup_root: Option<PathBuf>,
    /// The group that holds the workers' cgroups (default "gpu-agent").
    pub cgroup_parent: Option<String>,
    pub mps_control: Option<PathBuf>,
    pub runtime_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// What decides which users workers may run as.
#[derive(Debug, Clone)]
pub struct WorkerPolicy {
    pub allow_root: bool,
    pub default_user: Option<String>,
    /// Delay of a crashing worker's second restart, doubling from there (the first is immediate).
    pub restart_backoff: std::time::Duration,
    /// How long a time-slicing worker may stay above its GPU memory budget.
    pub memory_grace: std::time::Duration,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub plan: Option<PathBuf>,
    pub simulate: Option<String>,
    pub metrics_listen: Option<String>,
    pub tcp_listen: Option<String>,
    pub read_only_gpus: bool,
    pub log_format: LogFormat,
    pub nvml_library: Option<PathBuf>,
    pub workers: WorkerPolicy,
    pub socket_group: Option<String>,
    /// Where the GPUs' device nodes are: `/dev`, or the simulated host's device directory.
    pub device_dir: PathBuf,
    /// The MPS control binary (`nvidia-cuda-mps-control`).
    pub mps_control: PathBuf,
    /// Holds one pipe and one log directory per MPS daemon.
    pub runtime_dir: PathBuf,
    /// Extra environment for MPS daemons (the simulated driver's state path under --simulate).
    pub mps_env: Vec<(String, String)>,
    /// Worker cgroups: the hierarchy found under `cgroup_root` and the parent group.
    pub cgroups: Option<(crate::workers::cgroup::Hierarchy, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("settings file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("settings file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("settings: {key}: {message}")]
    Value { key: &'static str, message: String },
    #[error("log format {0:?} is not one of: text, json")]
    LogFormat(String),
    #[error("{what} is not available in this version of gpu-agent; remove it from the flags or settings file")]
    NotYet { what: &'static str },
}

impl Settings {
    pub fn load(flags: Flags) -> Result<Settings, SettingsError> {
        let file = match &flags.config {
            Some(path) => read_file(path)?,
            None => FileSettings::default(),
        };
        let log_format = match flags.log_format.or(file.log_format).as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => return Err(SettingsError::LogFormat(other.to_string())),
        };
        let running_as_root = nix::unistd::geteuid().is_root();
        let memory_grace = match &file.memory_grace {
            None => std::time::Duration::from_secs(10),
            Some(text) => match humantime::parse_duration(text) {
                // The watch looks every 250 ms; a shorter grace would only poll NVML harder.
                Ok(d) if d < std::time::Duration::from_millis(250) => {
                    return Err(SettingsError::Value {
                        key: "memory_grace",
                        message: format!("{text:?}: must be at least 250ms"),
                    });
                }
                Ok(d) => d,
                Err(e) => {
                    return Err(SettingsError::Value { key: "memory_grace", message: format!("{text:?}: {e}") });
                }
            },
        };
        let restart_backoff = match &file.restart_backoff {
            None => crate::workers::restart::BASE,
            Some(text) => humantime::parse_duration(text)
                .map_err(|e| SettingsError::Value { key: "restart_backoff", message: format!("{text:?}: {e}") })?,
        };
        let settings = Settings {
            socket: flags.socket.or(file.socket).unwrap_or_else(|| DEFAULT_SOCKET.into()),
            state_dir: flags.state_dir.or(file.state_dir).unwrap_or_else(|| DEFAULT_STATE_DIR.into()),
            plan: flags.plan.or(file.plan),
            simulate: flags.simulate.or(file.simulate),
            metrics_listen: flags.metrics_listen.or(file.metrics_listen),
            tcp_listen: flags.tcp_listen.or(file.tcp_listen),
            read_only_gpus: flags.read_only_gpus || file.read_only_gpus.unwrap_or(false),
            log_format,
            nvml_library: flags.nvml_library.or(file.nvml_library),
            workers: WorkerPolicy {
                allow_root: file.allow_root_workers.unwrap_or(false),
                default_user: file.default_user.or_else(|| running_as_root.then(|| "nobody".to_string())),
                restart_backoff,
                memory_grace,
            },
            socket_group: file.socket_group,
            device_dir: PathBuf::from("/dev"),
            mps_control: flags.mps_control.or(file.mps_control).unwrap_or_else(|| "nvidia-cuda-mps-control".into()),
            runtime_dir: flags.runtime_dir.or(file.runtime_dir).unwrap_or_else(|| "/run/gpu-agent".into()),
            mps_env: Vec::new(),
            cgroups: None,
        };
        let mut settings = settings;
        let root = file.cgroup_root.clone().unwrap_or_else(|| "/sys/fs/cgroup".into());
        // Cgroups need root; without a usable hierarchy workers run without them (said at start).
        if running_as_root && !root.as_os_str().is_empty() {
            let parent = file.cgroup_parent.clone().unwrap_or_else(|| "gpu-agent".into());
            settings.cgroups = crate::workers::cgroup::detect(&root).map(|h| (h, parent));
        }
        // Refuse rather than silently ignore what this version cannot serve yet.
        if settings.metrics_listen.is_some() {
            return Err(SettingsError::NotYet { what: "--metrics-listen (Prometheus metrics)" });
        }
        if settings.tcp_listen.is_some() || flags.tls_cert.or(file.tls_cert).is_some() {
            return Err(SettingsError::NotYet { what: "--tcp-listen (gRPC over mutual TLS)" });
        }
        Ok(settings)
    }
}

fn read_file(path: &Path) -> Result<FileSettings, SettingsError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| SettingsError::Read { path: path.to_path_buf(), source })?;
    toml::from_str(&text).map_err(|e| SettingsError::Parse { path: path.to_path_buf(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_and_unknown_keys_fail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "socket = \"/tmp/a.sock\"\nstate_dir = \"/tmp/s\"\nread_only_gpus = true\n").unwrap();
        let flags = Flags { config: Some(path.clone()), socket: Some("/tmp/b.sock".into()), ..Flags::default() };
        let s = Settings::load(flags).unwrap();
        assert_eq!(s.socket, PathBuf::from("/tmp/b.sock"));
        assert_eq!(s.state_dir, PathBuf::from("/tmp/s"));
        assert!(s.read_only_gpus);

        std::fs::write(&path, "sokcet = \"/tmp/a.sock\"\n").unwrap();
        let err = Settings::load(Flags { config: Some(path), ..Flags::default() }).unwrap_err().to_string();
        assert!(err.contains("sokcet"), "{err}");
    }

    #[test]
    fn durations_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        for (text, wanted) in [
            ("memory_grace = \"0s\"\n", Some("at least 250ms")),
            ("memory_grace = \"1ns\"\n", Some("at least 250ms")),
            ("memory_grace = \"soon\"\n", Some("memory_grace")),
            ("memory_grace = \"2s\"\n", None),
        ] {
            std::fs::write(&path, text).unwrap();
            let got = Settings::load(Flags { config: Some(path.clone()), ..Flags::default() });
            match wanted {
                Some(needle) => {
                    let err = got.err().unwrap_or_else(|| panic!("{text} was accepted")).to_string();
                    assert!(err.contains(needle), "{text}: {err}");
                }
                None => assert_eq!(got.unwrap().workers.memory_grace, std::time::Duration::from_secs(2)),
            }
        }
    }
}
