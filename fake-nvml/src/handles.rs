//! Opaque NVML handles. A handle is a small integer cast to a pointer; nobody (neither we nor
//! the caller) ever dereferences it. Decoding only says what a handle names: whether that GPU,
//! instance or MIG device still exists is checked against the state (see `target`).
//!
//! | handle                            | value                             |
//! |-----------------------------------|-----------------------------------|
//! | GPU `i`                           | `0x1000 + i`                      |
//! | MIG device (GPU, GI id)           | `0x10_0000 + gpu * 0x100 + gi`    |
//! | GPU instance (GPU, GI id)         | `0x20_0000 + gpu * 0x100 + gi`    |
//! | compute instance (GPU, its GI id) | `0x30_0000 + gpu * 0x100 + gi`    |
//!
//! A GPU instance has at most one compute instance (id 0, full width), so the GPU instance
//! names it. Value 0 is never a handle, so a zeroed handle is `INVALID_ARGUMENT`.

use nvml_wrapper_sys::bindings::{nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstance_t};
use std::ptr;

const GPU_BASE: usize = 0x1000;
const MIG_BASE: usize = 0x10_0000;
const GPU_INSTANCE_BASE: usize = 0x20_0000;
const COMPUTE_INSTANCE_BASE: usize = 0x30_0000;
/// GPU instance ids per GPU in the MIG and GPU instance ranges.
const PER_GPU: usize = 0x100;
/// GPUs a range can name: `MAX_GPUS * PER_GPU` is each range's width.
const MAX_GPUS: usize = 0x1000;

/// What a device handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// A whole GPU, by index.
    Gpu(u32),
    /// The MIG device of GPU instance `gi` on GPU `gpu` (its one compute instance).
    Mig { gpu: u32, gi: u32 },
}

/// What a GPU instance handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInstance {
    pub gpu: u32,
    pub gi: u32,
}

/// What a compute instance handle names: the one compute instance of GPU instance `gi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeInstance {
    pub gpu: u32,
    pub gi: u32,
}

fn pair(base: usize, gpu: u32, gi: u32) -> Option<usize> {
    let (gpu, gi) = (gpu as usize, gi as usize);
    (gpu < MAX_GPUS && gi < PER_GPU).then_some(base + gpu * PER_GPU + gi)
}

fn unpair(base: usize, addr: usize) -> Option<(u32, u32)> {
    let offset = addr.checked_sub(base)?;
    (offset < MAX_GPUS * PER_GPU).then_some(((offset / PER_GPU) as u32, (offset % PER_GPU) as u32))
}

impl Device {
    /// The handle; `None` when an index is past what the encoding holds.
    pub fn encode(self) -> Option<nvmlDevice_t> {
        let addr = match self {
            Device::Gpu(i) => ((i as usize) < MAX_GPUS).then_some(GPU_BASE + i as usize)?,
            Device::Mig { gpu, gi } => pair(MIG_BASE, gpu, gi)?,
        };
        Some(ptr::without_provenance_mut(addr))
    }

    pub fn decode(handle: nvmlDevice_t) -> Option<Device> {
        let addr = handle.addr();
        if (GPU_BASE..GPU_BASE + MAX_GPUS).contains(&addr) {
            return Some(Device::Gpu((addr - GPU_BASE) as u32));
        }
        unpair(MIG_BASE, addr).map(|(gpu, gi)| Device::Mig { gpu, gi })
    }
}

impl GpuInstance {
    pub fn encode(self) -> Option<nvmlGpuInstance_t> {
        pair(GPU_INSTANCE_BASE, self.gpu, self.gi).map(ptr::without_provenance_mut)
    }

    pub fn decode(handle: nvmlGpuInstance_t) -> Option<GpuInstance> {
        unpair(GPU_INSTANCE_BASE, handle.addr()).map(|(gpu, gi)| GpuInstance { gpu, gi })
    }
}

impl ComputeInstance {
    pub fn encode(self) -> Option<nvmlComputeInstance_t> {
        pair(COMPUTE_INSTANCE_BASE, self.gpu, self.gi).map(ptr::without_provenance_mut)
    }

    pub fn decode(handle: nvmlComputeInstance_t) -> Option<ComputeInstance> {
        unpair(COMPUTE_INSTANCE_BASE, handle.addr()).map(|(gpu, gi)| ComputeInstance { gpu, gi })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_handles_round_trip() {
        let cases = [
            (Device::Gpu(0), 0x1000),
            (Device::Gpu(7), 0x1007),
            (Device::Gpu(63), 0x103f),
            (Device::Mig { gpu: 0, gi: 0 }, 0x10_0000),
            (Device::Mig { gpu: 0, gi: 1 }, 0x10_0001),
            (Device::Mig { gpu: 3, gi: 13 }, 0x10_030d),
            (Device::Mig { gpu: 63, gi: 255 }, 0x10_3fff),
        ];
        for (device, addr) in cases {
            let handle = device.encode().unwrap();
            assert_eq!(handle.addr(), addr, "{device:?}");
            assert_eq!(Device::decode(handle), Some(device), "{addr:#x}");
        }
    }

    #[test]
    fn gpu_instance_handles_round_trip() {
        let cases = [
            (GpuInstance { gpu: 0, gi: 0 }, 0x20_0000),
            (GpuInstance { gpu: 1, gi: 2 }, 0x20_0102),
            (GpuInstance { gpu: 7, gi: 14 }, 0x20_070e),
        ];
        for (instance, addr) in cases {
            let handle = instance.encode().unwrap();
            assert_eq!(handle.addr(), addr, "{instance:?}");
            assert_eq!(GpuInstance::decode(handle), Some(instance), "{addr:#x}");
        }
    }

    #[test]
    fn compute_instance_handles_round_trip() {
        let cases = [
            (ComputeInstance { gpu: 0, gi: 1 }, 0x30_0001),
            (ComputeInstance { gpu: 2, gi: 7 }, 0x30_0207),
            (ComputeInstance { gpu: 0xfff, gi: 0xff }, 0x3f_ffff),
        ];
        for (instance, addr) in cases {
            let handle = instance.encode().unwrap();
            assert_eq!(handle.addr(), addr, "{instance:?}");
            assert_eq!(ComputeInstance::decode(handle), Some(instance), "{addr:#x}");
        }
        // A GPU instance handle is not a compute instance handle, nor the reverse.
        for addr in [0, 0x20_0001, 0x2f_ffff, 0x40_0000] {
            assert_eq!(ComputeInstance::decode(ptr::without_provenance_mut(addr)), None, "{addr:#x}");
        }
        assert_eq!(ComputeInstance { gpu: 0, gi: 0x100 }.encode(), None);
    }

    #[test]
    fn out_of_range_ids_do_not_encode() {
        assert_eq!(Device::Gpu(0x1000).encode(), None);
        assert_eq!(Device::Mig { gpu: 0, gi: 0x100 }.encode(), None);
        assert_eq!(Device::Mig { gpu: 0x1000, gi: 0 }.encode(), None);
        assert_eq!(GpuInstance { gpu: 1, gi: 0x100 }.encode(), None);
    }

    #[test]
    fn foreign_values_do_not_decode() {
        // Null, just below/above each range, and a GPU instance handle passed as a device.
        let devices = [0, 0xfff, 0x2000, 0xf_ffff, 0x20_0000, 0x20_0102, usize::MAX];
        for addr in devices {
            assert_eq!(Device::decode(ptr::without_provenance_mut(addr)), None, "{addr:#x}");
        }
        let instances = [0, 0x1000, 0x10_0001, 0x1f_ffff, 0x30_0000];
        for addr in instances {
            assert_eq!(GpuInstance::decode(ptr::without_provenance_mut(addr)), None, "{addr:#x}");
        }
    }
}
