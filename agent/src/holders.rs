//! Who holds a GPU: processes with its device node (or the control node) open. A MIG mode change
//! that needs a reset stays pending while any exist, and naming them is what lets an operator act.

use std::path::{Path, PathBuf};

/// A process holding a GPU's device node open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub name: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.name.as_str() {
            "nvidia-persistenced" => {
                " - the persistence daemon; stop it (systemctl stop nvidia-persistenced) for the change"
            }
            "nv-hostengine" => " - the DCGM host engine",
            _ => "",
        };
        write!(f, "pid {} ({}){what}", self.pid, self.name)
    }
}

/// Processes (other than this one) with `dir/nvidia<gpu>` or `dir/nvidiactl` open. `dir` is `/dev`
/// on a real host and the simulated host's device directory under `--simulate`.
pub fn holders(dir: &Path, gpu: u32) -> Vec<Holder> {
    let targets: Vec<PathBuf> = [format!("nvidia{gpu}"), "nvidiactl".to_string()]
        .iter()
        .map(|n| dir.join(n))
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect();
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let holds = fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| targets.contains(&t)));
        if holds {
            let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default().trim().to_string();
            out.push(Holder { pid, name });
        }
    }
    out.sort_by_key(|h| h.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_process_holding_the_node() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["nvidia0", "nvidia1", "nvidiactl"] {
            std::fs::write(dir.path().join(n), "").unwrap();
        }
        let node = std::fs::File::open(dir.path().join("nvidia1")).unwrap();
        let mut child = std::process::Command::new("/usr/bin/sleep").arg("30").stdin(node).spawn().unwrap();
        let found = holders(dir.path(), 1);
        let none = holders(dir.path(), 0);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found, vec![Holder { pid: child.id(), name: "sleep".into() }]);
        assert!(none.is_empty(), "{none:?}");
    }
}
