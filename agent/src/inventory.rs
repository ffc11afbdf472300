//! What the agent observes of the host's GPUs, as plain data. The driver seam fills it; the plan
//! checks and the reconciler read it. Nothing here does I/O.

use serde::Serialize;

/// The whole host as the driver reports it at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Inventory {
    pub driver_version: String,
    pub gpus: Vec<Gpu>,
    /// GPUs the driver lists but could not be read (fallen off the bus, say): reported, never
    /// acted on, and the rest of the host works on.
    pub unavailable: Vec<Unavailable>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Unavailable {
    pub index: u32,
    pub error: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Device id << 16 | vendor, as NVML reports it (0x233510de for an H200 SXM).
    pub pci_device_id: u32,
    pub pci_bus_id: String,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
    pub mig_current: bool,
    pub mig_pending: bool,
    pub compute_mode: ComputeMode,
    /// Whole-card SM count: the full-width profile's when the GPU has MIG profiles.
    pub sm_count: u32,
    /// Minor number of its device node, `/dev/nvidia<minor>` (None when the driver does not say).
    pub minor: Option<u32>,
    pub profiles: Vec<Profile>,
    pub instances: Vec<GpuInstance>,
    pub processes: Vec<GpuProcess>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    Default,
    ExclusiveThread,
    ExclusiveProcess,
    Prohibited,
}

impl ComputeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Default => "default",
            ComputeMode::ExclusiveThread => "exclusive_thread",
            ComputeMode::ExclusiveProcess => "exclusive_process",
            ComputeMode::Prohibited => "prohibited",
        }
    }
}

/// A MIG GPU-instance profile as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// The NVML index constant it answered to.
    pub nvml_index: u32,
    /// The profile ID every later MIG call takes.
    pub id: u32,
    /// Without the "MIG " prefix, e.g. `1g.18gb`.
    pub name: String,
    pub memory_mib: u64,
    pub sm: u32,
    pub slices: u32,
    pub max: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    pub placements: Vec<Placement>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInstance {
    pub id: u32,
    pub profile_id: u32,
    pub profile: String,
    pub start: u32,
    pub size: u32,
    pub memory_mib: u64,
    /// MIG device UUID; None until the instance has a compute instance.
    pub uuid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_mib: u64,
    pub gpu_instance_id: Option<u32>,
    pub mps_client: bool,
}

impl Inventory {
    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    pub fn gpu_by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// Resolves "3" or "GPU-..." to a GPU.
    pub fn find(&self, text: &str) -> Option<&Gpu> {
        match text.trim().parse::<u32>() {
            Ok(i) => self.gpu(i),
            Err(_) => self.gpu_by_uuid(text.trim()),
        }
    }
}

impl Gpu {
    pub fn profile_named(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// Inventories for unit tests, from the same product table the simulated driver answers from.
#[cfg(test)]
pub mod test_support {
    use super::*;

    pub fn profiles(product: &str) -> Vec<Profile> {
        let p = gpu_sim::products::find(product).expect("known product");
        let mut out: Vec<Profile> = p
            .profiles
            .iter()
            .map(|r| Profile {
                nvml_index: r.index,
                id: r.id,
                name: r.name.to_string(),
                memory_mib: r.memory_mib,
                sm: r.sm,
                slices: r.slices,
                max: r.max,
                copy_engines: r.copy_engines,
                decoders: r.decoders,
                encoders: r.encoders,
                jpegs: r.jpegs,
                ofas: r.ofas,
                placements: r.starts.iter().map(|s| Placement { start: *s, size: r.size }).collect(),
            })
            .collect();
        out.sort_by_key(|p| (p.slices, p.memory_mib, p.id));
        out
    }

    /// `n` GPUs of `product` with MIG off and nothing running.
    pub fn inventory(product: &str, n: u32) -> Inventory {
        let p = gpu_sim::products::find(product).expect("known product");
        Inventory {
            unavailable: Vec::new(),
            driver_version: "test".into(),
            gpus: (0..n)
                .map(|index| Gpu {
                    index,
                    uuid: format!("GPU-{index}"),
                    name: p.name.into(),
                    pci_device_id: p.pci_device_id,
                    pci_bus_id: String::new(),
                    memory_total_mib: p.memory_mib,
                    memory_used_mib: 0,
                    mig_current: false,
                    mig_pending: false,
                    compute_mode: ComputeMode::Default,
                    sm_count: p.sm,
                    minor: Some(index),
                    profiles: profiles(product),
                    instances: Vec::new(),
                    processes: Vec::new(),
                })
                .collect(),
        }
    }
}
