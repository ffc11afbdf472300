//! The pipe directory as the real daemon lays it out (modes from the probe's `ls -l`):
//! `control` (socket, 0666), `control_privileged` (socket, 0755), `control_lock` (0666), `log`
//! (fifo, 0777) and `nvidia-cuda-mps-control.pid` (0666, the pid without a newline).
//! An exclusive `flock` on `control_lock` is what makes a second daemon on the same directory
//! fail; stale sockets from a daemon that died are replaced.

use crate::env::{CONTROL_SOCKET, Config, LOCK_FILE, LOG_FIFO, PID_FILE, PRIVILEGED_SOCKET};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::stat::Mode;
use std::fs::{self, File, OpenOptions, Permissions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("An MPS control daemon is already running with pipe directory {0}")]
    AlreadyRunning(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The daemon's hold on its pipe directory; dropping `lock` lets another daemon start.
pub struct PipeDir {
    pub lock: Flock<File>,
    pub control: UnixListener,
    pub privileged: UnixListener,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SetupError + '_ {
    move |source| SetupError::Io { path: path.to_path_buf(), source }
}

pub fn setup(config: &Config, pid: u32) -> Result<PipeDir, SetupError> {
    let dir = &config.pipe_dir;
    fs::create_dir_all(dir).map_err(io(dir))?;
    fs::create_dir_all(&config.log_dir).map_err(io(&config.log_dir))?;
    let lock_path = dir.join(LOCK_FILE);
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o666)
        .open(&lock_path)
        .map_err(io(&lock_path))?;
    chmod(&lock_path, 0o666)?;
    let lock = match Flock::lock(lock_file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, Errno::EWOULDBLOCK)) => return Err(SetupError::AlreadyRunning(dir.clone())),
        Err((_, errno)) => return Err(SetupError::Io { path: lock_path, source: errno.into() }),
    };
    let control = listen(&dir.join(CONTROL_SOCKET), 0o666)?;
    let privileged = listen(&dir.join(PRIVILEGED_SOCKET), 0o755)?;
    let fifo = dir.join(LOG_FIFO);
    let _ = fs::remove_file(&fifo);
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o777)).map_err(|e| io(&fifo)(e.into()))?;
    chmod(&fifo, 0o777)?;
    let pid_path = dir.join(PID_FILE);
    fs::write(&pid_path, pid.to_string()).map_err(io(&pid_path))?;
    chmod(&pid_path, 0o666)?;
    Ok(PipeDir { lock, control, privileged })
}

/// What `quit` removes: the real daemon leaves `control`, `control_lock` and
/// `control_privileged` behind (probe).
pub fn remove_on_quit(config: &Config) {
    for name in [PID_FILE, LOG_FIFO] {
        let _ = fs::remove_file(config.pipe_dir.join(name));
    }
}

fn listen(path: &Path, mode: u32) -> Result<UnixListener, SetupError> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path)(e)),
    }
    let listener = UnixListener::bind(path).map_err(io(path))?;
    chmod(path, mode)?;
    Ok(listener)
}

fn chmod(path: &Path, mode: u32) -> Result<(), SetupError> {
    fs::set_permissions(path, Permissions::from_mode(mode)).map_err(io(path))
}
