//! GPU instances: listing them and reading one. Creating and destroying them (a later issue)
//! belongs here too: write the state through `SimHost::update`, hand out `handles` as below.

use crate::call::answer;
use crate::ffi::{self, Out};
use crate::handles;
use crate::profiles::profile_by_id;
use crate::ret::{INVALID_ARGUMENT, NOT_FOUND, Res, UNKNOWN, guard, nvmlReturn_t};
use crate::session;
use crate::target::{self, Gpu};
use gpu_sim::SimGpuInstance;
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
