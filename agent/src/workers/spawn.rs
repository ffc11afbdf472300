//! The process-spawning seam: starts one worker process (argv, never a shell) in its own session,
//! as its run-as user, with a clean environment and only stdin/stdout/stderr open.

use crate::reconcile::WorkerSpec;
use nix::unistd::{Gid, Uid, User};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("worker {worker}: user {user:?} does not exist")]
    UnknownUser { worker: String, user: String },
    #[error("worker {worker}: cannot look up user {user:?}: {source}")]
    UserLookup { worker: String, user: String, source: nix::Error },
    #[error("worker {worker}: log file {path}: {source}")]
    Log { worker: String, path: PathBuf, source: std::io::Error },
    #[error("worker {worker}: cannot start {program}: {source}")]
    Exec { worker: String, program: String, source: std::io::Error },
}

/// Who the worker runs as, resolved before fork (lookups are not async-signal-safe).
struct Identity {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
    home: PathBuf,
    name: String,
}

/// A started process.
#[derive(Debug, Clone, Copy)]
pub struct Spawned {
    pub pid: u32,
}

/// Environment every worker gets: a fixed PATH and identity variables, the plan's `env`, then
/// the agent's own variables, which the plan cannot override (the parser refuses them).
pub fn worker_env(spec: &WorkerSpec, user: Option<(&str, &Path)>, mps_runtime: &Path) -> Vec<(String, String)> {
    let mut env =
        vec![("PATH".to_string(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string())];
    if let Some((name, home)) = user {
        env.push(("USER".into(), name.into()));
        env.push(("LOGNAME".into(), name.into()));
        env.push(("HOME".into(), home.display().to_string()));
    }
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend([
        ("CUDA_VISIBLE_DEVICES".to_string(), spec.device.clone()),
        ("GPU_AGENT_MODEL".to_string(), spec.key.model.clone()),
        ("GPU_AGENT_REPLICA".to_string(), spec.key.replica.to_string()),
        ("GPU_AGENT_DEVICE".to_string(), spec.device.clone()),
        ("GPU_AGENT_GPU".to_string(), spec.gpu.to_string()),
        ("GPU_AGENT_ISOLATION".to_string(), spec.isolation.clone()),
        ("GPU_AGENT_MEMORY_MIB".to_string(), spec.memory_mib.to_string()),
    ]);
    if let Some(daemon) = &spec.mps_daemon {
        // An MPS client finds its daemon through the same pipe directory; its limits come from
        // its model: `compute` caps its share of SMs, `memory` its pinned device memory (which the
        // CUDA context itself counts against, about 500 MiB on an H200).
        let (pipe, log) = crate::mps::control::dirs(mps_runtime, daemon);
        env.push(("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.display().to_string()));
        env.push(("CUDA_MPS_LOG_DIRECTORY".into(), log.display().to_string()));
        env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), format!("0={}M", spec.memory_mib)));
        if let Some(pct) = spec.compute {
            env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), pct.to_string()));
        }
    }
    env
}

fn resolve_user(worker: &str, name: &str) -> Result<Identity, SpawnError> {
    let user = User::from_name(name)
        .map_err(|source| SpawnError::UserLookup { worker: worker.into(), user: name.into(), source })?
        .ok_or_else(|| SpawnError::UnknownUser { worker: worker.into(), user: name.into() })?;
    let cname = CString::new(name).map_err(|_| SpawnError::UnknownUser { worker: worker.into(), user: name.into() })?;
    let groups = nix::unistd::getgrouplist(&cname, user.gid).map_err(|source| SpawnError::UserLookup {
        worker: worker.into(),
        user: name.into(),
        source,
    })?;
    Ok(Identity { uid: user.uid, gid: user.gid, groups, home: user.dir, name: name.to_string() })
}

/// Starts the worker. `user` is the resolved run-as user name (the spec's, or the agent's
/// default); `None` runs it as the agent's own user. Output is appended to `log_path`.
pub fn spawn(
    spec: &WorkerSpec,
    user: Option<&str>,
    log_path: &Path,
    mps_runtime: &Path,
    cgroup: &[std::os::fd::OwnedFd],
) -> Result<Spawned, SpawnError> {
    use std::os::fd::AsRawFd;
    let cgroup_fds: Vec<i32> = cgroup.iter().map(|fd| fd.as_raw_fd()).collect();
    let worker = spec.key.to_string();
    let identity = user.map(|u| resolve_user(&worker, u)).transpose()?;
    // Switching users needs root; running as ourselves needs no switch at all.
    let switch = identity.as_ref().filter(|id| id.uid != nix::unistd::geteuid());
    let log = open_log(log_path).map_err(|source| SpawnError::Log {
        worker: worker.clone(),
        path: log_path.into(),
        source,
    })?;
    let log2 =
        log.try_clone().map_err(|source| SpawnError::Log { worker: worker.clone(), path: log_path.into(), source })?;
    let workdir = spec
        .working_dir
        .clone()
        .or_else(|| identity.as_ref().map(|id| id.home.clone()))
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| "/".into());
    let workdir_c = CString::new(workdir.as_os_str().as_encoded_bytes()).expect("paths from plans have no NUL");

    let mut cmd = Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env_clear()
        .envs(worker_env(spec, identity.as_ref().map(|id| (id.name.as_str(), id.home.as_path())), mps_runtime))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    let ids = switch.map(|id| (id.uid, id.gid, id.groups.clone()));
    // Runs in the child between fork and exec: only async-signal-safe system calls on data
    // prepared before the fork (no allocation, no locks).
    let in_child = move || -> std::io::Result<()> {
        // Only stdin, stdout and stderr go to the worker: descriptors the agent inherited without
        // close-on-exec would leak into every model otherwise. Marked close-on-exec rather than
        // closed, so std's own pipe still reports a failed exec to the parent.
        // SAFETY: close_range takes two descriptor numbers and flags; it touches no memory.
        if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Join the worker's cgroup first, so everything it ever starts is inside.
        for fd in &cgroup_fds {
            // SAFETY: write(2) of one byte from a static buffer to a descriptor opened before the fork.
            if unsafe { libc::write(*fd, b"0".as_ptr().cast(), 1) } != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        nix::unistd::setsid()?;
        // No setuid binary or file capability can raise a worker's privileges.
        // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integers only.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Some((uid, gid, groups)) = &ids {
            nix::unistd::setgroups(groups)?;
            nix::unistd::setgid(*gid)?;
            nix::unistd::setuid(*uid)?;
        }
        // After dropping privileges, so the directory is entered with the worker's rights.
        nix::unistd::chdir(workdir_c.as_c_str())?;
        Ok(())
    };
    // SAFETY: `in_child` makes only async-signal-safe calls (close_range, write, setsid, prctl,
    // setgroups, setgid, setuid, chdir) and allocates nothing, as code between fork and exec must.
    unsafe {
        cmd.pre_exec(in_child);
    }
    // std reports a failed exec (missing program, no permission, failed setuid) as an error here.
    let child = cmd.spawn().map_err(|source| SpawnError::Exec { worker, program: spec.command[0].clone(), source })?;
    // The child is reaped by the supervisor through waitpid on its pid, not through `Child`.
    Ok(Spawned { pid: child.id() })
}

fn open_log(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).append(true).open(path)
}
