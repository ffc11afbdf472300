//! MIG GPU instance profiles: their description, placements and remaining capacity. All of it
//! comes from gpu-sim's product table; only the remaining capacity looks at the state.

use crate::call::answer;
use crate::ffi::{self, CountQuery, Out, fill_array};
use crate::ret::{ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, NOT_SUPPORTED, Res, UNKNOWN, guard, nvmlReturn_t};
use crate::session;
use crate::target;
use gpu_sim::SimGpuInstance;
use gpu_sim::products::{Product, ProfileRow, index::COUNT as PROFILE_INDEX_COUNT};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlGpuInstanceProfileInfo_v2_t,
};
use std::ffi::c_uint;
use std::mem::size_of;

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`.
const PROFILE_INFO_V2_VERSION: c_uint = (size_of::<nvmlGpuInstanceProfileInfo_v2_t>() | 2 << 24) as c_uint;

/// The row for a profile INDEX constant: at or past `NVML_GPU_INSTANCE_PROFILE_COUNT` is
/// `INVALID_ARGUMENT`, below it but missing from the product `NOT_SUPPORTED` (both probed).
/// Answered whatever the MIG mode, as the probe shows.
fn profile_by_index(product: &Product, index: c_uint) -> Res<&'static ProfileRow> {
    if index >= PROFILE_INDEX_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    product.profile_by_index(index).ok_or(NOT_SUPPORTED)
}

/// The row for a profile ID; one the product lacks is `INVALID_ARGUMENT` (unverified).
pub fn profile_by_id(product: &Product, id: c_uint) -> Res<&'static ProfileRow> {
    product.profile_by_id(id).ok_or(INVALID_ARGUMENT)
}

fn profile_info(row: &ProfileRow) -> nvmlGpuInstanceProfileInfo_t {
    nvmlGpuInstanceProfileInfo_t {
        id: row.id,
        isP2pSupported: 0,
        sliceCount: row.slices,
        instanceCount: row.max,
        multiprocessorCount: row.sm,
        copyEngineCount: row.copy_engines,
        decoderCount: row.decoders,
        encoderCount: row.encoders,
        jpegCount: row.jpegs,
        ofaCount: row.ofas,
        memorySizeMB: row.memory_mib,
    }
}

/// # Safety
/// `info` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `info`.
    unsafe {
        answer(device, info, |t| {
            let gpu = t.whole_gpu()?;
            Ok(profile_info(profile_by_index(gpu.product(), profile)?))
        })
    }
}

/// As `nvmlDeviceGetGpuInstanceProfileInfo`, with the name nvidia-smi shows ("MIG 1g.18gb",
/// probed). The caller sets `version` to `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`;
/// anything else is `ARGUMENT_VERSION_MISMATCH`.
///
/// # Safety
/// `info` is null or valid for reads and writes, its `version` set by the caller.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let gpu = target::resolve_gpu(&host, device)?;
        // SAFETY: the caller's contract on `info`.
        let mut out = unsafe { Out::new(info) }?;
        // SAFETY: non-null and valid for reads; the caller initialised `version` (only that
        // field is read, through a raw pointer).
        let version = unsafe { (&raw const (*out.as_ptr()).version).read() };
        if version != PROFILE_INFO_V2_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let row = profile_by_index(gpu.product(), profile)?;
        let v1 = profile_info(row);
        let mut v2 = nvmlGpuInstanceProfileInfo_v2_t {
            version,
            id: v1.id,
            isP2pSupported: v1.isP2pSupported,
            sliceCount: v1.sliceCount,
            instanceCount: v1.instanceCount,
            multiprocessorCount: v1.multiprocessorCount,
            copyEngineCount: v1.copyEngineCount,
            decoderCount: v1.decoderCount,
            encoderCount: v1.encoderCount,
            jpegCount: v1.jpegCount,
            ofaCount: v1.ofaCount,
            memorySizeMB: v1.memorySizeMB,
            name: [0; 96],
        };
        fill_array(&mut v2.name, &format!("MIG {}", row.name)).map_err(|_| UNKNOWN)?;
        out.set(v2);
        Ok(())
    })
}

/// Every placement the profile can take, occupied or not; a NULL buffer is a count query
/// answered `SUCCESS` (both probed, with MIG off).
///
/// # Safety
/// `count` is null or valid for reads and writes; `placements` is null or valid for `*count`
/// items.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let gpu = target::resolve_gpu(&host, device)?;
        let row = profile_by_id(gpu.product(), profile_id)?;
        let items: Vec<nvmlGpuInstancePlacement_t> =
            row.starts.iter().map(|&start| nvmlGpuInstancePlacement_t { start, size: row.size }).collect();
        // SAFETY: the caller's contract on `placements` and `count`.
        unsafe { ffi::write_list(placements, count, &items, CountQuery::Success) }
    })
}

/// Whether `row` is a media-extension ("+me") profile. A GPU has one set of media engines for
/// them, so at most one instance of any "+me" profile exists at a time (unverified for the
/// A30's two "+me" profiles together).
fn media_extended(row: &ProfileRow) -> bool {
    row.name.ends_with("+me")
}

/// Compute slices a product's MIG layout has: its widest profile's `slices` (7, or 4 on the A30).
fn compute_slices(product: &Product) -> u32 {
    product.profiles.iter().map(|r| r.slices).max().unwrap_or(0)
}

/// Whether `size` memory slices from `start` overlap an existing instance.
fn overlaps(start: u32, size: u32, taken: &[(u32, u32)]) -> bool {
    taken.iter().any(|&(a, b)| start < b && a < start + size)
}

/// How many more instances of `row` fit beside `existing`: at most `row.max` of one profile,
/// one "+me" instance of any profile, as many non-overlapping free placements as there are,
/// and no more compute slices than the product has ([`compute_slices`]). The probe confirms
/// the answers for an empty H200; the placement, "+me" and compute-slice rules beside existing
/// instances are unverified.
pub fn remaining_capacity(product: &Product, row: &ProfileRow, existing: &[SimGpuInstance]) -> u32 {
    let rows = || existing.iter().filter_map(|i| product.profile_by_id(i.profile_id));
    if media_extended(row) && rows().any(media_extended) {
        return 0;
    }
    let same = existing.iter().filter(|i| i.profile_id == row.id).count() as u32;
    let by_max = row.max.saturating_sub(same);

    let used_slices: u32 = rows().map(|r| r.slices).sum();
    let by_slices = compute_slices(product).saturating_sub(used_slices) / row.slices.max(1);

    // Placements of one profile all have the same size, so taking the free ones from the lowest
    // start up packs the most.
    let mut taken: Vec<(u32, u32)> = existing.iter().map(|i| (i.start, i.start + i.size)).collect();
    let mut by_placement = 0;
    for &start in row.starts {
        if !overlaps(start, row.size, &taken) {
            taken.push((start, start + row.size));
            by_placement += 1;
        }
    }
    by_max.min(by_slices).min(by_placement)
}

/// Whether one more instance of `row` fits at `start` (one of `row.starts`) beside `existing`:
/// the placement is free and [`remaining_capacity`] is not 0.
pub fn fits_at(product: &Product, row: &ProfileRow, start: u32, existing: &[SimGpuInstance]) -> bool {
    let taken: Vec<(u32, u32)> = existing.iter().map(|i| (i.start, i.start + i.size)).collect();
    !overlaps(start, row.size, &taken) && remaining_capacity(product, row, existing) > 0
}

/// With MIG off, answered as for an empty GPU (probed on the H200).
///
/// # Safety
/// `count` is null or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract on `count`.
    unsafe {
        answer(device, count, |t| {
            let gpu = t.whole_gpu()?;
            let row = profile_by_id(gpu.product(), profile_id)?;
            Ok(remaining_capacity(gpu.product(), row, gpu.instances()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_sim::products;

    fn instance(id: u32, profile_id: u32, start: u32, size: u32) -> SimGpuInstance {
        SimGpuInstance { id, profile_id, start, size, mig_uuid: None }
    }

    #[test]
    fn profile_info_v2_version_is_nvml_struct_version() {
        // 11 uints, padding, one u64, char[96]: 152 bytes.
        assert_eq!(PROFILE_INFO_V2_VERSION, 0x0200_0098);
    }

    #[test]
    fn remaining_capacity_table() {
        let h200 = products::find("h200").unwrap();
        let a30 = products::find("a30").unwrap();
        let empty: &[SimGpuInstance] = &[];
        let three_g_high = [instance(2, 9, 4, 4)];
        let four_g = [instance(1, 5, 0, 4)];
        let two_one_g = [instance(3, 19, 0, 1), instance(4, 19, 6, 1)];
        let seven_g = [instance(0, 0, 0, 8)];
        let me = [instance(5, 20, 3, 1)];
        let a30_me = [instance(1, 21, 0, 1)];
        // (product, existing, [(profile id, remaining)])
        type Case<'a> = (&'a Product, &'a [SimGpuInstance], &'a [(u32, u32)]);
        let cases: [Case; 8] = [
            // The probed answers for an empty H200, and the rest of its profiles.
            (h200, empty, &[(19, 7), (20, 1), (15, 4), (14, 3), (9, 2), (5, 1), (0, 1)]),
            // 3g at slices 4..8: the low half is free.
            (h200, &three_g_high, &[(19, 4), (15, 2), (14, 2), (9, 1), (5, 1), (0, 0)]),
            // 4g at 0..4 uses 4 of 7 compute slices: a 3g still fits at 4, a 4g does not.
            (h200, &four_g, &[(19, 3), (14, 1), (9, 1), (5, 0), (0, 0)]),
            // 1g at 0 and at 6: 2g fits at 2 and 4; neither 3g placement (0..4, 4..8) is free.
            (h200, &two_one_g, &[(19, 5), (14, 2), (9, 0), (15, 2)]),
            (h200, &seven_g, &[(19, 0), (20, 0), (0, 0)]),
            // The one +me instance: no second, and the 1g count drops by one.
            (h200, &me, &[(20, 0), (19, 6)]),
            (a30, empty, &[(14, 4), (21, 1), (5, 2), (6, 1), (0, 1)]),
            // The A30's two "+me" profiles share its one set of media engines.
            (a30, &a30_me, &[(6, 0), (21, 0), (5, 1), (14, 3)]),
        ];
        for (product, existing, answers) in cases {
            for &(id, want) in answers {
                let row = product.profile_by_id(id).unwrap();
                let got = remaining_capacity(product, row, existing);
                assert_eq!(got, want, "{} profile {id} beside {existing:?}", product.key);
            }
        }
    }

    #[test]
    fn profile_lookups() {
        let h200 = products::find("h200").unwrap();
        let cases = [(0, Ok(19)), (7, Ok(20)), (5, Err(NOT_SUPPORTED)), (16, Err(NOT_SUPPORTED))];
        for (index, want) in cases {
            assert_eq!(profile_by_index(h200, index).map(|r| r.id), want, "index {index}");
        }
        for index in [17, 18, 99] {
            assert_eq!(profile_by_index(h200, index).err(), Some(INVALID_ARGUMENT), "{index}");
        }
        assert_eq!(profile_by_id(h200, 9).map(|r| r.name), Ok("3g.71gb"));
        assert_eq!(profile_by_id(h200, 21).err(), Some(INVALID_ARGUMENT));
    }
}
