//! MIG devices: the handles of GPU instances' compute instances (one full-width compute
//! instance per GPU instance, as the simulated driver creates them).

use crate::call::answer;
use crate::ret::{INVALID_ARGUMENT, NOT_FOUND, nvmlReturn_t};
use crate::target::Target;
use nvml_wrapper_sys::bindings::nvmlDevice_t;
use std::ffi::c_uint;

/// # Safety
/// `count` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `count`.
    unsafe { answer(device, count, |t| Ok(t.whole_gpu()?.max_mig_devices())) }
}

/// With MIG off: `NOT_FOUND` for any index (probed for index 0). With MIG on: an index past
/// `nvmlDeviceGetMaxMigDeviceCount` is `INVALID_ARGUMENT` (unverified), an empty slot
/// `NOT_FOUND`.
///
/// # Safety
/// `mig_device` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `mig_device`.
    unsafe {
        answer(device, mig_device, |t| {
            let gpu = t.whole_gpu()?;
            if !gpu.sim.mig_current {
                return Err(NOT_FOUND);
            }
            if index >= gpu.max_mig_devices() {
                return Err(INVALID_ARGUMENT);
            }
            gpu.mig_devices().nth(index as usize).ok_or(NOT_FOUND)?.handle()
        })
    }
}

/// # Safety
/// `is_mig_device` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig_device: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `is_mig_device`.
    unsafe { answer(device, is_mig_device, |t| Ok(matches!(t, Target::Mig(_)) as c_uint)) }
}

/// # Safety
/// `device` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `device`.
    unsafe {
        answer(mig_device, device, |t| match t {
            Target::Mig(mig) => mig.gpu.handle(),
            Target::Gpu(_) => Err(INVALID_ARGUMENT),
        })
    }
}

/// On a MIG device handle; a whole GPU is `INVALID_ARGUMENT` (unverified).
///
/// # Safety
/// `id` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `id`.
    unsafe { answer(device, id, |t| t.instance().map(|i| i.id).ok_or(INVALID_ARGUMENT)) }
}

/// Always 0 on a MIG device handle: each GPU instance has one full-width compute instance.
/// A whole GPU is `INVALID_ARGUMENT` (unverified).
///
/// # Safety
/// `id` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `id`.
    unsafe { answer(device, id, |t| t.instance().map(|_| 0).ok_or(INVALID_ARGUMENT)) }
}
