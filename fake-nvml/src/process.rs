//! Processes on a GPU: the state's `processes` list, less those no longer alive (a worker that
//! exited holds no GPU memory, whether or not anyone removed it from the state).

use crate::ffi::{self, CountQuery};
use crate::ret::{guard, nvmlReturn_t};
use crate::session;
use crate::target::{self, Target};
use gpu_sim::SimProcess;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlProcessInfo_t};
use std::ffi::c_uint;

pub const MIB: u64 = 1 << 20;

/// `gpuInstanceId` / `computeInstanceId` of a process outside MIG (as the probe shows).
const NO_INSTANCE: u32 = u32::MAX;

/// Whether `pid` is a running process: it exists (`kill(pid, 0)` succeeds or is refused for
/// permission) and is not a zombie, which has already released its GPU memory.
pub fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only checks that `pid` exists and may be signalled.
    let exists =
        unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists && !zombie(pid)
}

fn zombie(pid: libc::pid_t) -> bool {
    // `/proc/<pid>/stat` is `pid (comm) S ...`; comm may hold spaces and parentheses.
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rfind(')').and_then(|end| stat[end + 1..].trim_start().chars().next());
    matches!(state, Some('Z' | 'X'))
}

/// The live processes `target` shows: all of a GPU's, or those of one MIG device's instance.
pub fn processes<'h>(target: Target<'h>) -> impl Iterator<Item = &'h SimProcess> {
    let gpu = target.gpu();
    let instance = target.instance().map(|i| i.id);
    gpu.sim.processes.iter().filter(move |p| {
        let in_scope = instance.is_none_or(|gi| p.gpu_instance_id == Some(gi));
        in_scope && alive(p.pid)
    })
}

/// GPU memory the live processes of `target` use, in bytes.
pub fn used_bytes(target: Target<'_>) -> u64 {
    processes(target).map(|p| p.used_mib.saturating_mul(MIB)).sum()
}

fn info(target: Target<'_>, p: &SimProcess) -> nvmlProcessInfo_t {
    // With MIG on, a process runs in a GPU instance and its one compute instance (id 0).
    // Unverified: a process the state lists without an instance on a MIG GPU gets "none".
    let (gpu_instance, compute_instance) = match p.gpu_instance_id {
        Some(gi) if target.gpu().sim.mig_current => (gi, 0),
        _ => (NO_INSTANCE, NO_INSTANCE),
    };
    nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.used_mib.saturating_mul(MIB),
        gpuInstanceId: gpu_instance,
        computeInstanceId: compute_instance,
    }
}

/// # Safety
/// `count` is null or valid for reads and writes; `infos` is null or valid for `*count` items.
unsafe fn list(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
    mps_only: bool,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let target = target::resolve(&host, device)?;
        let items: Vec<nvmlProcessInfo_t> =
            processes(target).filter(|p| !mps_only || p.mps_client).map(|p| info(target, p)).collect();
        // SAFETY: the caller's contract on `count` and `infos`.
        unsafe { ffi::write_list(infos, count, &items, CountQuery::InsufficientSize) }
    })
}

/// Every live compute process (MPS clients and servers too, as on the probed H200); on a MIG
/// device handle, only that instance's.
///
/// # Safety
/// `info_count` is null or valid for reads and writes; `infos` is null or valid for
/// `*info_count` items.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract, passed on.
    unsafe { list(device, info_count, infos, false) }
}

/// The live processes that are MPS clients (`mps_client`), not the MPS server.
///
/// # Safety
/// As [`nvmlDeviceGetComputeRunningProcesses_v3`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract, passed on.
    unsafe { list(device, info_count, infos, true) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    #[test]
    fn liveness() {
        assert!(alive(std::process::id()), "this process");
        assert!(alive(1), "init (kill answers EPERM or 0)");
        assert!(!alive(0), "pid 0 is not a process");
        assert!(!alive(u32::MAX), "-1 must never reach kill()");

        let mut reaped = Command::new("true").spawn().unwrap();
        let reaped_pid = reaped.id();
        reaped.wait().unwrap();
        assert!(!alive(reaped_pid), "a reaped child");

        // A child that exited but is not waited for stays a zombie: not alive for NVML.
        let mut zombie_child = Command::new("true").spawn().unwrap();
        let zombie_pid = zombie_child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !zombie(zombie_pid as libc::pid_t) {
            assert!(Instant::now() < deadline, "child {zombie_pid} never became a zombie");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(zombie_pid), "a zombie child");
        zombie_child.wait().unwrap();
    }
}
