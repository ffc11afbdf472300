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

impl DriverError {
    /// The NVML error underneath, for callers that react to a specific code.
    pub fn nvml(&self) -> &nvml_wrapper::error::NvmlError {
        match self {
            DriverError::Load { source, .. } | DriverError::Host { source, .. } | DriverError::Gpu { source, .. } => {
                source
            }
        }
    }
}

/// MIG mode after a change was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

pub trait GpuDriver: Send + Sync {
    /// Reads every GPU: identity, memory, MIG mode and profiles, instances, processes.
    fn inventory(&self) -> Result<Inventory, DriverError>;

    /// Asks for MIG mode on or off and returns the mode afterwards. A mode that needs a GPU reset
    /// which could not happen (Ampere, something holds the GPU) comes back pending.
    fn set_mig_mode(&self, gpu: u32, enable: bool) -> Result<MigMode, DriverError>;

    /// Creates a GPU instance of `profile_id` at `start` (explicit placement, never the
    /// driver's choice) and returns its id.
    fn create_gpu_instance(&self, gpu: u32, profile_id: u32, start: u32, size: u32) -> Result<u32, DriverError>;

    /// Creates the full-width compute instance in GPU instance `gi`, which makes it a MIG device.
    fn create_compute_instance(&self, gpu: u32, gi: u32) -> Result<(), DriverError>;

    /// Destroys GPU instance `gi`, its compute instances first.
    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), DriverError>;
}
