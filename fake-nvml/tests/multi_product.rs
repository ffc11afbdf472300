//! A mixed host, `a100-40gb:2,h100-80gb:2`: the fake answers per GPU from the product table and
//! from the state file as it is at each call (processes, MIG mode, instances).

mod common;

use common::*;
use gpu_sim::products::{self, index::COUNT as PROFILE_INDEX_COUNT};
use gpu_sim::{SimGpuInstance, SimHost, SimProcess};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::nvmlDevice_t;
use std::path::Path;
use std::ptr;

const SPEC: &str = "a100-40gb:2,h100-80gb:2";
const MIG_UUID: &str = "MIG-5b5a4c8e-1f7a-5c0e-9d43-0123456789ab";

fn handle(device: &nvml_wrapper::Device) -> nvmlDevice_t {
    // SAFETY: the handle is only passed back to the library that made it.
    unsafe { device.handle() }
}

fn update(state: &Path, f: impl FnOnce(&mut SimHost)) {
    SimHost::update(state, |h| {
        f(h);
        Ok::<_, ()>(())
    })
    .unwrap()
    .unwrap();
}

#[test]
fn mixed_host_answers_from_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim/nvml.json");

    check_init_failures(&state);
    let host = SimHost::prepare(&state, &SPEC.parse().unwrap()).unwrap();
    use_state(&state);
    check_uninitialized_and_refcount();

    let first = {
        let nvml = init();
        check_devices(&nvml, &host);
        check_profiles(&nvml, &host);
        check_processes(&nvml, &state);
        check_mig(&nvml, &state);
        uuids(&nvml)
    };
    // A re-init (a restarted agent) sees the same GPUs.
    let nvml = init();
    assert_eq!(uuids(&nvml), first);
    assert_eq!(first, host.gpus.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>());
}

fn uuids(nvml: &Nvml) -> Vec<String> {
    (0..nvml.device_count().unwrap()).map(|i| nvml.device_by_index(i).unwrap().uuid().unwrap()).collect()
}

/// No state: the driver "is not loaded".
fn check_init_failures(state: &Path) {
    let lib = cdylib();
    // SAFETY: one #[test] in this file; no other thread reads the environment.
    unsafe { std::env::remove_var(gpu_sim::STATE_ENV) };
    let unset = Nvml::builder().lib_path(lib.as_os_str()).init();
    assert!(matches!(unset, Err(NvmlError::DriverNotLoaded)), "{unset:?}");
    use_state(state); // does not exist yet
    let missing = Nvml::builder().lib_path(lib.as_os_str()).init();
    assert!(matches!(missing, Err(NvmlError::DriverNotLoaded)), "{missing:?}");
    assert!(!state.parent().unwrap().exists(), "a failed init leaves no lock file behind");
}

/// Calls before init are UNINITIALIZED; init and shutdown are reference counted.
fn check_uninitialized_and_refcount() {
    let lib = raw_lib();
    let count = |lib: &nvml_wrapper_sys::bindings::NvmlLib| {
        let mut n = 0;
        // SAFETY: `n` is a live local.
        let rc = unsafe { lib.nvmlDeviceGetCount_v2.as_ref().unwrap()(&mut n) };
        (rc, n)
    };
    let init = lib.nvmlInit_v2.as_ref().unwrap();
    let shutdown = lib.nvmlShutdown.as_ref().unwrap();
    // SAFETY: NVML calls without arguments.
    unsafe {
        assert_eq!(count(&lib), (1, 0), "before init: UNINITIALIZED");
        assert_eq!(shutdown(), 1, "shutdown before init: UNINITIALIZED");
        assert_eq!(init(), SUCCESS);
        assert_eq!(init(), SUCCESS);
        assert_eq!(count(&lib), (SUCCESS, 4));
        assert_eq!(shutdown(), SUCCESS);
        assert_eq!(count(&lib), (SUCCESS, 4), "one init still holds");
        assert_eq!(shutdown(), SUCCESS);
        assert_eq!(count(&lib), (1, 0), "after the last shutdown: UNINITIALIZED");
    }
    // Null output pointers are INVALID_ARGUMENT.
    // SAFETY: NVML calls; the null pointers are the point.
    unsafe {
        assert_eq!(init(), SUCCESS);
        assert_eq!(lib.nvmlDeviceGetCount_v2.as_ref().unwrap()(ptr::null_mut()), INVALID_ARGUMENT);
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2.as_ref().unwrap()(0, ptr::null_mut()), INVALID_ARGUMENT);
        assert_eq!(shutdown(), SUCCESS);
    }
}

fn check_devices(nvml: &Nvml, host: &SimHost) {
    assert_eq!(nvml.device_count().unwrap(), 4);
    let names = ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"];
    let mut serials = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let device = nvml.device_by_index(i as u32).unwrap();
        let sim = &host.gpus[i];
        let product = products::find(&sim.product).unwrap();
        assert_eq!(device.name().unwrap(), *name, "GPU {i}");
        assert_eq!(device.index().unwrap(), i as u32);
        assert_eq!(device.uuid().unwrap(), sim.uuid);
        let pci = device.pci_info().unwrap();
        assert_eq!(pci.bus_id, sim.bus_id);
        assert_eq!(pci.pci_device_id, product.pci_device_id);
        assert_eq!(nvml.device_by_uuid(sim.uuid.as_str()).unwrap().index().unwrap(), i as u32);
        let legacy = &sim.bus_id[4..]; // "0000:28:00.0"
        assert_eq!(nvml.device_by_pci_bus_id(legacy).unwrap().index().unwrap(), i as u32);
        let memory = device.memory_info().unwrap();
        assert_eq!(memory.total, product.memory_mib * MIB, "GPU {i}");
        assert_eq!(memory.reserved, product.reserved_kib * 1024, "GPU {i}");
        assert_eq!(memory.used, 0);
        let cc = device.cuda_compute_capability().unwrap();
        assert_eq!((cc.major, cc.minor), product.compute_capability);
        assert_eq!(device.mig_device_count().unwrap(), 0, "MIG off");
        serials.push(device.serial().unwrap());
    }
    let distinct: std::collections::BTreeSet<&String> = serials.iter().collect();
    assert_eq!(distinct.len(), 4, "distinct serials {serials:?}");
    let by_bus = nvml.device_by_pci_bus_id("00000000:99:00.0");
    assert!(matches!(by_bus, Err(NvmlError::NotFound)), "{by_bus:?}");
    assert!(matches!(nvml.device_by_index(4), Err(NvmlError::InvalidArg)));
}

/// Every profile index answers the GPU's own product row: A100 and H100 share ids, not sizes.
fn check_profiles(nvml: &Nvml, host: &SimHost) {
    for (i, sim) in host.gpus.iter().enumerate() {
        let product = products::find(&sim.product).unwrap();
        let device = nvml.device_by_index(i as u32).unwrap();
        for index in 0..PROFILE_INDEX_COUNT + 2 {
            let got = device.profile_info(index);
            match product.profile_by_index(index) {
                Some(row) => {
                    let info = got.unwrap_or_else(|e| panic!("GPU {i} index {index}: {e:?}"));
                    assert_eq!(
                        (info.id, info.memory_size_mb, info.multiprocessor_count, info.instance_count),
                        (row.id, row.memory_mib, row.sm, row.max),
                        "GPU {i} index {index}"
                    );
                    let (_, name) = profile_info_v(nvml, handle(&device), index).unwrap();
                    assert_eq!(name, format!("MIG {}", row.name));
                    let starts: Vec<(u32, u32)> = row.starts.iter().map(|&s| (s, row.size)).collect();
                    assert_eq!(placements(nvml, handle(&device), row.id), Ok(starts));
                }
                None if index < PROFILE_INDEX_COUNT => {
                    assert!(matches!(got, Err(NvmlError::NotSupported)), "GPU {i} index {index}: {got:?}")
                }
                None => assert!(matches!(got, Err(NvmlError::InvalidArg)), "GPU {i} index {index}: {got:?}"),
            }
        }
    }
    let a100 = nvml.device_by_index(0).unwrap();
    let h100 = nvml.device_by_index(2).unwrap();
    assert_eq!(profile_info_v(nvml, handle(&a100), 0).unwrap().1, "MIG 1g.5gb");
    assert_eq!(profile_info_v(nvml, handle(&h100), 0).unwrap().1, "MIG 1g.10gb");
    assert_eq!(a100.profile_info(4).unwrap().memory_size_mb, 40192);
    assert_eq!(h100.profile_info(4).unwrap().memory_size_mb, 81152);
    assert_eq!(placements(nvml, handle(&a100), 21), Err(INVALID_ARGUMENT), "an A30-only id");
}

fn check_processes(nvml: &Nvml, state: &Path) {
    let me = std::process::id();
    let dead = dead_pid();
    let sleeper = Sleeper::spawn();
    update(state, |h| {
        h.gpus[2].processes = vec![
            SimProcess { pid: me, used_mib: 1000, gpu_instance_id: None, mps_client: false },
            SimProcess { pid: dead, used_mib: 5000, gpu_instance_id: None, mps_client: false },
            SimProcess { pid: sleeper.pid(), used_mib: 300, gpu_instance_id: None, mps_client: true },
        ];
    });
    let h100 = nvml.device_by_index(2).unwrap();
    let procs = h100.running_compute_processes().unwrap();
    let got: Vec<(u32, UsedGpuMemory, Option<u32>)> =
        procs.iter().map(|p| (p.pid, p.used_gpu_memory.clone(), p.gpu_instance_id)).collect();
    assert_eq!(
        got,
        vec![(me, UsedGpuMemory::Used(1000 * MIB), None), (sleeper.pid(), UsedGpuMemory::Used(300 * MIB), None)],
        "the dead pid {dead} must not show"
    );
    assert_eq!(h100.running_compute_processes_count().unwrap(), 2);
    let mps: Vec<u32> = h100.mps_running_compute_processes().unwrap().iter().map(|p| p.pid).collect();
    assert_eq!(mps, vec![sleeper.pid()]);

    let product = products::find("h100-80gb").unwrap();
    let memory = h100.memory_info().unwrap();
    assert_eq!(memory.used, 1300 * MIB, "v2 used: live processes only");
    assert_eq!(memory.free, (product.memory_mib - 1300) * MIB - product.reserved_kib * 1024);
    let v1 = memory_v1(nvml, handle(&h100));
    assert_eq!(v1.used, product.reserved_kib * 1024 + 1300 * MIB, "v1 used counts reserved");
    assert_eq!(v1.free, v1.total - v1.used);

    // Other GPUs are unaffected.
    assert!(nvml.device_by_index(3).unwrap().running_compute_processes().unwrap().is_empty());

    // A too-small buffer: INSUFFICIENT_SIZE with the count.
    let sym = nvml.lib().nvmlDeviceGetComputeRunningProcesses_v3.as_ref().unwrap();
    // SAFETY: a plain C struct; all zeroes is a valid value.
    let mut one = [unsafe { std::mem::zeroed() }; 1];
    let mut count = 1;
    // SAFETY: `one` holds `count` entries.
    let rc = unsafe { sym(handle(&h100), &mut count, one.as_mut_ptr()) };
    assert_eq!((rc, count), (INSUFFICIENT_SIZE, 2));

    drop(sleeper);
    assert_eq!(h100.memory_info().unwrap().used, 1000 * MIB, "the sleeper's memory is freed");
    update(state, |h| h.gpus[2].processes.clear());
}

fn check_mig(nvml: &Nvml, state: &Path) {
    let h100 = nvml.device_by_index(3).unwrap();
    let dev = handle(&h100);
    update(state, |h| {
        h.gpus[3].mig_current = true;
        h.gpus[3].mig_pending = true;
    });
    let mode = h100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(h100.mig_device_count().unwrap(), 7);
    assert_eq!(nvml.device_by_index(0).unwrap().mig_device_count().unwrap(), 0, "GPU 0 still off");
    assert_eq!(gpu_instances(nvml, dev, 9), Ok(vec![]));
    assert!(matches!(h100.mig_device_by_index(0), Err(NvmlError::NotFound)), "nothing created yet");

    // A 3g.40gb instance at slices 4..8 with its compute instance, and a 1g.10gb without one.
    update(state, |h| {
        h.gpus[3].instances = vec![
            SimGpuInstance { id: 2, profile_id: 9, start: 4, size: 4, mig_uuid: Some(MIG_UUID.to_string()) },
            SimGpuInstance { id: 7, profile_id: 19, start: 0, size: 1, mig_uuid: None },
        ];
    });
    let instances = gpu_instances(nvml, dev, 9).unwrap();
    assert_eq!(instances.len(), 1);
    let info = gpu_instance_info(nvml, instances[0]).unwrap();
    assert_eq!((info.device, info.id, info.profileId), (dev, 2, 9));
    assert_eq!((info.placement.start, info.placement.size), (4, 4));
    assert_eq!(gpu_instances(nvml, dev, 19).map(|v| v.len()), Ok(1));
    assert_eq!(gpu_instances(nvml, dev, 0), Ok(vec![]));
    let mut by_id = ptr::null_mut();
    let sym = nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref().unwrap();
    // SAFETY: a live out pointer.
    assert_eq!(unsafe { sym(dev, 2, &mut by_id) }, SUCCESS);
    assert_eq!(by_id, instances[0]);
    // SAFETY: a live out pointer.
    assert_eq!(unsafe { sym(dev, 3, &mut by_id) }, NOT_FOUND);

    // Remaining capacity beside the 3g (4..8) and the 1g (0).
    let remaining = |id| remaining_capacity(nvml, dev, id);
    assert_eq!(remaining(19), Ok(3), "1g at 1, 2, 3");
    assert_eq!(remaining(14), Ok(1), "2g at 2");
    assert_eq!(remaining(9), Ok(0));
    assert_eq!(remaining(0), Ok(0));

    // The MIG device: found by index and by UUID, with its own identity.
    let mig = h100.mig_device_by_index(0).unwrap();
    assert_eq!(mig.uuid().unwrap(), MIG_UUID);
    assert!(mig.mig_is_mig_device_handle().unwrap());
    assert!(!h100.mig_is_mig_device_handle().unwrap());
    assert_eq!(mig.mig_parent_device().unwrap().uuid().unwrap(), h100.uuid().unwrap());
    assert_eq!(mig.name().unwrap(), "NVIDIA H100 80GB HBM3 MIG 3g.40gb");
    assert_eq!(mig.memory_info().unwrap().total, 40448 * MIB);
    let lib = nvml.lib();
    assert_eq!(raw_u32(lib.nvmlDeviceGetGpuInstanceId.as_ref().unwrap(), handle(&mig)), Ok(2));
    assert_eq!(raw_u32(lib.nvmlDeviceGetComputeInstanceId.as_ref().unwrap(), handle(&mig)), Ok(0));
    assert_eq!(raw_u32(lib.nvmlDeviceGetGpuInstanceId.as_ref().unwrap(), dev), Err(INVALID_ARGUMENT));
    let by_uuid = nvml.device_by_uuid(MIG_UUID).unwrap();
    assert_eq!(handle(&by_uuid), handle(&mig));
    assert!(matches!(h100.mig_device_by_index(1), Err(NvmlError::NotFound)), "empty slot");
    assert!(matches!(h100.mig_device_by_index(7), Err(NvmlError::InvalidArg)), "past the max");
    assert!(matches!(mig.pci_info(), Err(NvmlError::InvalidArg)), "a whole-GPU call");

    // Processes in the instance show on the MIG device, with their instance ids; others not.
    let me = std::process::id();
    update(state, |h| {
        h.gpus[3].processes = vec![
            SimProcess { pid: me, used_mib: 512, gpu_instance_id: Some(2), mps_client: false },
            SimProcess { pid: me, used_mib: 128, gpu_instance_id: Some(7), mps_client: false },
        ];
    });
    let on_mig = mig.running_compute_processes().unwrap();
    assert_eq!(on_mig.len(), 1);
    assert_eq!(on_mig[0].used_gpu_memory, UsedGpuMemory::Used(512 * MIB));
    assert_eq!((on_mig[0].gpu_instance_id, on_mig[0].compute_instance_id), (Some(2), Some(0)));
    assert_eq!(mig.memory_info().unwrap().used, 512 * MIB);
    assert_eq!(h100.running_compute_processes().unwrap().len(), 2, "the whole GPU shows both");

    // Destroyed in the state: the handle goes stale, the UUID unknown.
    update(state, |h| {
        h.gpus[3].instances.clear();
        h.gpus[3].processes.clear();
    });
    assert!(matches!(mig.uuid(), Err(NvmlError::InvalidArg)), "stale MIG handle");
    assert!(matches!(nvml.device_by_uuid(MIG_UUID), Err(NvmlError::NotFound)));
    assert_eq!(gpu_instance_info(nvml, instances[0]).err(), Some(INVALID_ARGUMENT));
    assert_eq!(remaining(9), Ok(2));
}
