//! The MPS client side of the fake `libcuda`: what a CUDA process does at its first CUDA call
//! when `CUDA_MPS_PIPE_DIRECTORY` names a daemon. It connects to the daemon's `control` socket,
//! waits (possibly while pending) until a server takes it, and keeps the connection for its
//! lifetime; losing it is how a real client learns that its server or daemon is gone.

use crate::env::{ACTIVE_THREAD_PCT_ENV, CONTROL_SOCKET, PINNED_LIMIT_ENV};
use crate::wire::Granted;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

pub use crate::wire::Hello;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing answers on the pipe directory: a real CUDA process then runs without MPS.
    #[error("no MPS control daemon answers at {path}: {source}")]
    NoDaemon { path: PathBuf, source: std::io::Error },
    #[error("MPS control daemon at {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The daemon closed the connection before a server took the client (it quit, or died).
    #[error("MPS control daemon at {path} closed the connection before a server accepted the client")]
    Closed { path: PathBuf },
    #[error("MPS control daemon at {path} refused the client: {why}")]
    Refused { path: PathBuf, why: String },
    #[error("{name}={value:?} is not valid")]
    Env { name: &'static str, value: String },
}

/// How a client's connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// The connection closed: the daemon (and with it the server) is gone.
    Closed,
    /// The server hit a fatal fault; every client of it must exit.
    Fault(String),
    /// `terminate_client` ended this client.
    Terminated,
}

/// A connected MPS client. Dropping it disconnects, as the process exiting would.
#[derive(Debug)]
pub struct Client {
    pub server_pid: u32,
    /// The effective active thread percentage (the daemon's, tightened by the client's own).
    pub active_thread_pct: f64,
    /// The effective pinned memory limit of device 0 in MiB, if any.
    pub pinned_limit_mib: Option<u64>,
    reader: Mutex<BufReader<UnixStream>>,
}

impl Hello {
    /// This process as CUDA would present it: its pid and uid, and the client knobs from the
    /// environment.
    pub fn from_env() -> Result<Hello, Error> {
        let active_thread_pct = match std::env::var(ACTIVE_THREAD_PCT_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                Some(crate::limits::parse_pct(&v).ok_or(Error::Env { name: ACTIVE_THREAD_PCT_ENV, value: v.clone() })?)
            }
            _ => None,
        };
        let pinned_limits = match std::env::var(PINNED_LIMIT_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                crate::limits::device_limit(&v, 0)
                    .map_err(|_| Error::Env { name: PINNED_LIMIT_ENV, value: v.clone() })?;
                Some(v)
            }
            _ => None,
        };
        Ok(Hello { pid: std::process::id(), uid: nix::unistd::geteuid().as_raw(), active_thread_pct, pinned_limits })
    }
}

/// Connects this process, with its environment's knobs. Blocks while the client is pending.
pub fn connect(pipe_dir: &Path) -> Result<Client, Error> {
    connect_with(pipe_dir, &Hello::from_env()?)
}

/// Connects with an explicit identity (tests use it to act as several processes or users).
pub fn connect_with(pipe_dir: &Path, hello: &Hello) -> Result<Client, Error> {
    let path = pipe_dir.join(CONTROL_SOCKET);
    let mut stream = UnixStream::connect(&path).map_err(|source| match source.kind() {
        ErrorKind::NotFound | ErrorKind::ConnectionRefused => Error::NoDaemon { path: path.clone(), source },
        _ => Error::Io { path: path.clone(), source },
    })?;
    let io = |source| Error::Io { path: path.clone(), source };
    stream.write_all(hello.to_line().as_bytes()).map_err(io)?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => return Err(Error::Closed { path }),
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => return Err(Error::Closed { path }),
        Err(e) => return Err(io(e)),
    }
    if let Some(why) = line.strip_prefix("ERR ") {
        return Err(Error::Refused { path, why: why.trim().to_string() });
    }
    let granted = Granted::parse(&line).ok_or_else(|| Error::Refused { path, why: format!("bad answer {line:?}") })?;
    Ok(Client {
        server_pid: granted.server_pid,
        active_thread_pct: granted.active_thread_pct,
        pinned_limit_mib: granted.pinned_limit_mib,
        reader: Mutex::new(reader),
    })
}

impl Client {
    /// Blocks until the connection is lost and says how.
    pub fn wait_fault(&self) -> Lost {
        loop {
            if let Some(lost) = self.poll_lost(None) {
                return lost;
            }
        }
    }

    /// Like [`Client::wait_fault`], but gives up after `timeout` (then `None`: still connected).
    pub fn wait_fault_timeout(&self, timeout: Duration) -> Option<Lost> {
        self.poll_lost(Some(timeout.max(Duration::from_millis(1))))
    }

    fn poll_lost(&self, timeout: Option<Duration>) -> Option<Lost> {
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        if reader.get_ref().set_read_timeout(timeout).is_err() {
            return Some(Lost::Closed);
        }
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => Some(Lost::Closed),
            Ok(_) if line.trim() == "TERMINATE" => Some(Lost::Terminated),
            // Anything but FAULT is noise from a newer daemon: still connected.
            Ok(_) => line.trim().strip_prefix("FAULT").map(|why| Lost::Fault(why.trim().to_string())),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
            Err(e) if e.kind() == ErrorKind::Interrupted => None,
            Err(_) => Some(Lost::Closed),
        }
    }
}
