//! The simulated host's durable state: one JSON file that the fake NVML library reads and writes,
//! so a restarted agent finds the same GPUs, UUIDs and MIG layout, as it would on real hardware.
//!
//! Every access takes an exclusive `flock` on a sidecar lock file (the state file itself is
//! replaced by rename on each write, so it cannot carry the lock).

use crate::products::{self, Product};
use crate::spec::SimSpec;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Environment variable through which the fake NVML library finds the state file.
pub const STATE_ENV: &str = "GPU_SIM_STATE";

/// Driver version the simulated host reports (the one our H200 probe ran).
pub const DRIVER_VERSION: &str = "580.159.04";
pub const NVML_VERSION: &str = "13.580.159.04";
pub const CUDA_DRIVER_VERSION: i32 = 13000;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("simulated driver state {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("simulated driver state {path}: not valid JSON: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error(
        "simulated driver state {path} holds a host of {found}, not {wanted}: use another state directory or remove that file"
    )]
    SpecMismatch { path: PathBuf, found: String, wanted: String },
    #[error("simulated driver state {path}: GPU {index} has unknown product {product:?}")]
    UnknownProduct { path: PathBuf, index: u32, product: String },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SimHost {
    pub spec: String,
    pub gpus: Vec<SimGpu>,
    /// Calls told to fail, so tests can reach every error path of the agent.
    #[serde(default)]
    pub faults: Vec<Fault>,
}

/// Makes a named NVML call fail: after `after` matching calls have succeeded, the next `times`
/// matching calls return `code` (an `nvmlReturn_t`). `seen` counts matching calls so far.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Fault {
    /// The exported function's name, e.g. `nvmlDeviceCreateGpuInstanceWithPlacement`.
    pub call: String,
    /// Only calls about this GPU index; None: any GPU.
    #[serde(default)]
    pub gpu: Option<u32>,
    #[serde(default)]
    pub after: u64,
    #[serde(default = "one")]
    pub times: u64,
    pub code: u32,
    #[serde(default)]
    pub seen: u64,
}

fn one() -> u64 {
    1
}

impl Fault {
    /// Counts one matching call and says whether it must fail (and with which code).
    pub fn hit(&mut self) -> Option<u32> {
        self.seen += 1;
        (self.seen > self.after && self.seen <= self.after + self.times).then_some(self.code)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SimGpu {
    pub index: u32,
    pub product: String,
    pub uuid: String,
    pub bus_id: String,
    pub mig_current: bool,
    pub mig_pending: bool,
    /// `nvmlComputeMode_t`: 0 default, 1 exclusive thread, 2 prohibited, 3 exclusive process.
    pub compute_mode: u32,
    pub persistence: bool,
    #[serde(default)]
    pub instances: Vec<SimGpuInstance>,
    /// Processes that claim GPU memory on this GPU (test workers register here).
    #[serde(default)]
    pub processes: Vec<SimProcess>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SimGpuInstance {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    /// UUID of the MIG device of this instance's (single, full-width) compute instance.
    pub mig_uuid: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SimProcess {
    pub pid: u32,
    pub used_mib: u64,
    #[serde(default)]
    pub gpu_instance_id: Option<u32>,
    #[serde(default)]
    pub mps_client: bool,
}

fn new_uuid(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4())
}

impl SimHost {
    /// A fresh host for `spec`: MIG off, default compute mode, persistence on, new UUIDs.
    pub fn new(spec: &SimSpec) -> Self {
        let gpus = spec
            .gpus()
            .enumerate()
            .map(|(i, product)| SimGpu {
                index: i as u32,
                product: product.key.to_string(),
                uuid: new_uuid("GPU"),
                // Bus ids as on an 8-GPU HGX board: one bus per GPU.
                bus_id: format!("00000000:{:02X}:00.0", 0x18 + i * 0x10),
                mig_current: false,
                mig_pending: false,
                compute_mode: 0,
                persistence: true,
                instances: Vec::new(),
                processes: Vec::new(),
            })
            .collect();
        SimHost { spec: spec.to_string(), gpus, faults: Vec::new() }
    }

    /// Counts a call against the faults that match it; the first that fires gives the error code.
    pub fn fault(&mut self, call: &str, gpu: Option<u32>) -> Option<u32> {
        let mut fired = None;
        for f in self.faults.iter_mut().filter(|f| f.call == call && (f.gpu.is_none() || f.gpu == gpu)) {
            if let Some(code) = f.hit() {
                fired = fired.or(Some(code));
            }
        }
        fired
    }

    /// Loads the host at `path`, or creates it for `spec` when the file does not exist yet.
    /// A file made for another spec is an error: the caller must not silently swap GPUs.
    pub fn prepare(path: &Path, spec: &SimSpec) -> Result<SimHost, StateError> {
        let _lock = lock(path)?;
        match Self::read(path) {
            Ok(host) => {
                make_device_nodes(path, host.gpus.len())
                    .map_err(|source| StateError::Io { path: device_dir(path), source })?;
                if host.spec != spec.to_string() {
                    return Err(StateError::SpecMismatch {
                        path: path.to_path_buf(),
                        found: host.spec,
                        wanted: spec.to_string(),
                    });
                }
                Ok(host)
            }
            Err(StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let host = SimHost::new(spec);
                host.write(path)?;
                make_device_nodes(path, host.gpus.len())
                    .map_err(|source| StateError::Io { path: device_dir(path), source })?;
                Ok(host)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads the state under its lock.
    pub fn load(path: &Path) -> Result<SimHost, StateError> {
        let _lock = lock(path)?;
        Self::read(path)
    }

    /// Reads, changes and writes back the state under one lock; nothing is written when `f` fails.
    pub fn update<R, E>(path: &Path, f: impl FnOnce(&mut SimHost) -> Result<R, E>) -> Result<Result<R, E>, StateError> {
        let _lock = lock(path)?;
        let mut host = Self::read(path)?;
        let result = f(&mut host);
        if result.is_ok() {
            host.write(path)?;
        }
        Ok(result)
    }

    fn read(path: &Path) -> Result<SimHost, StateError> {
        let io = |source| StateError::Io { path: path.to_path_buf(), source };
        let text = fs::read_to_string(path).map_err(io)?;
        let host: SimHost =
            serde_json::from_str(&text).map_err(|source| StateError::Parse { path: path.to_path_buf(), source })?;
        for gpu in &host.gpus {
            if products::find(&gpu.product).is_none() {
                return Err(StateError::UnknownProduct {
                    path: path.to_path_buf(),
                    index: gpu.index,
                    product: gpu.product.clone(),
                });
            }
        }
        Ok(host)
    }

    /// Atomic write: temp file in the same directory, fsync, rename.
    fn write(&self, path: &Path) -> Result<(), StateError> {
        let io = |source| StateError::Io { path: path.to_path_buf(), source };
        let tmp = path.with_extension("json.tmp");
        let mut file = File::create(&tmp).map_err(io)?;
        // Any process may be a (simulated) CUDA process and report its GPU memory here, whatever
        // user a worker runs as: the file is world-writable, as is its directory.
        file.set_permissions(fs::Permissions::from_mode(0o666)).map_err(io)?;
        let text = serde_json::to_vec_pretty(self).expect("state serializes");
        file.write_all(&text).map_err(io)?;
        file.sync_all().map_err(io)?;
        fs::rename(&tmp, path).map_err(io)
    }
}

impl SimGpu {
    /// The product row of this GPU (checked when the state was read).
    pub fn product(&self) -> &'static Product {
        products::find(&self.product).expect("product checked on load")
    }
}

/// Directory of the simulated host's device nodes (`nvidiactl`, `nvidia0`, ...): plain files that
/// stand in for `/dev/nvidia*`. A process that holds one open holds that GPU, as on a real host
/// (an Ampere MIG mode change then stays pending).
pub fn device_dir(state_path: &Path) -> PathBuf {
    state_path.parent().unwrap_or(Path::new(".")).join("dev")
}

fn make_device_nodes(state_path: &Path, gpus: usize) -> std::io::Result<()> {
    let dir = device_dir(state_path);
    fs::create_dir_all(&dir)?;
    for name in std::iter::once("nvidiactl".to_string()).chain((0..gpus).map(|i| format!("nvidia{i}"))) {
        OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(name))?;
    }
    Ok(())
}

/// Holds the exclusive lock on `<state>.lock` for as long as it lives.
pub struct StateLock(#[allow(dead_code)] Flock<File>);

fn lock(path: &Path) -> Result<StateLock, StateError> {
    let lock_path = path.with_extension("lock");
    let io = |source| StateError::Io { path: lock_path.clone(), source };
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        fs::create_dir_all(dir).map_err(io)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).map_err(io)?;
    }
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(io)?;
    if file.metadata().map(|m| m.uid()).ok() == Some(nix::unistd::geteuid().as_raw()) {
        file.set_permissions(fs::Permissions::from_mode(0o666)).map_err(io)?;
    }
    let locked = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| io(errno.into()))?;
    Ok(StateLock(locked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_creates_then_keeps_uuids_and_refuses_other_spec() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim/nvml.json");
        let spec: SimSpec = "h200:2".parse().unwrap();
        let first = SimHost::prepare(&path, &spec).unwrap();
        assert_eq!(first.gpus.len(), 2);
        assert!(first.gpus[0].uuid.starts_with("GPU-"));
        let again = SimHost::prepare(&path, &spec).unwrap();
        assert_eq!(first, again);
        let other: SimSpec = "a30:1".parse().unwrap();
        let err = SimHost::prepare(&path, &other).unwrap_err().to_string();
        assert!(err.contains("holds a host of h200:2, not a30:1"), "{err}");
    }

    #[test]
    fn faults_fire_after_and_for_times() {
        let mut host = SimHost::new(&"h200:2".parse().unwrap());
        host.faults.push(Fault { call: "create".into(), gpu: Some(1), after: 2, times: 2, code: 7, seen: 0 });
        let got: Vec<Option<u32>> = (0..6).map(|_| host.fault("create", Some(1))).collect();
        assert_eq!(got, [None, None, Some(7), Some(7), None, None]);
        assert_eq!(host.fault("create", Some(0)), None, "other GPU");
        assert_eq!(host.fault("destroy", Some(1)), None, "other call");
    }

    #[test]
    fn device_nodes_are_made() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim/nvml.json");
        SimHost::prepare(&path, &"a30:2".parse().unwrap()).unwrap();
        for name in ["nvidiactl", "nvidia0", "nvidia1"] {
            assert!(device_dir(&path).join(name).is_file(), "{name}");
        }
    }

    #[test]
    fn update_writes_only_on_success() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvml.json");
        SimHost::prepare(&path, &"a30:1".parse().unwrap()).unwrap();
        let failed: Result<(), &str> = SimHost::update(&path, |h| {
            h.gpus[0].mig_current = true;
            Err("no")
        })
        .unwrap();
        assert!(failed.is_err());
        assert!(!SimHost::load(&path).unwrap().gpus[0].mig_current);
        SimHost::update(&path, |h| {
            h.gpus[0].mig_current = true;
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
        assert!(SimHost::load(&path).unwrap().gpus[0].mig_current);
    }
}
