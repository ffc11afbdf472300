//! [`GpuDriver`] over NVML. Most calls go through nvml-wrapper's safe API; the MIG calls it does
//! not wrap (or wraps wrongly: `possible_placements` in 0.13 always returns an empty list) go
//! through its raw function table, `Nvml::lib()`.

use super::{DriverError, GpuDriver, MigMode};
use crate::inventory::{ComputeMode as Mode, Gpu, GpuInstance, GpuProcess, Inventory, Placement, Profile};
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT, NVML_GPU_INSTANCE_PROFILE_COUNT,
    nvmlComputeInstance_t, nvmlComputeInstanceProfileInfo_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
};
use std::collections::HashMap;
use std::ffi::CStr;
use std::mem;
use std::path::Path;

pub struct NvmlDriver {
    nvml: Nvml,
}

const MIB: u64 = 1 << 20;

impl NvmlDriver {
    /// Loads NVML from `library`, or from the system's default name when None.
    pub fn load(library: Option<&Path>) -> Result<NvmlDriver, DriverError> {
        let nvml = match library {
            Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
            None => Nvml::init(),
        };
        let label = library.map(|p| p.display().to_string()).unwrap_or_else(|| "libnvidia-ml.so.1".into());
        let nvml = nvml.map_err(|source| DriverError::Load { library: label, source })?;
        Ok(NvmlDriver { nvml })
    }

    fn gpu(&self, index: u32) -> Result<Gpu, DriverError> {
        let err = |call| move |source| DriverError::Gpu { gpu: index, call, source };
        let dev = self.nvml.device_by_index(index).map_err(err("nvmlDeviceGetHandleByIndex_v2"))?;
        let pci = dev.pci_info().map_err(err("nvmlDeviceGetPciInfo_v3"))?;
        let memory = dev.memory_info().map_err(err("nvmlDeviceGetMemoryInfo_v2"))?;
        let (mig_current, mig_pending) = match dev.mig_mode() {
            Ok(m) => (m.current == 1, m.pending == 1),
            Err(NvmlError::NotSupported) => (false, false),
            Err(e) => return Err(err("nvmlDeviceGetMigMode")(e)),
        };
        let compute_mode = match dev.compute_mode().map_err(err("nvmlDeviceGetComputeMode"))? {
            ComputeMode::Default => Mode::Default,
            ComputeMode::ExclusiveThread => Mode::ExclusiveThread,
            ComputeMode::ExclusiveProcess => Mode::ExclusiveProcess,
            ComputeMode::Prohibited => Mode::Prohibited,
        };
        let profiles = self.profiles(&dev, index)?;
        let instances = self.instances(&dev, index, &profiles)?;
        let processes = processes(&dev).map_err(err("nvmlDeviceGetComputeRunningProcesses_v3"))?;
        let sm_count = profiles.iter().map(|p| p.sm).max().unwrap_or(0);
        Ok(Gpu {
            index,
            uuid: dev.uuid().map_err(err("nvmlDeviceGetUUID"))?,
            name: dev.name().map_err(err("nvmlDeviceGetName"))?,
            pci_device_id: pci.pci_device_id,
            pci_bus_id: pci.bus_id,
            // nvidia-smi's total and used are v2's total and used (v1's used also counts the
            // driver's reserved memory).
            memory_total_mib: memory.total / MIB,
            memory_used_mib: memory.used / MIB,
            mig_current,
            mig_pending,
            compute_mode,
            sm_count,
            minor: dev.minor_number().ok(),
            profiles,
            instances,
            processes,
        })
    }

    /// Walks every NVML profile index constant. `NOT_SUPPORTED` means the product lacks that
    /// profile; the index constant is not the profile ID (the ID comes back in the answer).
    fn profiles(&self, dev: &Device, gpu: u32) -> Result<Vec<Profile>, DriverError> {
        let lib = self.nvml.lib();
        let info_v =
            nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref(), gpu, "nvmlDeviceGetGpuInstanceProfileInfoV")?;
        let placements_v2 = nvml_sym(
            lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref(),
            gpu,
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        )?;
        let mut out = Vec::new();
        for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            // SAFETY: an all-zero nvmlGpuInstanceProfileInfo_v2_t is a valid value (integers and
            // a char array); the call then fills it.
            let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
            info.version = (mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);
            // SAFETY: the handle comes from nvml-wrapper and lives as long as `dev`; `info` is a
            // valid, writable struct of the type the function expects, versioned as nvml.h says.
            let rc = unsafe { info_v(dev.handle(), index, &mut info) };
            match nvml_try(rc) {
                Ok(()) => {}
                Err(NvmlError::NotSupported) => continue,
                Err(NvmlError::InvalidArg) => break,
                Err(source) => {
                    return Err(DriverError::Gpu { gpu, call: "nvmlDeviceGetGpuInstanceProfileInfoV", source });
                }
            }
            // SAFETY: NVML NUL-terminates `name` within its 96 bytes.
            let name = unsafe { CStr::from_ptr(info.name.as_ptr()) }.to_string_lossy().into_owned();
            let name = name.strip_prefix("MIG ").unwrap_or(&name).to_string();

            let mut count = 0u32;
            // SAFETY: a NULL buffer asks only for the count, which NVML writes to `count`.
            let rc = unsafe { placements_v2(dev.handle(), info.id, std::ptr::null_mut(), &mut count) };
            nvml_try(rc).map_err(|source| DriverError::Gpu {
                gpu,
                call: "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
                source,
            })?;
            let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
            // SAFETY: `buf` holds `count` writable placements and NVML writes at most `count`.
            let rc = unsafe { placements_v2(dev.handle(), info.id, buf.as_mut_ptr(), &mut count) };
            nvml_try(rc).map_err(|source| DriverError::Gpu {
                gpu,
                call: "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
                source,
            })?;
            buf.truncate(count as usize);
            out.push(Profile {
                nvml_index: index,
                id: info.id,
                name,
                memory_mib: info.memorySizeMB,
                sm: info.multiprocessorCount,
                slices: info.sliceCount,
                max: info.instanceCount,
                copy_engines: info.copyEngineCount,
                decoders: info.decoderCount,
                encoders: info.encoderCount,
                jpegs: info.jpegCount,
                ofas: info.ofaCount,
                placements: buf.iter().map(|p| Placement { start: p.start, size: p.size }).collect(),
            });
        }
        // nvidia-smi's order: smallest first (1g, 1g+me, double-memory 1g, 2g, 3g, 4g, 7g).
        out.sort_by_key(|p| (p.slices, p.memory_mib, p.id));
        Ok(out)
    }

    /// Existing GPU instances, each with the UUID of its MIG device when it has one.
    fn instances(&self, dev: &Device, gpu: u32, profiles: &[Profile]) -> Result<Vec<GpuInstance>, DriverError> {
        if !matches!(dev.mig_mode(), Ok(m) if m.current == 1) {
            return Ok(Vec::new());
        }
        let lib = self.nvml.lib();
        let get_instances = nvml_sym(lib.nvmlDeviceGetGpuInstances.as_ref(), gpu, "nvmlDeviceGetGpuInstances")?;
        let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref(), gpu, "nvmlGpuInstanceGetInfo")?;
        let gi_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref(), gpu, "nvmlDeviceGetGpuInstanceId")?;
        let mig_uuids = self.mig_uuids(dev, gpu, *gi_id)?;
        let mut out = Vec::new();
        for profile in profiles {
            let mut handles: Vec<nvmlGpuInstance_t> = vec![std::ptr::null_mut(); profile.max.max(1) as usize];
            let mut count = 0u32;
            // SAFETY: `handles` has room for `max` instances, the most a profile can have.
            let rc = unsafe { get_instances(dev.handle(), profile.id, handles.as_mut_ptr(), &mut count) };
            nvml_try(rc).map_err(|source| DriverError::Gpu { gpu, call: "nvmlDeviceGetGpuInstances", source })?;
            for handle in handles.into_iter().take(count as usize) {
                // SAFETY: all-zero is a valid nvmlGpuInstanceInfo_t (a null device pointer and integers).
                let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
                // SAFETY: `handle` was just returned by NVML for this device; `info` is writable.
                let rc = unsafe { get_info(handle, &mut info) };
                nvml_try(rc).map_err(|source| DriverError::Gpu { gpu, call: "nvmlGpuInstanceGetInfo", source })?;
                out.push(GpuInstance {
                    id: info.id,
                    profile_id: info.profileId,
                    profile: profile.name.clone(),
                    start: info.placement.start,
                    size: info.placement.size,
                    memory_mib: profile.memory_mib,
                    uuid: mig_uuids.get(&info.id).cloned(),
                });
            }
        }
        out.sort_by_key(|i| (i.start, i.id));
        Ok(out)
    }

    /// GPU instance id -> MIG device UUID, by walking the parent's MIG device slots.
    fn mig_uuids(
        &self,
        dev: &Device,
        gpu: u32,
        gi_id: unsafe extern "C" fn(
            nvml_wrapper_sys::bindings::nvmlDevice_t,
            *mut u32,
        ) -> nvml_wrapper_sys::bindings::nvmlReturn_t,
    ) -> Result<HashMap<u32, String>, DriverError> {
        let max = dev.mig_device_count().map_err(|source| DriverError::Gpu {
            gpu,
            call: "nvmlDeviceGetMaxMigDeviceCount",
            source,
        })?;
        let mut out = HashMap::new();
        for slot in 0..max {
            let mig = match dev.mig_device_by_index(slot) {
                Ok(d) => d,
                Err(NvmlError::NotFound) => continue,
                Err(source) => {
                    return Err(DriverError::Gpu { gpu, call: "nvmlDeviceGetMigDeviceHandleByIndex", source });
                }
            };
            let mut id = 0u32;
            // SAFETY: `mig` is a MIG device handle NVML just returned; `id` is writable.
            let rc = unsafe { gi_id(mig.handle(), &mut id) };
            nvml_try(rc).map_err(|source| DriverError::Gpu { gpu, call: "nvmlDeviceGetGpuInstanceId", source })?;
            let uuid = mig.uuid().map_err(|source| DriverError::Gpu { gpu, call: "nvmlDeviceGetUUID", source })?;
            out.insert(id, uuid);
        }
        Ok(out)
    }
}

fn nvml_sym<'a, T, E>(sym: Result<&'a T, E>, gpu: u32, call: &'static str) -> Result<&'a T, DriverError> {
    sym.map_err(|_| DriverError::Gpu { gpu, call, source: NvmlError::FailedToLoadSymbol(call.to_string()) })
}

fn processes(dev: &Device) -> Result<Vec<GpuProcess>, NvmlError> {
    let mps: Vec<u32> = match dev.mps_running_compute_processes() {
        Ok(list) => list.iter().map(|p| p.pid).collect(),
        Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(dev
        .running_compute_processes()?
        .into_iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            used_mib: match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => bytes / MIB,
                UsedGpuMemory::Unavailable => 0,
            },
            gpu_instance_id: p.gpu_instance_id,
            mps_client: mps.contains(&p.pid),
        })
        .collect())
}

impl NvmlDriver {
    fn device(&self, gpu: u32) -> Result<Device<'_>, DriverError> {
        self.nvml.device_by_index(gpu).map_err(|source| DriverError::Gpu {
            gpu,
            call: "nvmlDeviceGetHandleByIndex_v2",
            source,
        })
    }

    fn gpu_instance(&self, dev: &Device, gpu: u32, gi: u32) -> Result<nvmlGpuInstance_t, DriverError> {
        let by_id =
            nvml_sym(self.nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref(), gpu, "nvmlDeviceGetGpuInstanceById")?;
        let mut handle: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: the device handle is valid while `dev` lives; `handle` is writable.
        let rc = unsafe { by_id(dev.handle(), gi, &mut handle) };
        nvml_try(rc).map_err(|source| DriverError::Gpu { gpu, call: "nvmlDeviceGetGpuInstanceById", source })?;
        Ok(handle)
    }

    /// The compute-instance profiles a GPU instance offers (shared engines), largest last.
    fn compute_profiles(
        &self,
        handle: nvmlGpuInstance_t,
        gpu: u32,
    ) -> Result<Vec<nvmlComputeInstanceProfileInfo_t>, DriverError> {
        let info_fn = nvml_sym(
            self.nvml.lib().nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref(),
            gpu,
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        )?;
        let mut out = Vec::new();
        for index in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            // SAFETY: all-zero is a valid nvmlComputeInstanceProfileInfo_t (integers only).
            let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
            // SAFETY: `handle` is a GPU instance NVML just returned; `info` is writable.
            let rc = unsafe { info_fn(handle, index, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut info) };
            match nvml_try(rc) {
                Ok(()) => out.push(info),
                Err(NvmlError::NotSupported) => continue,
                Err(NvmlError::InvalidArg) => break,
                Err(source) => {
                    return Err(DriverError::Gpu { gpu, call: "nvmlGpuInstanceGetComputeInstanceProfileInfo", source });
                }
            }
        }
        out.sort_by_key(|i| i.sliceCount);
        Ok(out)
    }
}

impl GpuDriver for NvmlDriver {
    fn inventory(&self) -> Result<Inventory, DriverError> {
        let driver_version = self
            .nvml
            .sys_driver_version()
            .map_err(|source| DriverError::Host { call: "nvmlSystemGetDriverVersion", source })?;
        let count =
            self.nvml.device_count().map_err(|source| DriverError::Host { call: "nvmlDeviceGetCount_v2", source })?;
        let mut inventory = Inventory { driver_version, ..Inventory::default() };
        for index in 0..count {
            match self.gpu(index) {
                Ok(gpu) => inventory.gpus.push(gpu),
                Err(e) => {
                    tracing::warn!(gpu = index, error = %e, "GPU unavailable");
                    inventory.unavailable.push(crate::inventory::Unavailable { index, error: e.to_string() });
                }
            }
        }
        Ok(inventory)
    }

    fn set_mig_mode(&self, gpu: u32, enable: bool) -> Result<MigMode, DriverError> {
        let dev = self.device(gpu)?;
        // The activation status says whether the reset that makes the mode current happened; the
        // mode read back afterwards says the same, and is what the caller acts on.
        dev.set_mig_mode(enable).map_err(|source| DriverError::Gpu { gpu, call: "nvmlDeviceSetMigMode", source })?;
        let mode = dev.mig_mode().map_err(|source| DriverError::Gpu { gpu, call: "nvmlDeviceGetMigMode", source })?;
        Ok(MigMode { current: mode.current == 1, pending: mode.pending == 1 })
    }

    fn create_gpu_instance(&self, gpu: u32, profile_id: u32, start: u32, size: u32) -> Result<u32, DriverError> {
        let dev = self.device(gpu)?;
        let lib = self.nvml.lib();
        let create = nvml_sym(
            lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref(),
            gpu,
            "nvmlDeviceCreateGpuInstanceWithPlacement",
        )?;
        let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref(), gpu, "nvmlGpuInstanceGetInfo")?;
        let placement = nvmlGpuInstancePlacement_t { start, size };
        let mut handle: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: valid device handle; `placement` is read and `handle` written, both live across the call.
        let rc = unsafe { create(dev.handle(), profile_id, &placement, &mut handle) };
        nvml_try(rc).map_err(|source| DriverError::Gpu {
            gpu,
            call: "nvmlDeviceCreateGpuInstanceWithPlacement",
            source,
        })?;
        // SAFETY: all-zero is a valid nvmlGpuInstanceInfo_t (a null pointer and integers).
        let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
        // SAFETY: `handle` was just created by NVML; `info` is writable.
        let rc = unsafe { get_info(handle, &mut info) };
        nvml_try(rc).map_err(|source| DriverError::Gpu { gpu, call: "nvmlGpuInstanceGetInfo", source })?;
        Ok(info.id)
    }

    fn create_compute_instance(&self, gpu: u32, gi: u32) -> Result<(), DriverError> {
        let dev = self.device(gpu)?;
        let handle = self.gpu_instance(&dev, gpu, gi)?;
        let full = self.compute_profiles(handle, gpu)?.pop().ok_or(DriverError::Gpu {
            gpu,
            call: "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            source: NvmlError::NotSupported,
        })?;
        let create = nvml_sym(
            self.nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref(),
            gpu,
            "nvmlGpuInstanceCreateComputeInstance",
        )?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `handle` is a live GPU instance; `ci` is writable.
        let rc = unsafe { create(handle, full.id, &mut ci) };
        nvml_try(rc).map_err(|source| DriverError::Gpu { gpu, call: "nvmlGpuInstanceCreateComputeInstance", source })
    }

    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), DriverError> {
        let dev = self.device(gpu)?;
        let handle = self.gpu_instance(&dev, gpu, gi)?;
        let lib = self.nvml.lib();
        let list =
            nvml_sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref(), gpu, "nvmlGpuInstanceGetComputeInstances")?;
        let destroy_ci = nvml_sym(lib.nvmlComputeInstanceDestroy.as_ref(), gpu, "nvmlComputeInstanceDestroy")?;
        let destroy_gi = nvml_sym(lib.nvmlGpuInstanceDestroy.as_ref(), gpu, "nvmlGpuInstanceDestroy")?;
        // Compute instances first: a GPU instance that still has one answers IN_USE.
        for profile in self.compute_profiles(handle, gpu)? {
            let mut cis: Vec<nvmlComputeInstance_t> = vec![std::ptr::null_mut(); profile.instanceCount.max(1) as usize];
            let mut count = 0u32;
            // SAFETY: `cis` has room for the profile's instanceCount, the most NVML returns.
            let rc = unsafe { list(handle, profile.id, cis.as_mut_ptr(), &mut count) };
            nvml_try(rc).map_err(|source| DriverError::Gpu {
                gpu,
                call: "nvmlGpuInstanceGetComputeInstances",
                source,
            })?;
            for ci in cis.into_iter().take(count as usize) {
                // SAFETY: `ci` was just listed by NVML for this GPU instance.
                let rc = unsafe { destroy_ci(ci) };
                nvml_try(rc).map_err(|source| DriverError::Gpu { gpu, call: "nvmlComputeInstanceDestroy", source })?;
            }
        }
        // SAFETY: `handle` is a live GPU instance with no compute instance left.
        let rc = unsafe { destroy_gi(handle) };
        nvml_try(rc).map_err(|source| DriverError::Gpu { gpu, call: "nvmlGpuInstanceDestroy", source })
    }
}
