//! `nvmlInit` / `nvmlShutdown` reference counting, the state file every call reads, and
//! [`write`], through which every call that changes the state reads, changes and writes it.

use crate::ret::{DRIVER_NOT_LOADED, Res, UNINITIALIZED, UNKNOWN, nvmlReturn_t};
use gpu_sim::{STATE_ENV, SimHost};
use std::path::PathBuf;
use std::sync::Mutex;

/// Init count and the state file found by the first successful init. One mutex guards both,
/// so a call never sees a count without a path.
struct Session {
    refs: u32,
    path: Option<PathBuf>,
}

static SESSION: Mutex<Session> = Mutex::new(Session { refs: 0, path: None });

fn session() -> std::sync::MutexGuard<'static, Session> {
    // The fields stay consistent even if a holder panicked, so poisoning is ignored.
    SESSION.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `nvmlInit_v2`: finds and loads the state file; `DRIVER_NOT_LOADED` with a one-line reason
/// on stderr when there is none, as a host without the NVIDIA driver answers.
pub fn init() -> Res {
    let path = match std::env::var_os(STATE_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => {
            eprintln!("fake-nvml: {STATE_ENV} is not set: no simulated GPU host to answer NVML calls from");
            return Err(DRIVER_NOT_LOADED);
        }
    };
    // Checked first because loading takes the state's lock, which creates the lock file (and
    // its directory) beside a state file that may not exist.
    if !path.is_file() {
        eprintln!("fake-nvml: {STATE_ENV}={}: no such state file", path.display());
        return Err(DRIVER_NOT_LOADED);
    }
    if let Err(e) = SimHost::load(&path) {
        eprintln!("fake-nvml: {e}");
        return Err(DRIVER_NOT_LOADED);
    }
    let mut session = session();
    session.refs += 1;
    session.path = Some(path);
    Ok(())
}

/// `nvmlShutdown`: one less reference; `UNINITIALIZED` when there is none.
pub fn shutdown() -> Res {
    let mut session = session();
    if session.refs == 0 {
        return Err(UNINITIALIZED);
    }
    session.refs -= 1;
    if session.refs == 0 {
        session.path = None;
    }
    Ok(())
}

/// `UNINITIALIZED` unless initialised; used by calls that do not need the state.
pub fn check() -> Res {
    state_path().map(drop)
}

/// The state file of the current session.
pub fn state_path() -> Res<PathBuf> {
    session().path.clone().ok_or(UNINITIALIZED)
}

/// The simulated host as the state file holds it now. A state file that vanished or broke
/// after init is `NVML_ERROR_UNKNOWN`, with the reason on stderr.
pub fn host() -> Res<SimHost> {
    let path = state_path()?;
    SimHost::load(&path).map_err(|e| {
        eprintln!("fake-nvml: {e}");
        UNKNOWN
    })
}

/// Runs the state change `f` of the exported function `call` about GPU `gpu`, under one lock of
/// the state (read, change, write back).
///
/// The call is first counted against the state's faults (`SimHost::fault`): when one fires, its
/// code is the answer and nothing else changes, but the counters are written back. Every call
/// counts, whether or not it would have succeeded. When `f` fails, whatever it changed is
/// dropped; only the fault counters are kept (written only if they moved).
pub fn write<T>(call: &str, gpu: u32, f: impl FnOnce(&mut SimHost) -> Res<T>) -> Res<T> {
    let path = state_path()?;
    // Outer Err: nothing to write; Ok(Err(code)): write (the fault counters), then fail.
    let outcome = SimHost::update(&path, |host| -> Result<Res<T>, nvmlReturn_t> {
        let faults_before = host.faults.clone();
        if let Some(code) = host.fault(call, Some(gpu)) {
            return Ok(Err(code));
        }
        let counted = host.clone();
        match f(host) {
            Ok(value) => Ok(Ok(value)),
            Err(code) => {
                *host = counted;
                if host.faults == faults_before { Err(code) } else { Ok(Err(code)) }
            }
        }
    });
    match outcome {
        Ok(Ok(result)) => result,
        Ok(Err(code)) => Err(code),
        Err(e) => {
            eprintln!("fake-nvml: {e}");
            Err(UNKNOWN)
        }
    }
}
