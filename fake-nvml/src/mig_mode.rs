//! Changing a GPU's MIG mode (`nvmlDeviceSetMigMode`). Reading it is `nvmlDeviceGetMigMode`.
//!
//! Hopper and later switch at once; Ampere needs a GPU reset, which fails while any process
//! holds the GPU (see `holders`), leaving the new mode pending, as the real driver does.

use crate::ffi::Out;
use crate::handles::Device;
use crate::holders;
use crate::ret::{IN_USE, INVALID_ARGUMENT, Res, SUCCESS, guard, nvmlReturn_t};
use crate::session;
use crate::target;
use gpu_sim::products::MigModeChange;
use gpu_sim::{SimGpu, SimHost};
use nvml_wrapper_sys::bindings::{NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE, nvmlDevice_t};
use std::ffi::c_uint;
use std::path::Path;

/// The GPU index a device handle names; a MIG device or a foreign value is `INVALID_ARGUMENT`.
pub fn gpu_index(device: nvmlDevice_t) -> Res<u32> {
    match Device::decode(device) {
        Some(Device::Gpu(index)) => Ok(index),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// The GPU `index` of `host`, to change; `INVALID_ARGUMENT` when there is none.
fn gpu_mut(host: &mut SimHost, index: u32) -> Res<&mut SimGpu> {
    host.gpus.get_mut(index as usize).ok_or(INVALID_ARGUMENT)
}

/// Sets MIG mode `requested` on GPU `index`; answers the activation status.
fn set_mode(host: &mut SimHost, state_path: &Path, index: u32, requested: bool) -> Res<nvmlReturn_t> {
    let held = || !holders::holders(state_path, index).is_empty();
    let gpu = target::gpu(host, index).ok_or(INVALID_ARGUMENT)?;
    let change = gpu.product().mig_mode_change;
    // Unverified: disabling while GPU instances exist is refused (nvidia-smi asks to destroy
    // them first).
    if !requested && !gpu.instances().is_empty() {
        return Err(IN_USE);
    }
    let gpu = gpu_mut(host, index)?;
    if gpu.mig_current == requested {
        // Already in effect: no reset needed; a different pending mode is withdrawn.
        gpu.mig_pending = requested;
        return Ok(SUCCESS);
    }
    match change {
        // Unverified: a held Hopper GPU refuses the change outright.
        MigModeChange::Immediate if held() => Err(IN_USE),
        MigModeChange::Immediate => {
            gpu.mig_pending = requested;
            gpu.mig_current = requested;
            Ok(SUCCESS)
        }
        MigModeChange::NeedsReset => {
            gpu.mig_pending = requested;
            // Unverified detail: the call succeeds and the failed reset shows only in the
            // activation status; the mode stays pending until a later reset succeeds.
            if held() {
                Ok(IN_USE)
            } else {
                gpu.mig_current = requested;
                Ok(SUCCESS)
            }
        }
    }
}

/// `mode` is `NVML_DEVICE_MIG_ENABLE` or `NVML_DEVICE_MIG_DISABLE`, anything else
/// `INVALID_ARGUMENT`. The mode the GPU already has is `SUCCESS` with no change. Disabling
/// while GPU instances exist is `IN_USE` (unverified). A change while a process holds the GPU:
/// `IN_USE` on Hopper and later (unverified); on Ampere `SUCCESS` with `*activation_status`
/// `IN_USE` and the mode left pending (unverified detail). Counted against faults as
/// `nvmlDeviceSetMigMode`.
///
/// # Safety
/// `activation_status` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    activation_status: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: the caller's contract on `activation_status`.
        let mut status = unsafe { Out::new(activation_status) }?;
        let index = gpu_index(device)?;
        let path = session::state_path()?;
        let activation = session::write("nvmlDeviceSetMigMode", index, |host| {
            let requested = match mode {
                NVML_DEVICE_MIG_ENABLE => true,
                NVML_DEVICE_MIG_DISABLE => false,
                _ => return Err(INVALID_ARGUMENT),
            };
            set_mode(host, &path, index, requested)
        })?;
        status.set(activation);
        Ok(())
    })
}
