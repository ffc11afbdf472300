//! Registering processes in the simulated NVML state (gpu-sim's `SimHost` file), as the real
//! driver would list them: MPS servers here, test workers through `testworker`. Both find their
//! GPU the way CUDA does, from `CUDA_VISIBLE_DEVICES`.

use gpu_sim::{SimHost, SimProcess, state::StateError};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("no simulated GPU or MIG device matches CUDA_VISIBLE_DEVICES={0:?}")]
    NoDevice(String),
}

/// Where a device named by `CUDA_VISIBLE_DEVICES` lives: the GPU's position in `host.gpus` and,
/// for a `MIG-...` UUID, its GPU instance id. Accepts a GPU or MIG UUID or a GPU index;
/// `None` (variable unset) means GPU 0, as CUDA would pick.
pub fn locate(host: &SimHost, device: Option<&str>) -> Option<(usize, Option<u32>)> {
    let Some(device) = device.map(str::trim).filter(|d| !d.is_empty()) else {
        return (!host.gpus.is_empty()).then_some((0, None));
    };
    for (i, gpu) in host.gpus.iter().enumerate() {
        if gpu.uuid == device {
            return Some((i, None));
        }
        if let Some(gi) = gpu.instances.iter().find(|gi| gi.mig_uuid.as_deref() == Some(device)) {
            return Some((i, Some(gi.id)));
        }
    }
    let index: u32 = device.parse().ok()?;
    host.gpus.iter().position(|g| g.index == index).map(|i| (i, None))
}

/// Adds `process` on the device (replacing an entry with the same pid anywhere); the GPU
/// instance id comes from the device, whatever `process` says.
pub fn register(state: &Path, device: Option<&str>, mut process: SimProcess) -> Result<(), SimError> {
    SimHost::update(state, |host| {
        let (gpu, instance) = locate(host, device).ok_or_else(|| SimError::NoDevice(device.unwrap_or("").into()))?;
        for g in &mut host.gpus {
            g.processes.retain(|p| p.pid != process.pid);
        }
        process.gpu_instance_id = instance;
        host.gpus[gpu].processes.push(process);
        Ok(())
    })?
}

/// Sets the memory a registered process claims; `false` when it is not registered.
pub fn set_used(state: &Path, pid: u32, used_mib: u64) -> Result<bool, SimError> {
    let found = SimHost::update(state, |host| {
        let entry = host.gpus.iter_mut().flat_map(|g| g.processes.iter_mut()).find(|p| p.pid == pid);
        match entry {
            Some(p) => {
                p.used_mib = used_mib;
                Ok(true)
            }
            None => Err(()),
        }
    })?;
    Ok(found.unwrap_or(false))
}

/// Removes every entry of `pid`.
pub fn unregister(state: &Path, pid: u32) -> Result<(), SimError> {
    SimHost::update(state, |host| {
        for g in &mut host.gpus {
            g.processes.retain(|p| p.pid != pid);
        }
        Ok::<_, ()>(())
    })?
    .ok();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_sim::SimGpuInstance;

    fn host_with_mig() -> SimHost {
        let mut host = SimHost::new(&"h200:2".parse().unwrap());
        host.gpus[1].instances.push(SimGpuInstance {
            id: 5,
            profile_id: 19,
            start: 0,
            size: 1,
            mig_uuid: Some("MIG-abc".into()),
        });
        host
    }

    #[test]
    fn locates_by_uuid_mig_uuid_and_index() {
        let host = host_with_mig();
        let gpu1 = host.gpus[1].uuid.clone();
        assert_eq!(locate(&host, Some(&gpu1)), Some((1, None)));
        assert_eq!(locate(&host, Some("MIG-abc")), Some((1, Some(5))));
        assert_eq!(locate(&host, Some("1")), Some((1, None)));
        assert_eq!(locate(&host, None), Some((0, None)));
        assert_eq!(locate(&host, Some("GPU-nope")), None);
        assert_eq!(locate(&host, Some("7")), None);
    }

    #[test]
    fn register_update_unregister() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvml.json");
        SimHost::prepare(&path, &"h200:2".parse().unwrap()).unwrap();
        SimHost::update(&path, |h| {
            *h = host_with_mig();
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
        let proc = SimProcess { pid: 42, used_mib: 66, gpu_instance_id: None, mps_client: false };
        register(&path, Some("MIG-abc"), proc.clone()).unwrap();
        let host = SimHost::load(&path).unwrap();
        assert_eq!(host.gpus[1].processes, [SimProcess { gpu_instance_id: Some(5), ..proc.clone() }]);
        assert!(set_used(&path, 42, 100).unwrap());
        assert!(!set_used(&path, 43, 100).unwrap());
        assert_eq!(SimHost::load(&path).unwrap().gpus[1].processes[0].used_mib, 100);
        assert!(matches!(register(&path, Some("GPU-nope"), proc), Err(SimError::NoDevice(_))));
        unregister(&path, 42).unwrap();
        assert!(SimHost::load(&path).unwrap().gpus.iter().all(|g| g.processes.is_empty()));
    }
}
