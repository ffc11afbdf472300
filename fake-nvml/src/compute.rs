//! Compute instances. Only the full-width compute instance of a GPU instance is modelled: at
//! most one per GPU instance, id 0, spanning all its compute slices, with the profile whose
//! slice count is the GPU instance's. It is the GPU instance's MIG device: creating it gives the
//! instance its `mig_uuid`, destroying it takes the UUID away. Smaller compute instance
//! profiles (e.g. `1c.3g.71gb`) answer `NOT_SUPPORTED`.
//!
//! Compute instance profile ids are NVML's `NVML_COMPUTE_INSTANCE_PROFILE_*` index constants,
//! as on real GPUs (published `nvidia-smi mig -lcip` captures: "MIG 1c.3g.20gb" is ID 0,
//! "MIG 3g.20gb" ID 2).

use crate::ffi::{self, Out, fill_array};
use crate::handles;
use crate::instances::instance_busy;
use crate::ret::{
    ARGUMENT_VERSION_MISMATCH, IN_USE, INSUFFICIENT_RESOURCES, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, Res,
    UNKNOWN, guard, nvmlReturn_t,
};
use crate::session;
use crate::target::{self, Gpu};
use gpu_sim::SimGpuInstance;
use gpu_sim::products::ProfileRow;
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t, nvmlComputeInstanceProfileInfo_t,
    nvmlComputeInstanceProfileInfo_v2_t, nvmlGpuInstance_t,
};
use std::ffi::c_uint;
use std::mem::size_of;

/// `NVML_STRUCT_VERSION(ComputeInstanceProfileInfo, 2)`.
const CI_PROFILE_INFO_V2_VERSION: c_uint = (size_of::<nvmlComputeInstanceProfileInfo_v2_t>() | 2 << 24) as c_uint;

/// The compute instance profile that spans `slices` compute slices.
fn full_width_profile(slices: u32) -> Option<c_uint> {
    Some(match slices {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        6 => NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
        7 => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        8 => NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        _ => return None,
    })
}

/// The GPU instance's profile row; one its product lacks is a broken state file (`UNKNOWN`).
fn gi_profile(gpu: Gpu<'_>, instance: &SimGpuInstance) -> Res<&'static ProfileRow> {
    gpu.product().profile_by_id(instance.profile_id).ok_or(UNKNOWN)
}

/// The GPU instance's row, if `profile` is its full-width compute instance profile; any other
/// profile is `NOT_SUPPORTED` (unverified for the smaller ones real GPUs have).
fn check_profile(gpu: Gpu<'_>, instance: &SimGpuInstance, profile: c_uint) -> Res<&'static ProfileRow> {
    let row = gi_profile(gpu, instance)?;
    if full_width_profile(row.slices) == Some(profile) { Ok(row) } else { Err(NOT_SUPPORTED) }
}

fn ci_handle(gpu: Gpu<'_>, instance: &SimGpuInstance) -> Res<nvmlComputeInstance_t> {
    handles::ComputeInstance { gpu: gpu.index, gi: instance.id }.encode().ok_or(UNKNOWN)
}

/// The profile info for `profile` (an `NVML_COMPUTE_INSTANCE_PROFILE_*` index) in a GPU
/// instance: at or past `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` `INVALID_ARGUMENT`, an engine
/// profile other than `SHARED` or a profile not modelled `NOT_SUPPORTED` (unverified).
fn profile_info(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
) -> Res<(nvmlComputeInstanceProfileInfo_t, &'static ProfileRow)> {
    let host = session::host()?;
    let (gpu, instance) = target::resolve_gpu_instance(&host, gpu_instance)?;
    if profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    if eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
        return Err(NOT_SUPPORTED);
    }
    let row = check_profile(gpu, instance, profile)?;
    let info = nvmlComputeInstanceProfileInfo_t {
        id: profile,
        sliceCount: row.slices,
        instanceCount: 1,
        multiprocessorCount: row.sm,
        sharedCopyEngineCount: row.copy_engines,
        sharedDecoderCount: row.decoders,
        sharedEncoderCount: row.encoders,
        sharedJpegCount: row.jpegs,
        sharedOfaCount: row.ofas,
    };
    Ok((info, row))
}

/// # Safety
/// `info` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: the caller's contract on `info`.
        let mut out = unsafe { Out::new(info) }?;
        out.set(profile_info(gpu_instance, profile, eng_profile)?.0);
        Ok(())
    })
}

/// As `nvmlGpuInstanceGetComputeInstanceProfileInfo`, with the name: the full-width compute
/// instance takes its GPU instance's name ("MIG 3g.71gb"), as published `nvidia-smi mig -lcip`
/// captures show for the A100 ("MIG 3g.20gb"; the split ones are "MIG 1c.3g.20gb"). The caller
/// sets `version` to `NVML_STRUCT_VERSION(ComputeInstanceProfileInfo, 2)`; anything else is
/// `ARGUMENT_VERSION_MISMATCH`.
///
/// # Safety
/// `info` is null or valid for reads and writes, its `version` set by the caller.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: the caller's contract on `info`.
        let mut out = unsafe { Out::new(info) }?;
        // SAFETY: non-null and valid for reads; the caller initialised `version` (only that
        // field is read, through a raw pointer).
        let version = unsafe { (&raw const (*out.as_ptr()).version).read() };
        if version != CI_PROFILE_INFO_V2_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let (v1, row) = profile_info(gpu_instance, profile, eng_profile)?;
        let mut v2 = nvmlComputeInstanceProfileInfo_v2_t {
            version,
            id: v1.id,
            sliceCount: v1.sliceCount,
            instanceCount: v1.instanceCount,
            multiprocessorCount: v1.multiprocessorCount,
            sharedCopyEngineCount: v1.sharedCopyEngineCount,
            sharedDecoderCount: v1.sharedDecoderCount,
            sharedEncoderCount: v1.sharedEncoderCount,
            sharedJpegCount: v1.sharedJpegCount,
            sharedOfaCount: v1.sharedOfaCount,
            name: [0; 96],
        };
        fill_array(&mut v2.name, &format!("MIG {}", row.name)).map_err(|_| UNKNOWN)?;
        out.set(v2);
        Ok(())
    })
}

/// Creates the GPU instance's full-width compute instance, giving it its MIG device (a fresh
/// `MIG-<uuid>`). Another profile is `NOT_SUPPORTED`; a second compute instance
/// `INSUFFICIENT_RESOURCES` (unverified). Counted against faults as
/// `nvmlGpuInstanceCreateComputeInstance`.
///
/// # Safety
/// `compute_instance` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: the caller's contract on `compute_instance`.
        let mut out = unsafe { Out::new(compute_instance) }?;
        let handles::GpuInstance { gpu: index, gi } =
            handles::GpuInstance::decode(gpu_instance).ok_or(INVALID_ARGUMENT)?;
        let handle = session::write("nvmlGpuInstanceCreateComputeInstance", index, |host| {
            let (gpu, instance) = target::resolve_gpu_instance(host, gpu_instance)?;
            check_profile(gpu, instance, profile_id)?;
            if instance.mig_uuid.is_some() {
                return Err(INSUFFICIENT_RESOURCES);
            }
            let handle = ci_handle(gpu, instance)?;
            let instance = host.gpus[index as usize].instances.iter_mut().find(|i| i.id == gi).ok_or(UNKNOWN)?;
            instance.mig_uuid = Some(format!("MIG-{}", uuid::Uuid::new_v4()));
            Ok(handle)
        })?;
        out.set(handle);
        Ok(())
    })
}

/// The compute instances of one profile in a GPU instance: none or the one. As for GPU
/// instances, the buffer must hold the profile's `instanceCount` (1) handles, `*count` is only
/// written, and a NULL buffer is `INVALID_ARGUMENT` (unverified). A profile at or past
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` is `INVALID_ARGUMENT`, one not modelled
/// `NOT_SUPPORTED` (unverified).
///
/// # Safety
/// `count` is null or valid for writes; `compute_instances` is null or valid for one handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let (gpu, instance) = target::resolve_gpu_instance(&host, gpu_instance)?;
        // SAFETY: the caller's contract on `count`.
        let mut count = unsafe { Out::new(count) }?;
        if compute_instances.is_null() || profile_id >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        check_profile(gpu, instance, profile_id)?;
        let handles = match instance.mig_uuid {
            Some(_) => vec![ci_handle(gpu, instance)?],
            None => Vec::new(),
        };
        // SAFETY: non-null, and the caller made it hold `instanceCount` (1) handles.
        unsafe { ffi::write_slice(compute_instances, &handles) };
        count.set(handles.len() as c_uint);
        Ok(())
    })
}

/// Id 0 while the GPU instance has its compute instance; anything else `NOT_FOUND` (unverified).
///
/// # Safety
/// `compute_instance` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let (gpu, instance) = target::resolve_gpu_instance(&host, gpu_instance)?;
        // SAFETY: the caller's contract on `compute_instance`.
        let mut out = unsafe { Out::new(compute_instance) }?;
        if id != 0 || instance.mig_uuid.is_none() {
            return Err(NOT_FOUND);
        }
        out.set(ci_handle(gpu, instance)?);
        Ok(())
    })
}

/// `device` is the parent GPU's handle (unverified: it could be the MIG device's), the
/// placement spans the GPU instance's compute slices from 0.
///
/// # Safety
/// `info` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let (gpu, instance) = target::resolve_compute_instance(&host, compute_instance)?;
        // SAFETY: the caller's contract on `info`.
        let mut out = unsafe { Out::new(info) }?;
        let row = gi_profile(gpu, instance)?;
        out.set(nvmlComputeInstanceInfo_t {
            device: gpu.handle()?,
            gpuInstance: handles::GpuInstance { gpu: gpu.index, gi: instance.id }.encode().ok_or(UNKNOWN)?,
            id: 0,
            profileId: full_width_profile(row.slices).ok_or(UNKNOWN)?,
            placement: nvmlComputeInstancePlacement_t { start: 0, size: row.slices },
        });
        Ok(())
    })
}

/// Destroys the compute instance: its MIG device goes. While a live process of the state runs
/// in its GPU instance: `IN_USE`. A handle whose compute instance is gone is
/// `INVALID_ARGUMENT`. Counted against faults as `nvmlComputeInstanceDestroy`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(compute_instance: nvmlComputeInstance_t) -> nvmlReturn_t {
    guard(|| {
        let handles::ComputeInstance { gpu: index, gi } =
            handles::ComputeInstance::decode(compute_instance).ok_or(INVALID_ARGUMENT)?;
        session::write("nvmlComputeInstanceDestroy", index, |host| {
            let (gpu, _) = target::resolve_compute_instance(host, compute_instance)?;
            if instance_busy(gpu, gi) {
                return Err(IN_USE);
            }
            let instance = host.gpus[index as usize].instances.iter_mut().find(|i| i.id == gi).ok_or(UNKNOWN)?;
            instance.mig_uuid = None;
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_profile_info_v2_version_is_nvml_struct_version() {
        // 10 uints and char[96]: 136 bytes.
        assert_eq!(CI_PROFILE_INFO_V2_VERSION, 0x0200_0088);
    }

    #[test]
    fn every_gpu_instance_profile_has_a_full_width_compute_instance() {
        for product in gpu_sim::products::PRODUCTS {
            for row in product.profiles {
                assert!(full_width_profile(row.slices).is_some(), "{} {}", product.key, row.name);
            }
        }
        assert_eq!(full_width_profile(3), Some(2));
        assert_eq!(full_width_profile(7), Some(4));
        assert_eq!(full_width_profile(5), None);
    }
}
