//! What the daemon knows: its defaults, its one server and that server's clients, and the clients
//! waiting for a server (pending). Every change happens under one mutex, and every change that
//! can free the GPU for a waiting client ends in [`State::schedule`], the one place that decides
//! which server runs next.
//!
//! Sharing rules, as NVIDIA documents them: one server at a time, running for the uid of its first
//! client; clients of another uid wait until the current server has no clients, then that server
//! is stopped and one for the next uid starts. A server copies the daemon's defaults when it starts.

use super::servers;
use crate::env::Config;
use crate::limits::MemLimit;
use crate::logfile::LogFile;
use crate::wire::{Granted, Hello, TERMINATE_LINE, fault_line};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::process::ChildStdin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Everything the daemon's threads share.
pub struct Shared {
    pub config: Config,
    pub pid: u32,
    pub control_log: LogFile,
    pub server_log: LogFile,
    /// The DEVICE column of `ps`.
    pub device_label: String,
    /// How to re-execute this binary as a server (`argv[0]` as this process got it).
    pub arg0: std::ffi::OsString,
    pub state: Mutex<State>,
    /// Signalled whenever a server exits (shutdown waits on it).
    pub server_gone: Condvar,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn log(&self, message: &str) {
        self.control_log.line(self.pid, message);
    }
}

/// Knobs a server copies from the daemon's defaults when it starts.
#[derive(Debug, Clone)]
pub struct Settings {
    pub active_thread_pct: f64,
    pub pinned: BTreeMap<u32, MemLimit>,
    pub client_priority: u8,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { active_thread_pct: 100.0, pinned: BTreeMap::new(), client_priority: 0 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Initializing,
    Active,
    Fault,
    /// Told to exit (to make room for another uid, or on quit); gone once its process is reaped.
    Stopping,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Initializing => "INITIALIZING",
            Status::Active | Status::Stopping => "ACTIVE",
            Status::Fault => "FAULT",
        }
    }
}

/// One client connection (attached or pending).
pub struct Conn {
    pub id: u64,
    pub hello: Hello,
    pub stream: UnixStream,
}

impl Conn {
    /// Sends a last line and half-closes: the client reads the line, then end of file. The
    /// record stays until the client closes its end, as a real client stays until it exits.
    fn tell_and_close(&self, line: &str) {
        let _ = (&self.stream).write_all(line.as_bytes());
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

pub struct Server {
    pub pid: u32,
    pub uid: u32,
    pub status: Status,
    pub settings: Settings,
    pub clients: Vec<Conn>,
    /// The server lives while this pipe is open; dropping it stops the server.
    pub stdin: Option<ChildStdin>,
}

#[derive(Default)]
pub struct State {
    pub defaults: Settings,
    pub server: Option<Server>,
    pub pending: Vec<Conn>,
    /// `start_server -uid U` asked for while another uid's server runs.
    pub wanted_uid: Option<u32>,
    pub shutting_down: bool,
    next_conn: u64,
}

impl State {
    /// A client said hello: attach it now if its uid's server is ready, else park it.
    pub fn add_client(&mut self, shared: &Arc<Shared>, hello: Hello, stream: UnixStream) -> u64 {
        self.next_conn += 1;
        let conn = Conn { id: self.next_conn, hello, stream };
        let (pid, uid) = (conn.hello.pid, conn.hello.uid);
        match &mut self.server {
            Some(s) if s.uid == uid && s.status == Status::Active => {
                shared.log(&format!("NEW CLIENT {pid} from user {uid}: Server already exists"));
                attach(shared, s, conn);
            }
            Some(s) if s.uid != uid => {
                // Wording unverified: the probe only saw one user.
                shared.log(&format!(
                    "NEW CLIENT {pid} from user {uid}: Server {} of user {} is running, push client to pending list",
                    s.pid, s.uid
                ));
                self.pending.push(conn);
            }
            _ => {
                shared.log(&format!(
                    "NEW CLIENT {pid} from user {uid}: Server is not ready, push client to pending list"
                ));
                self.pending.push(conn);
            }
        }
        let id = self.next_conn;
        self.schedule(shared);
        id
    }

    /// A client connection ended (the process exited or closed it).
    pub fn remove_client(&mut self, shared: &Arc<Shared>, id: u64) {
        self.pending.retain(|c| c.id != id);
        if let Some(s) = &mut self.server
            && let Some(i) = s.clients.iter().position(|c| c.id == id)
        {
            let conn = s.clients.remove(i);
            let pid = conn.hello.pid;
            shared.server_log.line(s.pid, &format!("Client process {pid} disconnected"));
            if s.status == Status::Fault && s.clients.is_empty() {
                s.status = Status::Active;
                shared.log(&format!("Server {} recovered from the fault: ACTIVE", s.pid));
            }
        }
        self.schedule(shared);
    }

    /// Starts, stops or hands out the server so that waiting clients get served.
    pub fn schedule(&mut self, shared: &Arc<Shared>) {
        if self.shutting_down {
            return;
        }
        let Some(server) = &mut self.server else {
            let Some(uid) = self.pending.first().map(|c| c.hello.uid).or(self.wanted_uid.take()) else {
                return;
            };
            match servers::start(shared, uid, &self.defaults) {
                Ok(server) => self.server = Some(server),
                Err(e) => {
                    shared.log(&format!("Failed to start server for user {uid}: {e}"));
                    let (refused, rest) =
                        std::mem::take(&mut self.pending).into_iter().partition(|c| c.hello.uid == uid);
                    self.pending = rest;
                    for conn in refused {
                        conn.tell_and_close(&format!("ERR cannot start MPS server: {e}\n"));
                    }
                    self.schedule(shared);
                }
            }
            return;
        };
        if server.status != Status::Active {
            return;
        }
        if self.wanted_uid == Some(server.uid) {
            self.wanted_uid = None;
        }
        let (mine, others): (Vec<Conn>, Vec<Conn>) =
            std::mem::take(&mut self.pending).into_iter().partition(|c| c.hello.uid == server.uid);
        self.pending = others;
        for conn in mine {
            attach(shared, server, conn);
        }
        let someone_else_waits = !self.pending.is_empty() || self.wanted_uid.is_some();
        if server.clients.is_empty() && someone_else_waits {
            shared.log(&format!("Server {} has no clients left and another user waits: stopping it", server.pid));
            server.status = Status::Stopping;
            server.stdin = None;
        }
    }

    /// The server is ready (its process said so).
    pub fn server_ready(&mut self, shared: &Arc<Shared>, pid: u32) {
        if let Some(s) = &mut self.server
            && s.pid == pid
            && s.status == Status::Initializing
        {
            s.status = Status::Active;
            shared.log(&format!("NEW SERVER {pid}: Ready"));
            self.schedule(shared);
        }
    }

    /// The server's process exited. Clients of a server that died unasked lose it as on a fault.
    pub fn server_exited(&mut self, shared: &Arc<Shared>, pid: u32, status: &str) {
        shared.log(&format!("Server {pid} exited with status {status}"));
        if self.server.as_ref().is_some_and(|s| s.pid == pid) {
            let server = self.server.take().expect("checked");
            for conn in &server.clients {
                conn.tell_and_close(&fault_line(&format!("MPS server {pid} exited")));
            }
        }
        shared.server_gone.notify_all();
        self.schedule(shared);
    }

    /// Test-only `fake_fault`: every client is told to exit; the server is back to ACTIVE once
    /// they are gone (at once when it has none).
    pub fn fault(&mut self, shared: &Arc<Shared>, pid: u32) -> bool {
        let Some(s) = self.server.as_mut().filter(|s| s.pid == pid && s.status != Status::Stopping) else {
            return false;
        };
        shared.server_log.line(pid, "Server encountered a fatal exception (fake_fault)");
        for conn in &s.clients {
            conn.tell_and_close(&fault_line(&format!("fatal exception on MPS server {pid}")));
        }
        s.status = if s.clients.is_empty() { Status::Active } else { Status::Fault };
        true
    }

    /// `terminate_client`: tells every connection of that client pid to exit.
    pub fn terminate(&mut self, server: u32, client: u32) -> bool {
        let Some(s) = self.server.as_ref().filter(|s| s.pid == server) else {
            return false;
        };
        let mut found = false;
        for conn in s.clients.iter().filter(|c| c.hello.pid == client) {
            conn.tell_and_close(TERMINATE_LINE);
            found = true;
        }
        found
    }

    /// The server with this pid, if it is the daemon's.
    pub fn server_mut(&mut self, pid: u32) -> Option<&mut Server> {
        self.server.as_mut().filter(|s| s.pid == pid)
    }

    /// Closes every client connection and stops the server (quit, SIGTERM).
    pub fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        for conn in self.pending.drain(..) {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        if let Some(s) = &mut self.server {
            for conn in s.clients.drain(..) {
                let _ = conn.stream.shutdown(Shutdown::Both);
            }
            s.status = Status::Stopping;
            s.stdin = None;
        }
    }
}

/// Gives `conn` to `server`: the client's effective limits, then the OK line.
fn attach(shared: &Shared, server: &mut Server, conn: Conn) {
    let hello = &conn.hello;
    let pct =
        hello.active_thread_pct.map_or(server.settings.active_thread_pct, |p| p.min(server.settings.active_thread_pct));
    let own = hello.pinned_limits.as_deref().and_then(|l| crate::limits::device_limit(l, 0).ok().flatten());
    let limit = own.or_else(|| server.settings.pinned.get(&0).cloned()).map(|l| l.mib);
    let granted = Granted { server_pid: server.pid, active_thread_pct: pct, pinned_limit_mib: limit };
    if (&conn.stream).write_all(granted.to_line().as_bytes()).is_err() {
        return; // Gone already; its reader thread finds nothing to remove.
    }
    let client = format!("{{PID: {}, Context ID: 1}}", hello.pid);
    shared.server_log.line(server.pid, &format!("Client {client} connected"));
    shared.server_log.line(server.pid, &format!("Status of client {client} is ACTIVE"));
    server.clients.push(conn);
}
