//! Library lifetime, system-wide queries and finding device handles.

use crate::ffi::{self, Out};
use crate::pci::BusId;
use crate::ret::{self, INVALID_ARGUMENT, NOT_FOUND, guard, nvmlReturn_t};
use crate::session;
use crate::target::{self, Target};
use gpu_sim::state::{CUDA_DRIVER_VERSION, DRIVER_VERSION, NVML_VERSION};
use nvml_wrapper_sys::bindings::nvmlDevice_t;
use std::ffi::{c_char, c_int, c_uint};

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard(session::init)
}

/// Flags (`NVML_INIT_FLAG_NO_GPUS`, `NVML_INIT_FLAG_NO_ATTACH`) change nothing here.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    guard(session::init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(session::shutdown)
}

/// Works without init, as NVML's does.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    ret::error_string(result).as_ptr()
}

/// # Safety
/// `version` is null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    guard(|| {
        session::check()?;
        // SAFETY: the caller's contract on `version`.
        unsafe { ffi::write_str(version, length, DRIVER_VERSION) }
    })
}

/// # Safety
/// `version` is null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    guard(|| {
        session::check()?;
        // SAFETY: the caller's contract on `version`.
        unsafe { ffi::write_str(version, length, NVML_VERSION) }
    })
}

/// # Safety
/// `out` is null or valid for writes.
unsafe fn cuda_driver_version(out: *mut c_int) -> nvmlReturn_t {
    guard(|| {
        session::check()?;
        // SAFETY: the caller's contract on `out`.
        unsafe { Out::new(out) }?.set(CUDA_DRIVER_VERSION);
        Ok(())
    })
}

/// # Safety
/// `cuda_driver_version_out` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(cuda_driver_version_out: *mut c_int) -> nvmlReturn_t {
    // SAFETY: the caller's contract, passed on.
    unsafe { cuda_driver_version(cuda_driver_version_out) }
}

/// # Safety
/// `cuda_driver_version_out` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version_out: *mut c_int) -> nvmlReturn_t {
    // SAFETY: the caller's contract, passed on.
    unsafe { cuda_driver_version(cuda_driver_version_out) }
}

/// # Safety
/// `device_count` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        // SAFETY: the caller's contract on `device_count`.
        let mut out = unsafe { Out::new(device_count) }?;
        out.set(c_uint::try_from(host.gpus.len()).map_err(|_| ret::UNKNOWN)?);
        Ok(())
    })
}

/// An index past the last GPU is `INVALID_ARGUMENT`, as the H200 probe shows.
///
/// # Safety
/// `device` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        // SAFETY: the caller's contract on `device`.
        let mut out = unsafe { Out::new(device) }?;
        out.set(target::gpu(&host, index).ok_or(INVALID_ARGUMENT)?.handle()?);
        Ok(())
    })
}

/// Takes GPU UUIDs and MIG device UUIDs (`MIG-...`); an unknown one is `NOT_FOUND` (probed).
///
/// # Safety
/// `uuid` is null or a NUL-terminated string; `device` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        // SAFETY: the caller's contract on `uuid`.
        let uuid = unsafe { ffi::read_str(uuid) }?;
        // SAFETY: the caller's contract on `device`.
        let mut out = unsafe { Out::new(device) }?;
        let found = target::gpus(&host).find_map(|gpu| {
            if gpu.sim.uuid == uuid {
                return Some(Target::Gpu(gpu));
            }
            gpu.mig_devices().find(|mig| mig.uuid() == uuid).map(Target::Mig)
        });
        let handle = match found.ok_or(NOT_FOUND)? {
            Target::Gpu(gpu) => gpu.handle()?,
            Target::Mig(mig) => mig.handle()?,
        };
        out.set(handle);
        Ok(())
    })
}

/// Takes `domain:bus:device.function` with an 8- or 4-digit domain, or `bus:device.function`.
/// A malformed id is `INVALID_ARGUMENT`, an unknown one `NOT_FOUND` (both unverified).
///
/// # Safety
/// `pci_bus_id` is null or a NUL-terminated string; `device` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        // SAFETY: the caller's contract on `pci_bus_id`.
        let wanted = unsafe { ffi::read_str(pci_bus_id) }?;
        let wanted = BusId::parse(wanted).ok_or(INVALID_ARGUMENT)?;
        // SAFETY: the caller's contract on `device`.
        let mut out = unsafe { Out::new(device) }?;
        let gpu = target::gpus(&host).find(|gpu| BusId::parse(&gpu.sim.bus_id) == Some(wanted)).ok_or(NOT_FOUND)?;
        out.set(gpu.handle()?);
        Ok(())
    })
}
