//! The GPU driver seam. The agent sees GPUs only through [`GpuDriver`]; the one implementation is
//! NVML through nvml-wrapper ([`nvml`]), loaded from the real `libnvidia-ml.so` or, under
//! `--simulate`, from the fake one built in this workspace, so CI runs the same code as a real host.

pub mod nvml;

use crate::inventory::Inventory;

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("cannot load NVML from {library}: {source}")]
    Load { library: String, source: nvml_wrapper::error::NvmlError },
    #[error("NVML {call}: {source}")]
    Host { call: &'static str, source: nvml_wrapper::error::NvmlError },
    #[error("GPU {gpu}: NVML {call}: {source}")]
    Gpu { gpu: u32, call: &'static str, source: nvml_wrapper::error::NvmlError },
}

pub trait GpuDriver: Send + Sync {
    /// Reads every GPU: identity, memory, MIG mode and profiles, instances, processes.
    fn inventory(&self) -> Result<Inventory, DriverError>;
}
