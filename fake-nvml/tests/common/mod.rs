//! Shared by the integration tests: finding the built `libfake_nvml.so`, pointing it at a state
//! file, and calling NVML functions that nvml-wrapper does not wrap (or wraps lossily).
//!
//! NVML's state is per process and `GPU_SIM_STATE` is process-wide, so each test file holds a
//! single `#[test]` function.

#![allow(dead_code)] // Each test file uses its own subset.

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    NvmlLib, nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlMemory_t, nvmlReturn_t,
};
use std::ffi::CStr;
use std::mem::{size_of, zeroed};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::ptr;

pub const SUCCESS: nvmlReturn_t = 0;
pub const INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NOT_FOUND: nvmlReturn_t = 6;
pub const INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const IN_USE: nvmlReturn_t = 19;
pub const INSUFFICIENT_RESOURCES: nvmlReturn_t = 23;
pub const ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;

pub const MIB: u64 = 1 << 20;

/// The cdylib this package built: `target/<profile>/deps/libfake_nvml.so` beside the test
/// binary, or the copy cargo places in `target/<profile>/`.
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary in target/<profile>/deps");
    let candidates = [deps.join("libfake_nvml.so"), deps.join("../libfake_nvml.so")];
    for candidate in &candidates {
        if candidate.is_file() {
            return candidate.clone();
        }
    }
    panic!(
        "libfake_nvml.so not found at {} or {}: build the fake-nvml cdylib (cargo test -p fake-nvml builds it)",
        candidates[0].display(),
        candidates[1].display()
    );
}

/// Points the library at `state` for every later init.
pub fn use_state(state: &Path) {
    // SAFETY: each test file runs one #[test]; no other thread reads the environment now.
    unsafe { std::env::set_var(gpu_sim::STATE_ENV, state) };
}

pub fn init() -> Nvml {
    let lib = cdylib();
    Nvml::builder().lib_path(lib.as_os_str()).init().expect("nvmlInit_v2 on the fake library")
}

/// The library loaded without `nvmlInit`, for calls before init or after shutdown.
pub fn raw_lib() -> NvmlLib {
    // SAFETY: loading our own library runs no initialisers with preconditions.
    unsafe { NvmlLib::new(cdylib()) }.expect("load libfake_nvml.so")
}

pub fn error_string(nvml: &Nvml, code: nvmlReturn_t) -> String {
    let sym = nvml.lib().nvmlErrorString.as_ref().unwrap();
    // SAFETY: nvmlErrorString returns a static NUL-terminated string for any code.
    unsafe { CStr::from_ptr(sym(code)) }.to_str().unwrap().to_string()
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV`, with the version set correctly.
pub fn profile_info_v(
    nvml: &Nvml,
    device: nvmlDevice_t,
    index: u32,
) -> Result<(nvmlGpuInstanceProfileInfo_v2_t, String), nvmlReturn_t> {
    let sym = nvml.lib().nvmlDeviceGetGpuInstanceProfileInfoV.as_ref().unwrap();
    // SAFETY: a plain C struct; all zeroes is a valid value.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { zeroed() };
    info.version = (size_of::<nvmlGpuInstanceProfileInfo_v2_t>() | 2 << 24) as u32;
    // SAFETY: `info` is a live, writable struct with its version set.
    let rc = unsafe { sym(device, index, &mut info) };
    if rc != SUCCESS {
        return Err(rc);
    }
    // SAFETY: the library NUL-terminates `name` inside the array.
    let name = unsafe { CStr::from_ptr(info.name.as_ptr()) }.to_str().unwrap().to_string();
    Ok((info, name))
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: count query, then the list.
pub fn placements(nvml: &Nvml, device: nvmlDevice_t, profile_id: u32) -> Result<Vec<(u32, u32)>, nvmlReturn_t> {
    let sym = nvml.lib().nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref().unwrap();
    let mut count = 0;
    // SAFETY: a NULL buffer is a count query; `count` is a live local.
    let rc = unsafe { sym(device, profile_id, ptr::null_mut(), &mut count) };
    if rc != SUCCESS {
        return Err(rc);
    }
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 99, size: 99 }; count as usize];
    // SAFETY: `buf` holds `count` placements.
    let rc = unsafe { sym(device, profile_id, buf.as_mut_ptr(), &mut count) };
    if rc != SUCCESS {
        return Err(rc);
    }
    buf.truncate(count as usize);
    Ok(buf.into_iter().map(|p| (p.start, p.size)).collect())
}

pub fn remaining_capacity(nvml: &Nvml, device: nvmlDevice_t, profile_id: u32) -> Result<u32, nvmlReturn_t> {
    let sym = nvml.lib().nvmlDeviceGetGpuInstanceRemainingCapacity.as_ref().unwrap();
    let mut count = 0;
    // SAFETY: `count` is a live local.
    let rc = unsafe { sym(device, profile_id, &mut count) };
    if rc == SUCCESS { Ok(count) } else { Err(rc) }
}

/// `nvmlDeviceGetGpuInstances` with a buffer of 8 (no profile allows more than 7).
pub fn gpu_instances(
    nvml: &Nvml,
    device: nvmlDevice_t,
    profile_id: u32,
) -> Result<Vec<nvmlGpuInstance_t>, nvmlReturn_t> {
    let sym = nvml.lib().nvmlDeviceGetGpuInstances.as_ref().unwrap();
    let mut buf: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); 8];
    let mut count = 8;
    // SAFETY: `buf` holds 8 handles, more than any profile's instanceCount.
    let rc = unsafe { sym(device, profile_id, buf.as_mut_ptr(), &mut count) };
    if rc != SUCCESS {
        return Err(rc);
    }
    buf.truncate(count as usize);
    Ok(buf)
}

pub fn gpu_instance_info(nvml: &Nvml, instance: nvmlGpuInstance_t) -> Result<nvmlGpuInstanceInfo_t, nvmlReturn_t> {
    let sym = nvml.lib().nvmlGpuInstanceGetInfo.as_ref().unwrap();
    // SAFETY: a plain C struct; all zeroes is a valid value.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { zeroed() };
    // SAFETY: `info` is a live, writable struct.
    let rc = unsafe { sym(instance, &mut info) };
    if rc == SUCCESS { Ok(info) } else { Err(rc) }
}

/// `nvmlDeviceGetMemoryInfo` (v1: used includes reserved); nvml-wrapper only calls v2.
pub fn memory_v1(nvml: &Nvml, device: nvmlDevice_t) -> nvmlMemory_t {
    let sym = nvml.lib().nvmlDeviceGetMemoryInfo.as_ref().unwrap();
    let mut memory = nvmlMemory_t { total: 0, free: 0, used: 0 };
    // SAFETY: `memory` is a live, writable struct.
    let rc = unsafe { sym(device, &mut memory) };
    assert_eq!(rc, SUCCESS, "nvmlDeviceGetMemoryInfo");
    memory
}

/// A `u32`-out device call through the raw symbol, as `Result<value, code>`.
pub fn raw_u32(
    sym: &unsafe extern "C" fn(nvmlDevice_t, *mut u32) -> nvmlReturn_t,
    device: nvmlDevice_t,
) -> Result<u32, nvmlReturn_t> {
    let mut value = 0xdead_beef;
    // SAFETY: `value` is a live local.
    let rc = unsafe { sym(device, &mut value) };
    if rc == SUCCESS { Ok(value) } else { Err(rc) }
}

/// A child process that lives until dropped: a pid that is alive without being this test.
pub struct Sleeper(Child);

impl Sleeper {
    pub fn spawn() -> Sleeper {
        Sleeper(Command::new("sleep").arg("300").spawn().expect("spawn sleep"))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pid that was alive a moment ago and is now gone (exited and reaped).
pub fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    child.wait().expect("wait true");
    pid
}
