//! The one table of GPU products the simulated driver models.
//!
//! Every number the fake NVML answers comes from here. Rows carry a [`Source`]: `Probe` values
//! were read off a real card by our own read-only probe (`tests/fixtures/h200-probe.txt`),
//! `Published` values come from NVIDIA's MIG user guide or `nvidia-smi mig -lgip` captures that
//! users published, and `Unverified` values are inferred (from the product's slice structure or a
//! sibling product) and must be confirmed on real hardware before anyone relies on them.
//! Memory is `memorySizeMB` as NVML reports it, which is nvidia-smi's GiB figure x 1024.

/// Where a value in this table comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Read by our own probe of a real card.
    Probe,
    /// Published by NVIDIA or in users' captures of real cards.
    Published,
    /// Inferred; to be confirmed on real hardware.
    Unverified,
}

/// NVML's GPU instance profile index constants (`NVML_GPU_INSTANCE_PROFILE_*`).
pub mod index {
    pub const SLICE_1: u32 = 0;
    pub const SLICE_2: u32 = 1;
    pub const SLICE_3: u32 = 2;
    pub const SLICE_4: u32 = 3;
    pub const SLICE_7: u32 = 4;
    pub const SLICE_1_REV1: u32 = 7;
    pub const SLICE_2_REV1: u32 = 8;
    pub const SLICE_1_REV2: u32 = 9;
    /// `NVML_GPU_INSTANCE_PROFILE_COUNT`: an index at or past it is `INVALID_ARGUMENT`, one
    /// below it that the product lacks is `NOT_SUPPORTED` (both seen on the H200).
    pub const COUNT: u32 = 17;
}

/// One MIG GPU-instance profile of a product.
#[derive(Debug, Clone, Copy)]
pub struct ProfileRow {
    /// NVML index constant that `nvmlDeviceGetGpuInstanceProfileInfo` takes.
    pub index: u32,
    /// Profile ID that the driver returns and every later call takes.
    pub id: u32,
    /// Name without nvidia-smi's "MIG " prefix, e.g. `1g.18gb`.
    pub name: &'static str,
    pub memory_mib: u64,
    pub sm: u32,
    /// Compute slices (`sliceCount`): 3 for a 3g, 1 for a double-memory 1g.
    pub slices: u32,
    /// Memory slices one placement takes (placement `size`).
    pub size: u32,
    /// Valid placement starts, ascending.
    pub starts: &'static [u32],
    /// Most instances of this profile at once (`instanceCount`).
    pub max: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    pub source: Source,
}

/// Whether a MIG mode change needs a GPU reset to take effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigModeChange {
    /// Ampere: the driver resets the GPU; if anything holds it the mode stays pending.
    NeedsReset,
    /// Hopper and later: takes effect at once.
    Immediate,
}

/// A GPU product.
#[derive(Debug, Clone, Copy)]
pub struct Product {
    /// The `--simulate` key, e.g. `h200`.
    pub key: &'static str,
    /// `nvmlDeviceGetName`.
    pub name: &'static str,
    /// `pciDeviceId` as NVML reports it: device id << 16 | vendor 0x10de.
    pub pci_device_id: u32,
    /// Whole-card memory in MiB as nvidia-smi prints it (NVML total / 2^20).
    pub memory_mib: u64,
    /// Memory the driver reserves, in KiB (`nvmlMemory_v2_t.reserved`, also counted in v1's
    /// `used`). The H200 reserves 644939776 bytes: 615 MiB and 64 KiB, so MiB is too coarse.
    pub reserved_kib: u64,
    /// `pciSubSystemId` as NVML reports it (board vendor's id << 16 | vendor).
    pub pci_subsystem_id: u32,
    pub sm: u32,
    /// `nvmlDeviceArchitecture_t`: 7 Ampere, 9 Hopper, 10 Blackwell.
    pub architecture: u32,
    pub compute_capability: (i32, i32),
    /// Memory slices a MIG layout divides the card into.
    pub memory_slices: u32,
    pub mig_mode_change: MigModeChange,
    /// Source of the whole-card figures (name, memory, SMs).
    pub source: Source,
    pub profiles: &'static [ProfileRow],
}

#[allow(clippy::too_many_arguments)] // one row of the table, read positionally
const fn p(
    index: u32,
    id: u32,
    name: &'static str,
    memory_mib: u64,
    sm: u32,
    (slices, size, max): (u32, u32, u32),
    starts: &'static [u32],
    [copy_engines, decoders, encoders, jpegs, ofas]: [u32; 5],
    source: Source,
) -> ProfileRow {
    ProfileRow {
        index,
        id,
        name,
        memory_mib,
        sm,
        slices,
        size,
        starts,
        max,
        copy_engines,
        decoders,
        encoders,
        jpegs,
        ofas,
        source,
    }
}

use Source::{Probe, Published, Unverified};
use index::*;

// Placements of 8-slice parts (A100, H100, H200, GH200, B200): identical on every capture.
const S1: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const S1X2: &[u32] = &[0, 2, 4, 6];
const S2: &[u32] = &[0, 2, 4];
const S3: &[u32] = &[0, 4];
const S0: &[u32] = &[0];
// A30 (4 memory slices).
const A30_S1: &[u32] = &[0, 1, 2, 3];
const A30_S2: &[u32] = &[0, 2];

/// Hopper/Blackwell engine counts per profile, as the H200 probe shows them.
const HOPPER_1G: [u32; 5] = [1, 1, 0, 1, 0];
const HOPPER_1G_ME: [u32; 5] = [1, 1, 0, 1, 1];
const HOPPER_2G: [u32; 5] = [2, 2, 0, 2, 0];
const HOPPER_3G: [u32; 5] = [3, 3, 0, 3, 0];
const HOPPER_4G: [u32; 5] = [4, 4, 0, 4, 0];
const HOPPER_7G: [u32; 5] = [8, 7, 0, 7, 1];

/// Hopper-shaped profile set: (1g, 1g double, 2g, 3g, 7g) names and MiB; SMs as H100/H200.
const fn hopper(names: [&'static str; 7], mib: [u64; 4], sms: [u32; 6], src: [Source; 2]) -> [ProfileRow; 7] {
    let [m1, m1x2, m3, m7] = mib;
    let [s1, s1x2, s2, s3, s4, s7] = sms;
    let [small, big] = src;
    [
        p(SLICE_1, 19, names[0], m1, s1, (1, 1, 7), S1, HOPPER_1G, small),
        p(SLICE_1_REV1, 20, names[1], m1, s1, (1, 1, 1), S1, HOPPER_1G_ME, small),
        p(SLICE_1_REV2, 15, names[2], m1x2, s1x2, (1, 2, 4), S1X2, HOPPER_1G, small),
        p(SLICE_2, 14, names[3], m1x2, s2, (2, 2, 3), S2, HOPPER_2G, small),
        p(SLICE_3, 9, names[4], m3, s3, (3, 4, 2), S3, HOPPER_3G, big),
        p(SLICE_4, 5, names[5], m3, s4, (4, 4, 1), S0, HOPPER_4G, big),
        p(SLICE_7, 0, names[6], m7, s7, (7, 8, 1), S0, HOPPER_7G, big),
    ]
}

const H200_PROFILES: [ProfileRow; 7] = hopper(
    ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    [16384, 33280, 71424, 143360],
    [16, 26, 32, 60, 64, 132],
    [Probe, Probe],
);

// H100 80GB: sizes and SXM SM counts published; engine counts assumed as on the H200.
const H100_80GB_PROFILES: [ProfileRow; 7] = hopper(
    ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    [9984, 20096, 40448, 81152],
    [16, 26, 32, 60, 64, 132],
    [Published, Published],
);

// H100 NVL: sizes published, SM counts assumed as H100.
const H100_NVL_PROFILES: [ProfileRow; 7] = hopper(
    ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    [11008, 22144, 47488, 95360],
    [16, 26, 32, 60, 64, 132],
    [Published, Published],
);

// GH200 96GB: sizes published, SM counts assumed as H100.
const GH200_PROFILES: [ProfileRow; 7] = hopper(
    ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
    [11264, 23552, 47616, 95232],
    [16, 26, 32, 60, 64, 132],
    [Published, Published],
);

// B200: 1g and 2g published (1g.23gb size approximate); 3g/4g/7g sizes and SMs unverified.
const B200_PROFILES: [ProfileRow; 7] = hopper(
    ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
    [22528, 45312, 91648, 183296],
    [18, 30, 36, 72, 74, 148],
    [Published, Unverified],
);

// Ampere engine counts from NVIDIA's MIG user guide table (not re-checked on a card here).
const A100_PROFILES_40: [ProfileRow; 7] = [
    p(SLICE_1, 19, "1g.5gb", 4864, 14, (1, 1, 7), S1, [1, 0, 0, 0, 0], Published),
    p(SLICE_1_REV1, 20, "1g.5gb+me", 4864, 14, (1, 1, 1), S1, [1, 1, 0, 1, 1], Published),
    p(SLICE_1_REV2, 15, "1g.10gb", 9856, 14, (1, 2, 4), S1X2, [1, 1, 0, 0, 0], Published),
    p(SLICE_2, 14, "2g.10gb", 9856, 28, (2, 2, 3), S2, [2, 1, 0, 0, 0], Published),
    p(SLICE_3, 9, "3g.20gb", 19968, 42, (3, 4, 2), S3, [3, 2, 0, 0, 0], Published),
    p(SLICE_4, 5, "4g.20gb", 19968, 56, (4, 4, 1), S0, [4, 2, 0, 0, 0], Published),
    p(SLICE_7, 0, "7g.40gb", 40192, 98, (7, 8, 1), S0, [7, 5, 0, 1, 1], Published),
];

const A100_PROFILES_80: [ProfileRow; 7] = [
    p(SLICE_1, 19, "1g.10gb", 9728, 14, (1, 1, 7), S1, [1, 0, 0, 0, 0], Published),
    p(SLICE_1_REV1, 20, "1g.10gb+me", 9728, 14, (1, 1, 1), S1, [1, 1, 0, 1, 1], Published),
    // Size of the double-memory 1g on the 80GB part is not in any capture we have.
    p(SLICE_1_REV2, 15, "1g.20gb", 19968, 14, (1, 2, 4), S1X2, [1, 1, 0, 0, 0], Unverified),
    p(SLICE_2, 14, "2g.20gb", 19968, 28, (2, 2, 3), S2, [2, 1, 0, 0, 0], Published),
    p(SLICE_3, 9, "3g.40gb", 40192, 42, (3, 4, 2), S3, [3, 2, 0, 0, 0], Published),
    p(SLICE_4, 5, "4g.40gb", 40192, 56, (4, 4, 1), S0, [4, 2, 0, 0, 0], Published),
    p(SLICE_7, 0, "7g.80gb", 80896, 98, (7, 8, 1), S0, [7, 5, 0, 1, 1], Published),
];

const A30_PROFILES: [ProfileRow; 5] = [
    p(SLICE_1, 14, "1g.6gb", 5952, 14, (1, 1, 4), A30_S1, [1, 0, 0, 0, 0], Published),
    p(SLICE_1_REV1, 21, "1g.6gb+me", 5952, 14, (1, 1, 1), A30_S1, [1, 1, 0, 1, 1], Published),
    p(SLICE_2, 5, "2g.12gb", 11968, 28, (2, 2, 2), A30_S2, [2, 2, 0, 0, 0], Published),
    p(SLICE_2_REV1, 6, "2g.12gb+me", 11968, 28, (2, 2, 1), A30_S2, [2, 2, 0, 1, 1], Published),
    p(SLICE_4, 0, "4g.24gb", 24000, 56, (4, 4, 1), S0, [4, 4, 0, 1, 1], Published),
];

/// Every product `--simulate` knows. Whole-card memory and SM counts are `Unverified` except the
/// H200's, which our probe read.
pub static PRODUCTS: &[Product] = &[
    Product {
        key: "a100-40gb",
        name: "NVIDIA A100-SXM4-40GB",
        pci_device_id: 0x20B0_10DE,
        memory_mib: 40960,
        reserved_kib: 524288,
        pci_subsystem_id: 0,
        sm: 108,
        architecture: 7,
        compute_capability: (8, 0),
        memory_slices: 8,
        mig_mode_change: MigModeChange::NeedsReset,
        source: Unverified,
        profiles: &A100_PROFILES_40,
    },
    Product {
        key: "a100-80gb",
        name: "NVIDIA A100-SXM4-80GB",
        pci_device_id: 0x20B2_10DE,
        memory_mib: 81920,
        reserved_kib: 524288,
        pci_subsystem_id: 0,
        sm: 108,
        architecture: 7,
        compute_capability: (8, 0),
        memory_slices: 8,
        mig_mode_change: MigModeChange::NeedsReset,
        source: Unverified,
        profiles: &A100_PROFILES_80,
    },
    Product {
        key: "a30",
        name: "NVIDIA A30",
        pci_device_id: 0x20B7_10DE,
        memory_mib: 24576,
        reserved_kib: 262144,
        pci_subsystem_id: 0,
        sm: 56,
        architecture: 7,
        compute_capability: (8, 0),
        memory_slices: 4,
        mig_mode_change: MigModeChange::NeedsReset,
        source: Unverified,
        profiles: &A30_PROFILES,
    },
    Product {
        key: "h100-80gb",
        name: "NVIDIA H100 80GB HBM3",
        pci_device_id: 0x2330_10DE,
        memory_mib: 81559,
        reserved_kib: 524288,
        pci_subsystem_id: 0,
        sm: 132,
        architecture: 9,
        compute_capability: (9, 0),
        memory_slices: 8,
        mig_mode_change: MigModeChange::Immediate,
        source: Unverified,
        profiles: &H100_80GB_PROFILES,
    },
    Product {
        key: "h100-nvl",
        name: "NVIDIA H100 NVL",
        pci_device_id: 0x2321_10DE,
        memory_mib: 95830,
        reserved_kib: 524288,
        pci_subsystem_id: 0,
        sm: 132,
        architecture: 9,
        compute_capability: (9, 0),
        memory_slices: 8,
        mig_mode_change: MigModeChange::Immediate,
        source: Unverified,
        profiles: &H100_NVL_PROFILES,
    },
    Product {
        key: "h200",
        name: "NVIDIA H200",
        pci_device_id: 0x2335_10DE,
        memory_mib: 143771,
        reserved_kib: 629_824,
        pci_subsystem_id: 0x18BF_10DE,
        sm: 132,
        architecture: 9,
        compute_capability: (9, 0),
        memory_slices: 8,
        mig_mode_change: MigModeChange::Immediate,
        source: Probe,
        profiles: &H200_PROFILES,
    },
    Product {
        key: "gh200",
        name: "NVIDIA GH200 96GB HBM3",
        pci_device_id: 0x2342_10DE,
        memory_mib: 97871,
        reserved_kib: 524288,
        pci_subsystem_id: 0,
        sm: 132,
        architecture: 9,
        compute_capability: (9, 0),
        memory_slices: 8,
        mig_mode_change: MigModeChange::Immediate,
        source: Unverified,
        profiles: &GH200_PROFILES,
    },
    Product {
        key: "b200",
        name: "NVIDIA B200",
        pci_device_id: 0x2901_10DE,
        memory_mib: 183359,
        reserved_kib: 524288,
        pci_subsystem_id: 0,
        sm: 148,
        architecture: 10,
        compute_capability: (10, 0),
        memory_slices: 8,
        mig_mode_change: MigModeChange::Immediate,
        source: Unverified,
        profiles: &B200_PROFILES,
    },
];

/// Looks a product up by its `--simulate` key.
pub fn find(key: &str) -> Option<&'static Product> {
    PRODUCTS.iter().find(|p| p.key == key)
}

impl Product {
    /// The profile NVML answers for an index constant, if the product has one.
    pub fn profile_by_index(&self, index: u32) -> Option<&'static ProfileRow> {
        self.profiles.iter().find(|p| p.index == index)
    }

    /// The profile with this profile ID.
    pub fn profile_by_id(&self, id: u32) -> Option<&'static ProfileRow> {
        self.profiles.iter().find(|p| p.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_fits_its_product() {
        for product in PRODUCTS {
            let mut ids = std::collections::HashSet::new();
            for row in product.profiles {
                assert!(ids.insert(row.id), "{}: duplicate id {}", product.key, row.id);
                assert!(row.index < index::COUNT, "{} {}", product.key, row.name);
                for start in row.starts {
                    assert!(start + row.size <= product.memory_slices, "{} {}", product.key, row.name);
                }
                assert!(row.memory_mib < product.memory_mib, "{} {}", product.key, row.name);
                assert!(row.sm <= product.sm, "{} {}", product.key, row.name);
            }
        }
    }
}
