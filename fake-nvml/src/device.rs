//! Per-device identity and attribute queries.

use crate::call::{answer, answer_str};
use crate::ffi::{Out, fill_array};
use crate::pci::BusId;
use crate::process::{self, MIB};
use crate::ret::{ARGUMENT_VERSION_MISMATCH, Res, UNKNOWN, guard, nvmlReturn_t};
use crate::session;
use crate::target::{self, Gpu, Target};
use gpu_sim::products::Product;
use nvml_wrapper_sys::bindings::{
    NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE, nvmlComputeMode_t, nvmlDevice_t, nvmlDeviceArchitecture_t,
    nvmlEnableState_enum_NVML_FEATURE_DISABLED, nvmlEnableState_enum_NVML_FEATURE_ENABLED, nvmlEnableState_t,
    nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t,
};
use std::ffi::{c_char, c_int, c_uint};
use std::mem::size_of;

/// `NVML_STRUCT_VERSION(Memory, 2)`.
const MEMORY_V2_VERSION: c_uint = (size_of::<nvmlMemory_v2_t>() | 2 << 24) as c_uint;

/// # Safety
/// `index` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `index`.
    unsafe { answer(device, index, |t| Ok(t.whole_gpu()?.index)) }
}

/// The minor number of a GPU's device node (`/dev/nvidia<minor>`): its index on the simulated host
/// (real hosts usually agree; unverified beyond that).
///
/// # Safety
/// `minor` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `minor`.
    unsafe { answer(device, minor, |t| Ok(t.whole_gpu()?.index)) }
}

/// A GPU's `GPU-...` UUID, or a MIG device's `MIG-...` one.
///
/// # Safety
/// `uuid` is null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `uuid`.
    unsafe {
        answer_str(device, uuid, length, |t| {
            Ok(match t {
                Target::Gpu(gpu) => gpu.sim.uuid.clone(),
                Target::Mig(mig) => mig.uuid().to_string(),
            })
        })
    }
}

/// The product name; for a MIG device "<product> MIG <profile>", e.g.
/// "NVIDIA H200 MIG 1g.18gb" (unverified: not in the probe).
///
/// # Safety
/// `name` is null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `name`.
    unsafe {
        answer_str(device, name, length, |t| {
            let product = t.gpu().product().name;
            Ok(match t {
                Target::Gpu(_) => product.to_string(),
                Target::Mig(mig) => format!("{product} MIG {}", mig.profile()?.name),
            })
        })
    }
}

/// Made up, deterministic per index, shaped like an H200's 13-digit board serial (unverified).
pub fn serial(index: u32) -> String {
    format!("{}", 1_652_425_000_000u64 + u64::from(index))
}

/// # Safety
/// `serial` is null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial_out: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `serial_out`.
    unsafe { answer_str(device, serial_out, length, |t| Ok(serial(t.whole_gpu()?.index))) }
}

fn pci_info(gpu: Gpu<'_>) -> Res<nvmlPciInfo_t> {
    let bus = BusId::parse(&gpu.sim.bus_id).ok_or_else(|| {
        eprintln!("fake-nvml: GPU {} has a malformed bus id {:?}", gpu.index, gpu.sim.bus_id);
        UNKNOWN
    })?;
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: bus.domain,
        bus: bus.bus,
        device: bus.device,
        pciDeviceId: gpu.product().pci_device_id,
        pciSubSystemId: gpu.product().pci_subsystem_id,
        busId: [0; 32],
    };
    fill_array(&mut info.busIdLegacy, &bus.legacy()).map_err(|_| UNKNOWN)?;
    fill_array(&mut info.busId, &gpu.sim.bus_id).map_err(|_| UNKNOWN)?;
    Ok(info)
}

/// # Safety
/// `pci` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `pci`.
    unsafe { answer(device, pci, |t| pci_info(t.whole_gpu()?)) }
}

/// Memory the driver reserves, in bytes (the product table keeps KiB: the H200's is 615 MiB + 64 KiB).
fn reserved_bytes(product: &Product) -> u64 {
    product.reserved_kib * 1024
}

/// Memory of a device, in bytes: `used` is what live processes hold (v2's meaning).
struct Memory {
    total: u64,
    reserved: u64,
    used: u64,
}

fn memory(target: Target<'_>) -> Res<Memory> {
    let used = process::used_bytes(target);
    Ok(match target {
        Target::Gpu(gpu) => {
            Memory { total: gpu.product().memory_mib * MIB, reserved: reserved_bytes(gpu.product()), used }
        }
        // Unverified: a MIG device's total is its profile's memory, with nothing reserved.
        Target::Mig(mig) => Memory { total: mig.profile()?.memory_mib * MIB, reserved: 0, used },
    })
}

/// v1: `used` counts the reserved memory too (probed: H200 used 644939776 with no process).
///
/// # Safety
/// `memory_out` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory_out: *mut nvmlMemory_t) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `memory_out`.
    unsafe {
        answer(device, memory_out, |t| {
            let m = memory(t)?;
            let used = m.reserved + m.used;
            Ok(nvmlMemory_t { total: m.total, free: m.total.saturating_sub(used), used })
        })
    }
}

/// v2: reserved apart, `used` is the processes' alone (probed: H200 used 0, reserved 644939776).
/// The caller sets `version` to `NVML_STRUCT_VERSION(Memory, 2)`; anything else is
/// `ARGUMENT_VERSION_MISMATCH`.
///
/// # Safety
/// `memory_out` is null or valid for reads and writes, its `version` set by the caller.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory_out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let target = target::resolve(&host, device)?;
        // SAFETY: the caller's contract on `memory_out`.
        let mut out = unsafe { Out::new(memory_out) }?;
        // SAFETY: non-null and valid for reads; the caller initialised `version` (only that
        // field is read, through a raw pointer).
        let version = unsafe { (&raw const (*out.as_ptr()).version).read() };
        if version != MEMORY_V2_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let m = memory(target)?;
        out.set(nvmlMemory_v2_t {
            version,
            total: m.total,
            reserved: m.reserved,
            free: m.total.saturating_sub(m.reserved).saturating_sub(m.used),
            used: m.used,
        });
        Ok(())
    })
}

/// On a MIG device, its parent's (unverified).
///
/// # Safety
/// `arch` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `arch`.
    unsafe { answer(device, arch, |t| Ok(t.gpu().product().architecture)) }
}

/// On a MIG device, its parent's (unverified).
///
/// # Safety
/// `major` and `minor` are null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let (cc_major, cc_minor) = target::resolve(&host, device)?.gpu().product().compute_capability;
        // SAFETY: the caller's contract on `major` and `minor`.
        let (mut major, mut minor) = unsafe { (Out::new(major)?, Out::new(minor)?) };
        major.set(cc_major);
        minor.set(cc_minor);
        Ok(())
    })
}

/// # Safety
/// `current_mode` and `pending_mode` are null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> nvmlReturn_t {
    let mode = |on: bool| {
        if on { NVML_DEVICE_MIG_ENABLE } else { NVML_DEVICE_MIG_DISABLE }
    };
    guard(|| {
        let host = session::host()?;
        let gpu = target::resolve_gpu(&host, device)?;
        // SAFETY: the caller's contract on `current_mode` and `pending_mode`.
        let (mut current, mut pending) = unsafe { (Out::new(current_mode)?, Out::new(pending_mode)?) };
        current.set(mode(gpu.sim.mig_current));
        pending.set(mode(gpu.sim.mig_pending));
        Ok(())
    })
}

/// The state's `nvmlComputeMode_t` value, passed through.
///
/// # Safety
/// `mode` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut nvmlComputeMode_t) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `mode`.
    unsafe { answer(device, mode, |t| Ok(t.whole_gpu()?.sim.compute_mode)) }
}

/// # Safety
/// `mode` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `mode`.
    unsafe {
        answer(device, mode, |t| {
            Ok(if t.whole_gpu()?.sim.persistence {
                nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                nvmlEnableState_enum_NVML_FEATURE_DISABLED
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_v2_version_is_nvml_struct_version() {
        // nvml.h: nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2) = sizeof | 2 << 24; 40 bytes.
        assert_eq!(MEMORY_V2_VERSION, 0x0200_0028);
    }

    #[test]
    fn serials_are_13_digits_and_distinct() {
        assert_eq!(serial(0), "1652425000000");
        assert_eq!(serial(7), "1652425000007");
        assert!(serial(63).len() == 13 && serial(63).len() < 30);
    }
}
