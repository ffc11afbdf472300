//! GPU instances: listing them, reading one, creating and destroying them. Changes go through
//! `session::write` (one state lock, fault injection first).
//!
//! A new GPU instance has no compute instance (`mig_uuid` None) and so no MIG device yet; see
//! `compute` for those.

use crate::call::answer;
use crate::ffi::{self, Out};
use crate::handles;
use crate::mig_mode::gpu_index;
use crate::process;
use crate::profiles::{fits_at, profile_by_id};
use crate::ret::{
    IN_USE, INSUFFICIENT_RESOURCES, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, Res, UNKNOWN, guard, nvmlReturn_t,
};
use crate::session;
use crate::target::{self, Gpu};
use gpu_sim::{SimGpuInstance, SimHost};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t};
use std::ffi::c_uint;

fn instance_handle(gpu: Gpu<'_>, instance: &SimGpuInstance) -> Res<nvmlGpuInstance_t> {
    handles::GpuInstance { gpu: gpu.index, gi: instance.id }.encode().ok_or(UNKNOWN)
}

/// The GPU instances of one profile, by id. As nvml.h documents, the buffer must hold the
/// profile's `instanceCount` handles and `*count` is only written; a NULL buffer is
/// `INVALID_ARGUMENT` (unverified). With MIG off: `SUCCESS`, count 0 (probed).
///
/// # Safety
/// `count` is null or valid for writes; `gpu_instances` is null or valid for the profile's
/// `instanceCount` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let gpu = target::resolve_gpu(&host, device)?;
        let row = profile_by_id(gpu.product(), profile_id)?;
        // SAFETY: the caller's contract on `count`.
        let mut count = unsafe { Out::new(count) }?;
        if gpu_instances.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let mut instances: Vec<&SimGpuInstance> = gpu.instances().iter().filter(|i| i.profile_id == row.id).collect();
        instances.sort_by_key(|i| i.id);
        // A state holding more than the buffer's promised size would overrun it.
        instances.truncate(row.max as usize);
        let handles = instances.into_iter().map(|i| instance_handle(gpu, i)).collect::<Res<Vec<_>>>()?;
        // SAFETY: non-null, and the caller made it hold `row.max >= handles.len()` handles.
        unsafe { ffi::write_slice(gpu_instances, &handles) };
        count.set(handles.len() as c_uint);
        Ok(())
    })
}

/// An id with no instance (or any id with MIG off) is `NOT_FOUND` (unverified).
///
/// # Safety
/// `gpu_instance` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `gpu_instance`.
    unsafe {
        answer(device, gpu_instance, |t| {
            let gpu = t.whole_gpu()?;
            let instance = gpu.instances().iter().find(|i| i.id == id).ok_or(NOT_FOUND)?;
            instance_handle(gpu, instance)
        })
    }
}

/// # Safety
/// `info` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let (gpu, instance) = target::resolve_gpu_instance(&host, gpu_instance)?;
        // SAFETY: the caller's contract on `info`.
        let mut out = unsafe { Out::new(info) }?;
        out.set(nvmlGpuInstanceInfo_t {
            device: gpu.handle()?,
            id: instance.id,
            profileId: instance.profile_id,
            placement: nvmlGpuInstancePlacement_t { start: instance.start, size: instance.size },
        });
        Ok(())
    })
}

/// Creates an instance of profile `profile_id` on GPU `index`, at `placement` or (None) where
/// the driver chooses; answers its id.
///
/// The driver's choice is the lowest free valid start, which is what strands capacity on real
/// GPUs (a 1g first goes to slice 0, blocking the 4g and 7g placements). Unverified details:
/// MIG off is `NOT_SUPPORTED`; a profile the product lacks, a start not among the profile's
/// placements or a size not the profile's is `INVALID_ARGUMENT`; no room (overlap, the
/// profile's `instanceCount` reached, a second "+me" instance, no compute slices left) is
/// `INSUFFICIENT_RESOURCES`; the new id is the lowest unused one from 1, so ids are reused.
fn create(
    host: &mut SimHost,
    index: u32,
    profile_id: c_uint,
    placement: Option<nvmlGpuInstancePlacement_t>,
) -> Res<u32> {
    let gpu = target::gpu(host, index).ok_or(INVALID_ARGUMENT)?;
    if !gpu.sim.mig_current {
        return Err(NOT_SUPPORTED);
    }
    let product = gpu.product();
    let row = profile_by_id(product, profile_id)?;
    let existing = gpu.instances();
    let start = match placement {
        Some(p) => {
            if p.size != row.size || !row.starts.contains(&p.start) {
                return Err(INVALID_ARGUMENT);
            }
            fits_at(product, row, p.start, existing).then_some(p.start)
        }
        None => row.starts.iter().copied().find(|&start| fits_at(product, row, start, existing)),
    }
    .ok_or(INSUFFICIENT_RESOURCES)?;
    let id = (1..).find(|id| existing.iter().all(|i| i.id != *id)).ok_or(UNKNOWN)?;
    host.gpus[index as usize].instances.push(SimGpuInstance {
        id,
        profile_id: row.id,
        start,
        size: row.size,
        mig_uuid: None,
    });
    Ok(id)
}

/// The body of both create calls: counted against faults as `call`.
///
/// # Safety
/// `gpu_instance` is null or valid for writes.
unsafe fn create_call(
    call: &str,
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: Option<nvmlGpuInstancePlacement_t>,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> Res {
    // SAFETY: the caller's contract on `gpu_instance`.
    let mut out = unsafe { Out::new(gpu_instance) }?;
    let index = gpu_index(device)?;
    let id = session::write(call, index, |host| create(host, index, profile_id, placement))?;
    out.set(handles::GpuInstance { gpu: index, gi: id }.encode().ok_or(UNKNOWN)?);
    Ok(())
}

/// Creates a GPU instance where the driver chooses: the lowest free placement (see `create`).
///
/// # Safety
/// `gpu_instance` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: the caller's contract on `gpu_instance`, passed on.
        unsafe { create_call("nvmlDeviceCreateGpuInstance", device, profile_id, None, gpu_instance) }
    })
}

/// Creates a GPU instance at `*placement` (see `create` for the errors).
///
/// # Safety
/// `placement` is null or valid for reads; `gpu_instance` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        if placement.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null, and the caller made it valid for reads.
        let placement = unsafe { placement.read() };
        let call = "nvmlDeviceCreateGpuInstanceWithPlacement";
        // SAFETY: the caller's contract on `gpu_instance`, passed on.
        unsafe { create_call(call, device, profile_id, Some(placement), gpu_instance) }
    })
}

/// Whether a live process of the state runs in GPU instance `gi` of `gpu`.
pub fn instance_busy(gpu: Gpu<'_>, gi: u32) -> bool {
    gpu.sim.processes.iter().any(|p| p.gpu_instance_id == Some(gi) && process::alive(p.pid))
}

/// Destroys a GPU instance. While it has its compute instance, or a live process of the state
/// runs in it: `IN_USE` (real NVML wants compute instances destroyed first; unverified code). A
/// handle whose instance is gone is `INVALID_ARGUMENT`. Counted against faults as
/// `nvmlGpuInstanceDestroy`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(gpu_instance: nvmlGpuInstance_t) -> nvmlReturn_t {
    guard(|| {
        let handles::GpuInstance { gpu: index, gi } =
            handles::GpuInstance::decode(gpu_instance).ok_or(INVALID_ARGUMENT)?;
        session::write("nvmlGpuInstanceDestroy", index, |host| {
            let (gpu, instance) = target::resolve_gpu_instance(host, gpu_instance)?;
            if instance.mig_uuid.is_some() || instance_busy(gpu, gi) {
                return Err(IN_USE);
            }
            host.gpus[index as usize].instances.retain(|i| i.id != gi);
            Ok(())
        })
    })
}
