//! A cgroup per worker, holding its `limits` (host memory, CPU, a pids limit): cgroup v2 where it
//! is mounted, v1 (the memory, cpu and pids hierarchies) otherwise. The worker joins its cgroup
//! between fork and exec, so every process it ever starts is inside; stopping it kills the whole
//! cgroup, so no orphan survives. Paths are derived from the worker's name, so an agent that
//! restarts finds the cgroups of the workers it adopts.

use crate::plan::Limits;
use std::fs;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// A pids limit for workers whose model sets none: generous, but a fork bomb stops there.
pub const DEFAULT_PIDS: u64 = 4096;
const CPU_PERIOD_US: u64 = 100_000;

#[derive(Debug, Clone)]
pub enum Hierarchy {
    V2 { root: PathBuf },
    V1 { memory: Option<PathBuf>, cpu: Option<PathBuf>, pids: Option<PathBuf>, devices: Option<PathBuf> },
}

/// The character-device major of `/dev/nvidia<minor>` and `/dev/nvidiactl`.
pub const NVIDIA_MAJOR: u32 = 195;

#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: {source}")]
pub struct CgroupError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// What is mounted under `root` (usually /sys/fs/cgroup), if anything usable.
pub fn detect(root: &Path) -> Option<Hierarchy> {
    if root.join("cgroup.controllers").is_file() {
        return Some(Hierarchy::V2 { root: root.to_path_buf() });
    }
    let v1 = |name: &str| Some(root.join(name)).filter(|p| p.join("cgroup.procs").is_file());
    let (memory, cpu, pids, devices) = (v1("memory"), v1("cpu"), v1("pids"), v1("devices"));
    (memory.is_some() || cpu.is_some() || pids.is_some()).then_some(Hierarchy::V1 { memory, cpu, pids, devices })
}

/// One worker's cgroup: one directory (v2) or one per controller (v1).
#[derive(Debug, Clone)]
pub struct WorkerCgroup {
    pub dirs: Vec<PathBuf>,
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    let err = |source| CgroupError { path: path.to_path_buf(), source };
    fs::OpenOptions::new().write(true).open(path).and_then(|mut f| f.write_all(value.as_bytes())).map_err(err)
}

fn make(dir: &Path) -> Result<(), CgroupError> {
    fs::create_dir_all(dir).map_err(|source| CgroupError { path: dir.to_path_buf(), source })
}

impl WorkerCgroup {
    /// The cgroup of worker `name` under `parent`, without creating anything.
    pub fn at(h: &Hierarchy, parent: &str, name: &str) -> WorkerCgroup {
        let dirs = match h {
            Hierarchy::V2 { root } => vec![root.join(parent).join(name)],
            Hierarchy::V1 { memory, cpu, pids, devices } => {
                [memory, cpu, pids, devices].into_iter().flatten().map(|c| c.join(parent).join(name)).collect()
            }
        };
        WorkerCgroup { dirs }
    }

    /// Creates the cgroup and sets its limits; with the v1 devices controller it also denies the
    /// device nodes of the host's other GPUs (`deny_minors`), so the worker can open only its own
    /// (v2 would need an eBPF device program: not done).
    pub fn create(
        h: &Hierarchy,
        parent: &str,
        name: &str,
        limits: &Limits,
        deny_minors: &[u32],
    ) -> Result<WorkerCgroup, CgroupError> {
        let cg = Self::at(h, parent, name);
        let pids = limits.pids.unwrap_or(DEFAULT_PIDS).to_string();
        let cpu_quota = limits.cpu.map(|c| ((c * CPU_PERIOD_US as f64).round() as u64).max(1000));
        match h {
            Hierarchy::V2 { root } => {
                // Controllers must be enabled for the parent's children.
                let parent_dir = root.join(parent);
                make(&parent_dir)?;
                let _ = write(&root.join("cgroup.subtree_control"), "+memory +cpu +pids");
                let _ = write(&parent_dir.join("cgroup.subtree_control"), "+memory +cpu +pids");
                let dir = &cg.dirs[0];
                make(dir)?;
                if let Some(bytes) = limits.memory {
                    write(&dir.join("memory.max"), &bytes.to_string())?;
                }
                if let Some(q) = cpu_quota {
                    write(&dir.join("cpu.max"), &format!("{q} {CPU_PERIOD_US}"))?;
                }
                write(&dir.join("pids.max"), &pids)?;
            }
            Hierarchy::V1 { memory, cpu, pids: pids_root, devices } => {
                for dir in &cg.dirs {
                    make(dir)?;
                }
                let under = |root: &Option<PathBuf>| root.as_ref().map(|r| r.join(parent).join(name));
                if let (Some(dir), Some(bytes)) = (under(memory), limits.memory) {
                    write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                }
                if let (Some(dir), Some(q)) = (under(cpu), cpu_quota) {
                    write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                    write(&dir.join("cpu.cfs_quota_us"), &q.to_string())?;
                }
                if let Some(dir) = under(pids_root) {
                    write(&dir.join("pids.max"), &pids)?;
                }
                if let Some(dir) = under(devices) {
                    // The default stays "allow": only the other GPUs' nodes are taken away, so
                    // nvidiactl, nvidia-uvm and the rest that CUDA needs stay open.
                    for minor in deny_minors {
                        write(&dir.join("devices.deny"), &format!("c {NVIDIA_MAJOR}:{minor} rwm"))?;
                    }
                }
            }
        }
        Ok(cg)
    }

    /// Each `cgroup.procs`, opened for writing before fork: the child writes "0" to each to join.
    pub fn join_handles(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        self.dirs
            .iter()
            .map(|d| {
                let path = d.join("cgroup.procs");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map(OwnedFd::from)
                    .map_err(|source| CgroupError { path, source })
            })
            .collect()
    }

    /// Live processes in the cgroup.
    pub fn pids(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .dirs
            .iter()
            .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<u32>>())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// SIGKILL to every process in the cgroup.
    pub fn kill_all(&self) {
        for pid in self.pids() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// Removes the cgroup (it must be empty; processes that just died may take a moment).
    pub fn remove(&self) {
        for dir in &self.dirs {
            for _ in 0..50 {
                if fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_written_per_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // A v1 layout with the three hierarchies; files are plain files here.
        for c in ["memory", "cpu", "pids"] {
            fs::create_dir_all(root.join(c)).unwrap();
            fs::write(root.join(c).join("cgroup.procs"), "").unwrap();
        }
        let h = detect(root).unwrap();
        let limits = Limits { memory: Some(64 << 20), cpu: Some(0.5), pids: Some(32) };
        // Plain directories have no control files: create them as the kernel would.
        let cg = WorkerCgroup::at(&h, "ga", "m.0");
        for d in &cg.dirs {
            fs::create_dir_all(d).unwrap();
            for f in ["memory.limit_in_bytes", "cpu.cfs_period_us", "cpu.cfs_quota_us", "pids.max", "cgroup.procs"] {
                fs::write(d.join(f), "").unwrap();
            }
        }
        WorkerCgroup::create(&h, "ga", "m.0", &limits, &[1]).unwrap();
        let read = |c: &str, f: &str| fs::read_to_string(root.join(c).join("ga/m.0").join(f)).unwrap();
        assert_eq!(read("memory", "memory.limit_in_bytes"), "67108864");
        assert_eq!(read("cpu", "cpu.cfs_quota_us"), "50000");
        assert_eq!(read("cpu", "cpu.cfs_period_us"), "100000");
        assert_eq!(read("pids", "pids.max"), "32");
        // v2: one directory.
        let v2 = tempfile::tempdir().unwrap();
        fs::write(v2.path().join("cgroup.controllers"), "memory cpu pids").unwrap();
        let h2 = detect(v2.path()).unwrap();
        let cg2 = WorkerCgroup::at(&h2, "ga", "m.0");
        assert_eq!(cg2.dirs, [v2.path().join("ga/m.0")]);
        assert!(detect(Path::new("/nonexistent")).is_none());
    }
}
