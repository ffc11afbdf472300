//! [`GpuDriver`] over NVML. Most calls go through nvml-wrapper's safe API; the MIG calls it does
//! not wrap (or wraps wrongly: `possible_placements` in 0.13 always returns an empty list) go
//! through its raw function table, `Nvml::lib()`.

use super::{DriverError, GpuDriver};
use crate::inventory::{ComputeMode as Mode, Gpu, GpuInstance, GpuProcess, Inventory, Placement, Profile};
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    NVML_GPU_INSTANCE_PROFILE_COUNT, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_v2_t,
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

impl GpuDriver for NvmlDriver {
    fn inventory(&self) -> Result<Inventory, DriverError> {
        let driver_version = self
            .nvml
            .sys_driver_version()
            .map_err(|source| DriverError::Host { call: "nvmlSystemGetDriverVersion", source })?;
        let count =
            self.nvml.device_count().map_err(|source| DriverError::Host { call: "nvmlDeviceGetCount_v2", source })?;
        let gpus = (0..count).map(|i| self.gpu(i)).collect::<Result<_, _>>()?;
        Ok(Inventory { driver_version, gpus })
    }
}
