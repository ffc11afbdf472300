//! The control daemon (`-d`, `-f`). Threads, all plain std: one accept loop per socket, one
//! thread per connection, one watcher per server process, one signal thread (SIGTERM and SIGINT
//! are blocked everywhere and taken with `sigwait`), and the main thread, which waits for `quit`
//! or a signal and then tears down: clients' connections closed, the server stopped and reaped,
//! the pid file and log fifo removed. SIGPIPE stays ignored (std does that), so a client that
//! vanished is just a failed write. Fake-only: a daemon also ends when its pipe directory is
//! deleted, so a test that forgot to stop it leaves nothing running.

mod command;
mod conn;
mod execute;
mod pipedir;
mod servers;
mod state;

use crate::env::Config;
use crate::logfile::LogFile;
use nix::sys::signal::{SigSet, Signal};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Set by `-d` for the daemon it starts: the fd on which the daemon reports `ok` or `err ...`.
pub const READY_FD_ENV: &str = "FAKE_MPS_READY_FD";

/// How long a stopping server may take before it is killed.
const SERVER_STOP_GRACE: Duration = Duration::from_secs(3);

/// Why the daemon stops.
pub enum Shutdown {
    /// `quit` from this command interface, which gets its (empty) answer once all is torn down.
    Quit(UnixStream),
    Signal(Signal),
    /// The pipe directory was deleted (fake-only): nothing can reach this daemon any more.
    Orphaned,
}

/// `-d`: starts `-f` in a new session (a re-execution of this binary, so it is safe to call from
/// a process with threads) and returns 0 once it answers, or 1 with its reason on stderr.
pub fn daemonize(arg0: &OsStr) -> i32 {
    let (read, write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(fds) => fds,
        Err(e) => {
            eprintln!("cannot start the MPS control daemon: pipe: {e}");
            return 1;
        }
    };
    let write_fd = write.as_raw_fd();
    let mut cmd = Command::new(self_exe());
    cmd.arg0(arg0)
        .arg("-f")
        .env(READY_FD_ENV, write_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let detach = move || {
        // SAFETY: plain syscalls on this (forked) child's own session and on an fd it inherited
        // open; no memory is touched.
        let failed = unsafe { libc::setsid() == -1 || libc::fcntl(write_fd, libc::F_SETFD, 0) == -1 };
        if failed { Err(std::io::Error::last_os_error()) } else { Ok(()) }
    };
    // SAFETY: `detach` runs in the forked child before exec and only calls setsid and fcntl,
    // which are async-signal-safe; it captures nothing but a copied integer.
    unsafe { cmd.pre_exec(detach) };
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("cannot start the MPS control daemon: {e}");
            return 1;
        }
    };
    drop(write);
    let mut line = String::new();
    let _ = BufReader::new(File::from(read)).read_line(&mut line);
    match line.trim() {
        "ok" => 0,
        answer => {
            let status = child.wait().map_or_else(|e| e.to_string(), |s| s.to_string());
            match answer.strip_prefix("err ") {
                Some(why) => eprintln!("{why}"),
                None => eprintln!("MPS control daemon exited before it was ready ({status})"),
            }
            1
        }
    }
}

/// `-f`: runs the daemon in this process until `quit` or SIGTERM/SIGINT; returns the exit code.
pub fn run(arg0: OsString) -> i32 {
    let ready = take_ready_fd();
    if let Some(ready) = &ready {
        close_inherited_fds(ready.as_raw_fd());
    }
    let config = Config::from_env();
    let pid = std::process::id();
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    // Before any thread exists, so that every thread inherits the mask.
    if let Err(e) = signals.thread_block() {
        return fail(ready, &format!("cannot block signals: {e}"));
    }
    let dir = match pipedir::setup(&config, pid) {
        Ok(dir) => dir,
        Err(e) => return fail(ready, &e.to_string()),
    };
    let open = |name: &str, role| {
        let path = config.log_dir.join(name);
        LogFile::open(&path, role).map_err(|e| format!("{}: {e}", path.display()))
    };
    let (control_log, server_log) = match (open("control.log", "Control"), open("server.log", "Server")) {
        (Ok(c), Ok(s)) => (c, s),
        (Err(e), _) | (_, Err(e)) => return fail(ready, &e),
    };
    let shared = Arc::new(state::Shared {
        device_label: execute::device_label(&config),
        config,
        pid,
        control_log,
        server_log,
        arg0,
        state: Mutex::new(state::State::default()),
        server_gone: Condvar::new(),
    });
    shared.log("Starting control daemon (fake-mps)");
    let (tx, rx) = mpsc::channel();
    for listener in [dir.control, dir.privileged] {
        let (shared, tx) = (Arc::clone(&shared), tx.clone());
        std::thread::spawn(move || accept_loop(shared, listener, tx));
    }
    let watched = (shared.config.pipe_dir.clone(), tx.clone());
    std::thread::spawn(move || watch_pipe_dir(&watched.0, &watched.1));
    std::thread::spawn(move || {
        loop {
            if let Ok(signal) = signals.wait() {
                let _ = tx.send(Shutdown::Signal(signal));
                return;
            }
        }
    });
    if let Some(mut ready) = ready {
        redirect_stderr(&shared.config);
        let _ = ready.write_all(b"ok\n");
    }
    let reason = match rx.recv() {
        Ok(reason) => reason,
        Err(_) => return 1,
    };
    shutdown(&shared, dir.lock, reason)
}

fn accept_loop(shared: Arc<state::Shared>, listener: UnixListener, tx: Sender<Shutdown>) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                shared.log("Accepting connection...");
                let (shared, tx) = (Arc::clone(&shared), tx.clone());
                std::thread::spawn(move || conn::handle(shared, stream, tx));
            }
            // Out of fds or the like: back off rather than spin.
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn shutdown(shared: &Arc<state::Shared>, lock: nix::fcntl::Flock<File>, reason: Shutdown) -> i32 {
    match &reason {
        Shutdown::Quit(_) => shared.log("Quit requested: shutting down"),
        Shutdown::Signal(s) => shared.log(&format!("Caught {s}: shutting down")),
        Shutdown::Orphaned => shared.log("Pipe directory removed: shutting down"),
    }
    let server = {
        let mut st = shared.lock();
        st.begin_shutdown();
        st.server.as_ref().map(|s| s.pid)
    };
    let st = shared.lock();
    let (mut st, waited) = shared
        .server_gone
        .wait_timeout_while(st, SERVER_STOP_GRACE, |st| st.server.is_some())
        .unwrap_or_else(|e| e.into_inner());
    if waited.timed_out()
        && let Some(pid) = server
    {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        if let Some(state) = &shared.config.sim_state {
            let _ = crate::sim::unregister(state, pid);
        }
        st.server = None;
    }
    drop(st);
    pipedir::remove_on_quit(&shared.config);
    shared.log("Exit");
    drop(lock);
    if let Shutdown::Quit(mut stream) = reason {
        let _ = crate::wire::write_reply(&mut stream, "");
        // Closed by the process's exit: the command interface waits for that end of file, so
        // `quit` returns when this process is gone, not merely done.
        std::mem::forget(stream);
    }
    0
}

/// This binary, to re-execute as the daemon or a server. Its path when it still exists (so the
/// process name is the binary's, not `exe`); `/proc/self/exe` when it was replaced meanwhile.
pub fn self_exe() -> std::path::PathBuf {
    std::env::current_exe().ok().filter(|p| p.is_file()).unwrap_or_else(|| "/proc/self/exe".into())
}

/// Fake-only leak guard: a daemon whose pipe directory was deleted (a test's temp dir removed
/// while it ran) can never be reached again, so it shuts down instead of lingering.
fn watch_pipe_dir(dir: &std::path::Path, tx: &Sender<Shutdown>) {
    while dir.is_dir() {
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = tx.send(Shutdown::Orphaned);
}

/// A daemon keeps no descriptor its starter leaked to it (a caller's pipe held open by the
/// daemon, and by its servers after it, would keep that caller waiting for end of file).
fn close_inherited_fds(keep: RawFd) {
    let fds: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect(),
        Err(_) => return,
    };
    for fd in fds.into_iter().filter(|&fd| fd > 2 && fd != keep) {
        // SAFETY: this runs first thing in the daemon, before any thread or file of its own
        // exists (the directory listing is closed already), so every fd above 2 but `keep` was
        // inherited and nothing in this process refers to it. EBADF (the listing's own, now
        // closed fd) is harmless.
        unsafe { libc::close(fd) };
    }
}

/// Reports a start-up failure to `-d`'s caller (or stderr under `-f`); returns the exit code.
fn fail(ready: Option<File>, why: &str) -> i32 {
    match ready {
        Some(mut ready) => {
            let _ = ready.write_all(format!("err {why}\n").as_bytes());
        }
        None => eprintln!("{why}"),
    }
    1
}

/// The fd `-d` passed, if this process is its daemon; closed on exec from now on.
fn take_ready_fd() -> Option<File> {
    let fd: RawFd = std::env::var(READY_FD_ENV).ok()?.parse().ok()?;
    // SAFETY: F_GETFD only queries the flags of an fd number; it touches no memory.
    let open = unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1;
    if !open || fd <= 2 {
        return None;
    }
    // SAFETY: `daemonize` keeps the write end of its pipe open at exactly this number across
    // exec, for this process alone; nothing else in this process owns or closes it.
    let file = unsafe { File::from_raw_fd(fd) };
    // SAFETY: sets the close-on-exec flag of an fd this process owns.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Some(file)
}

/// A daemon's stderr is /dev/null; send it (panics included) to control.log instead.
fn redirect_stderr(config: &Config) {
    let Ok(log) = std::fs::OpenOptions::new().append(true).open(config.log_dir.join("control.log")) else {
        return;
    };
    // SAFETY: dup2 onto fd 2 replaces this process's stderr with an fd it owns; `log` stays
    // valid for the call, and fd 2 keeps its own reference afterwards.
    unsafe { libc::dup2(log.as_raw_fd(), 2) };
}
