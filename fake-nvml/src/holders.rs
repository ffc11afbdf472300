//! Which processes hold a GPU open, as the driver sees it before a reset: those with an open
//! file descriptor on the simulated device node of that GPU (`<state dir>/dev/nvidia<i>`) or on
//! the control node (`nvidiactl`), which stand in for `/dev/nvidia*` (see
//! `gpu_sim::state::device_dir`).

use gpu_sim::state::device_dir;
use std::fs;
use std::path::{Path, PathBuf};

/// The device nodes that hold GPU `gpu`, canonical; a node that does not exist (a state made
/// without `SimHost::prepare`) cannot be held and is left out.
fn nodes(state_path: &Path, gpu: u32) -> Vec<PathBuf> {
    let dir = device_dir(state_path);
    [dir.join("nvidiactl"), dir.join(format!("nvidia{gpu}"))].iter().filter_map(|p| p.canonicalize().ok()).collect()
}

/// Whether process `pid` has one of `nodes` open. A process whose descriptors we may not read
/// (another user's, or one that just exited) is taken not to.
fn holds(pid: u32, nodes: &[PathBuf]) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| fs::read_link(fd.path()).is_ok_and(|target| nodes.contains(&target)))
}

/// The pids, other than this process's, that hold GPU `gpu` of the host in `state_path`.
pub fn holders(state_path: &Path, gpu: u32) -> Vec<u32> {
    let nodes = nodes(state_path, gpu);
    if nodes.is_empty() {
        return Vec::new();
    }
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut pids: Vec<u32> = procs
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && holds(pid, &nodes))
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_sim::SimHost;
    use std::fs::File;
    use std::process::{Command, Stdio};

    #[test]
    fn a_child_holding_a_node_holds_that_gpu_only() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("sim/nvml.json");
        SimHost::prepare(&state, &"a30:2".parse().unwrap()).unwrap();
        assert_eq!(holders(&state, 0), Vec::<u32>::new());

        let node = File::open(device_dir(&state).join("nvidia1")).unwrap();
        // This process holds it too, but does not count.
        assert_eq!(holders(&state, 1), Vec::<u32>::new());
        let mut child = Command::new("sleep").arg("30").stdin(Stdio::from(node)).spawn().unwrap();
        let pid = child.id();
        assert_eq!(holders(&state, 1), vec![pid]);
        assert_eq!(holders(&state, 0), Vec::<u32>::new(), "nvidia1 does not hold GPU 0");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(holders(&state, 1), Vec::<u32>::new());

        let ctl = File::open(device_dir(&state).join("nvidiactl")).unwrap();
        let mut child = Command::new("sleep").arg("30").stdin(Stdio::from(ctl)).spawn().unwrap();
        let pid = child.id();
        assert_eq!((holders(&state, 0), holders(&state, 1)), (vec![pid], vec![pid]), "nvidiactl holds every GPU");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn no_device_nodes_no_holders() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(holders(&dir.path().join("nvml.json"), 0), Vec::<u32>::new());
    }
}
