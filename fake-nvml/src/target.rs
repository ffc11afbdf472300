//! Resolving handles against the state just read: which GPU, GPU instance, compute instance or
//! MIG device a call is about, or `INVALID_ARGUMENT` for a handle that names nothing (any more).
//!
//! Unverified: real NVML's answer when a MIG device handle is passed to a whole-GPU call (PCI
//! info, MIG mode, profiles...) or a GPU handle to a MIG-only call. We answer
//! `INVALID_ARGUMENT` both ways.

use crate::handles::{self, Device};
use crate::ret::{INVALID_ARGUMENT, Res, UNKNOWN};
use gpu_sim::products::{Product, ProfileRow};
use gpu_sim::{SimGpu, SimGpuInstance, SimHost};
use nvml_wrapper_sys::bindings::{nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstance_t};

/// A whole GPU of the host.
#[derive(Clone, Copy)]
pub struct Gpu<'h> {
    /// Position in the state's GPU list: the NVML index.
    pub index: u32,
    pub sim: &'h SimGpu,
}

/// A MIG device: a GPU instance that has its compute instance (a `mig_uuid`).
#[derive(Clone, Copy)]
pub struct Mig<'h> {
    pub gpu: Gpu<'h>,
    pub instance: &'h SimGpuInstance,
}

/// What a device handle resolved to.
#[derive(Clone, Copy)]
pub enum Target<'h> {
    Gpu(Gpu<'h>),
    Mig(Mig<'h>),
}

pub fn gpu(host: &SimHost, index: u32) -> Option<Gpu<'_>> {
    host.gpus.get(index as usize).map(|sim| Gpu { index, sim })
}

pub fn gpus(host: &SimHost) -> impl Iterator<Item = Gpu<'_>> {
    host.gpus.iter().zip(0..).map(|(sim, index)| Gpu { index, sim })
}

/// Any device handle: a GPU or one of its current MIG devices.
pub fn resolve(host: &SimHost, handle: nvmlDevice_t) -> Res<Target<'_>> {
    match Device::decode(handle).ok_or(INVALID_ARGUMENT)? {
        Device::Gpu(index) => gpu(host, index).map(Target::Gpu).ok_or(INVALID_ARGUMENT),
        Device::Mig { gpu: index, gi } => {
            let gpu = gpu(host, index).ok_or(INVALID_ARGUMENT)?;
            gpu.mig_devices().find(|m| m.instance.id == gi).map(Target::Mig).ok_or(INVALID_ARGUMENT)
        }
    }
}

/// A handle that must name a whole GPU.
pub fn resolve_gpu(host: &SimHost, handle: nvmlDevice_t) -> Res<Gpu<'_>> {
    resolve(host, handle)?.whole_gpu()
}

/// A GPU instance handle whose instance still exists.
pub fn resolve_gpu_instance(host: &SimHost, handle: nvmlGpuInstance_t) -> Res<(Gpu<'_>, &SimGpuInstance)> {
    let handles::GpuInstance { gpu: index, gi } = handles::GpuInstance::decode(handle).ok_or(INVALID_ARGUMENT)?;
    let gpu = gpu(host, index).ok_or(INVALID_ARGUMENT)?;
    let instance = gpu.instances().iter().find(|i| i.id == gi).ok_or(INVALID_ARGUMENT)?;
    Ok((gpu, instance))
}

/// A compute instance handle whose GPU instance still exists and still has its compute
/// instance.
pub fn resolve_compute_instance(host: &SimHost, handle: nvmlComputeInstance_t) -> Res<(Gpu<'_>, &SimGpuInstance)> {
    let handles::ComputeInstance { gpu: index, gi } =
        handles::ComputeInstance::decode(handle).ok_or(INVALID_ARGUMENT)?;
    let gpu = gpu(host, index).ok_or(INVALID_ARGUMENT)?;
    let instance = gpu.instances().iter().find(|i| i.id == gi && i.mig_uuid.is_some()).ok_or(INVALID_ARGUMENT)?;
    Ok((gpu, instance))
}

impl<'h> Target<'h> {
    /// The GPU, for a call that takes only whole GPUs.
    pub fn whole_gpu(self) -> Res<Gpu<'h>> {
        match self {
            Target::Gpu(gpu) => Ok(gpu),
            Target::Mig(_) => Err(INVALID_ARGUMENT),
        }
    }

    /// The whole GPU (the parent, for a MIG device).
    pub fn gpu(self) -> Gpu<'h> {
        match self {
            Target::Gpu(gpu) => gpu,
            Target::Mig(mig) => mig.gpu,
        }
    }

    /// The GPU instance, for a MIG device.
    pub fn instance(self) -> Option<&'h SimGpuInstance> {
        match self {
            Target::Gpu(_) => None,
            Target::Mig(mig) => Some(mig.instance),
        }
    }
}

impl<'h> Gpu<'h> {
    pub fn product(self) -> &'static Product {
        self.sim.product()
    }

    pub fn handle(self) -> Res<nvmlDevice_t> {
        Device::Gpu(self.index).encode().ok_or(UNKNOWN)
    }

    /// The GPU instances that exist. With MIG mode (current) off there are none, whatever the
    /// state file lists: the probe shows `nvmlDeviceGetGpuInstances` answering 0 then.
    pub fn instances(self) -> &'h [SimGpuInstance] {
        if self.sim.mig_current { &self.sim.instances } else { &[] }
    }

    /// MIG devices in `nvmlDeviceGetMigDeviceHandleByIndex` order: by GPU instance id
    /// (unverified: the real order is not in the probe).
    pub fn mig_devices(self) -> impl Iterator<Item = Mig<'h>> {
        let mut instances: Vec<&'h SimGpuInstance> = self.instances().iter().filter(|i| i.mig_uuid.is_some()).collect();
        instances.sort_by_key(|i| i.id);
        instances.into_iter().map(move |instance| Mig { gpu: self, instance })
    }

    /// The most MIG devices this GPU can hold: 0 with MIG off, else the most instances of any
    /// one profile (7 on 8-slice parts, 4 on the A30).
    pub fn max_mig_devices(self) -> u32 {
        if !self.sim.mig_current {
            return 0;
        }
        self.product().profiles.iter().map(|row| row.max).max().unwrap_or(0)
    }
}

impl<'h> Mig<'h> {
    pub fn handle(self) -> Res<nvmlDevice_t> {
        Device::Mig { gpu: self.gpu.index, gi: self.instance.id }.encode().ok_or(UNKNOWN)
    }

    /// The instance's profile row; an instance of a profile its product lacks is a broken state
    /// file (`UNKNOWN`).
    pub fn profile(self) -> Res<&'static ProfileRow> {
        self.gpu.product().profile_by_id(self.instance.profile_id).ok_or(UNKNOWN)
    }

    pub fn uuid(self) -> &'h str {
        self.instance.mig_uuid.as_deref().unwrap_or_default()
    }
}
