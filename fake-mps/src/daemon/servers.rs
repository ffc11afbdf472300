//! Server processes: starting one (the daemon's own binary with [`SERVER_ARG`]), registering it in
//! the simulated NVML state as the real `nvidia-cuda-mps-server` appears there (66 MiB, not an
//! MPS client), and one watcher thread per server that marks it ready and reaps it.

use super::state::{Server, Settings, Shared, Status};
use crate::server::SERVER_ARG;
use gpu_sim::SimProcess;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

/// Memory the real server held on the H200 probe.
const SERVER_USED_MIB: u64 = 66;

/// Spawns a server for `uid` with the daemon's current defaults; it is INITIALIZING until its
/// process says `ready`.
pub fn start(shared: &Arc<Shared>, uid: u32, defaults: &Settings) -> std::io::Result<Server> {
    let switch = nix::unistd::geteuid().is_root() && uid != 0;
    // As the real daemon: the server runs as its clients' user (only root can switch). Should
    // that user be unable to run this binary (a private build tree), run it as the daemon's.
    let spawned = if switch {
        let gid = nix::unistd::User::from_uid(uid.into()).ok().flatten().map_or(uid, |u| u.gid.as_raw());
        server_command(shared).uid(uid).gid(gid).spawn()
    } else {
        server_command(shared).spawn()
    };
    let mut child = match spawned {
        Err(e) if switch && e.kind() == std::io::ErrorKind::PermissionDenied => {
            shared.log(&format!("Server for user {uid} cannot run as that user ({e}): running it as the daemon's"));
            server_command(shared).spawn()?
        }
        other => other?,
    };
    let pid = child.id();
    // The real daemon logs this line under the new server's pid.
    shared.control_log.line(pid, &format!("Starting new server {pid} for user {uid}"));
    if let Some(state) = &shared.config.sim_state {
        let process = SimProcess { pid, used_mib: SERVER_USED_MIB, gpu_instance_id: None, mps_client: false };
        if let Err(e) = crate::sim::register(state, shared.config.device.as_deref(), process) {
            shared.log(&format!("Server {pid}: not registered in the simulated driver: {e}"));
        }
    }
    let stdin = child.stdin.take();
    let me = Arc::clone(shared);
    std::thread::spawn(move || watch(me, child));
    Ok(Server { pid, uid, status: Status::Initializing, settings: defaults.clone(), clients: Vec::new(), stdin })
}

/// This binary as a server, its stdin the pipe that keeps it alive, its stdout for `ready`.
fn server_command(shared: &Shared) -> Command {
    let mut cmd = Command::new(super::self_exe());
    cmd.arg0(&shared.arg0)
        .arg(SERVER_ARG)
        .env_remove(super::READY_FD_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd
}

/// Waits for the server's `ready`, then for its exit.
fn watch(shared: Arc<Shared>, mut child: Child) {
    let pid = child.id();
    if let Some(out) = child.stdout.take() {
        let mut line = String::new();
        if BufReader::new(out).read_line(&mut line).is_ok() && line.trim() == "ready" {
            shared.lock().server_ready(&shared, pid);
        }
    }
    let status = match child.wait() {
        Ok(s) => s.code().map_or_else(|| format!("{s}"), |c| c.to_string()),
        Err(e) => e.to_string(),
    };
    if let Some(state) = &shared.config.sim_state {
        let _ = crate::sim::unregister(state, pid);
    }
    shared.lock().server_exited(&shared, pid, &status);
}
