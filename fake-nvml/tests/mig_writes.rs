//! The MIG write side: MIG mode changes (immediate on Hopper, pending on a held Ampere GPU),
//! GPU and compute instance create/destroy through nvml-wrapper's raw function table, as the
//! agent partitions GPUs, and fault injection from the state file.

mod common;

use common::*;
use gpu_sim::state::{Fault, device_dir};
use gpu_sim::{SimHost, SimProcess};
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t,
    nvmlComputeInstanceProfileInfo_v2_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstancePlacement_t, nvmlReturn_t,
};
use std::ffi::CStr;
use std::fs::File;
use std::mem::{size_of, zeroed};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::ptr;

/// Placeholder code of the fault test: any `nvmlReturn_t` will do.
const FAULT_CODE: nvmlReturn_t = 8;

// H200 GPU instance profile ids.
const H_1G: u32 = 19;
const H_1G_ME: u32 = 20;
const H_1G_2X: u32 = 15;
const H_2G: u32 = 14;
const H_3G: u32 = 9;
const H_4G: u32 = 5;
const H_7G: u32 = 0;
// A30 GPU instance profile ids.
const A30_1G: u32 = 14;
const A30_1G_ME: u32 = 21;
const A30_2G: u32 = 5;
const A30_2G_ME: u32 = 6;
const A30_4G: u32 = 0;
// NVML_COMPUTE_INSTANCE_PROFILE_*.
const CI_1_SLICE: u32 = 0;
const CI_3_SLICE: u32 = 2;
const CI_PROFILE_COUNT: u32 = 8;

#[test]
fn mig_writes() {
    let dir = tempfile::tempdir().unwrap();
    let state = |name: &str| dir.path().join(name).join("nvml.json");
    h200_partitioning(&state("h200"));
    placement_table(&state("h200-table"), "h200:1", &h200_cases());
    placement_table(&state("a30-table"), "a30:1", &a30_cases());
    live_process_blocks_destroy(&state("busy"));
    faults(&state("faults"));
    ampere_mode_stays_pending_while_held(&state("a100"));
    hopper_refuses_mode_change_while_held(&state("h200-held"));
}

// ---- setup ----

/// Prepares the host of `spec` at `state` and initialises NVML on it. Dropping the `Nvml`
/// shuts the library down, so the next host's init finds its own state file.
fn start(state: &Path, spec: &str) -> Nvml {
    SimHost::prepare(state, &spec.parse().unwrap()).unwrap();
    use_state(state);
    init()
}

fn update(state: &Path, f: impl FnOnce(&mut SimHost)) {
    SimHost::update(state, |h| {
        f(h);
        Ok::<_, ()>(())
    })
    .unwrap()
    .unwrap();
}

fn handle(device: &nvml_wrapper::Device) -> nvmlDevice_t {
    // SAFETY: the handle is only passed back to the library that made it.
    unsafe { device.handle() }
}

fn rc(code: nvmlReturn_t) -> Result<(), nvmlReturn_t> {
    if code == SUCCESS { Ok(()) } else { Err(code) }
}

/// A child that holds `node` open (as its stdin) until dropped.
struct Holder(Child);

impl Holder {
    fn new(node: &Path) -> Holder {
        let file = File::open(node).unwrap_or_else(|e| panic!("{}: {e}", node.display()));
        Holder(Command::new("sleep").arg("300").stdin(Stdio::from(file)).spawn().expect("spawn sleep"))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---- raw calls ----

fn create_gi(
    nvml: &Nvml,
    device: nvmlDevice_t,
    profile: u32,
    at: Option<(u32, u32)>,
) -> Result<nvmlGpuInstance_t, u32> {
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    let code = match at {
        None => {
            let sym = nvml.lib().nvmlDeviceCreateGpuInstance.as_ref().unwrap();
            // SAFETY: `gi` is a live local.
            unsafe { sym(device, profile, &mut gi) }
        }
        Some((start, size)) => {
            let sym = nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref().unwrap();
            let placement = nvmlGpuInstancePlacement_t { start, size };
            // SAFETY: `placement` and `gi` are live locals.
            unsafe { sym(device, profile, &placement, &mut gi) }
        }
    };
    rc(code).map(|()| gi)
}

fn destroy_gi(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<(), u32> {
    let sym = nvml.lib().nvmlGpuInstanceDestroy.as_ref().unwrap();
    // SAFETY: handles are opaque values; a stale one is answered, not dereferenced.
    rc(unsafe { sym(gi) })
}

fn create_ci(nvml: &Nvml, gi: nvmlGpuInstance_t, profile: u32) -> Result<nvmlComputeInstance_t, u32> {
    let sym = nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref().unwrap();
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `ci` is a live local.
    rc(unsafe { sym(gi, profile, &mut ci) }).map(|()| ci)
}

fn destroy_ci(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<(), u32> {
    let sym = nvml.lib().nvmlComputeInstanceDestroy.as_ref().unwrap();
    // SAFETY: handles are opaque values; a stale one is answered, not dereferenced.
    rc(unsafe { sym(ci) })
}

fn ci_profile_info(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    profile: u32,
    eng: u32,
) -> Result<nvmlComputeInstanceProfileInfo_t, u32> {
    let sym = nvml.lib().nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref().unwrap();
    // SAFETY: a plain C struct; all zeroes is a valid value.
    let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { zeroed() };
    // SAFETY: `info` is a live, writable struct.
    rc(unsafe { sym(gi, profile, eng, &mut info) }).map(|()| info)
}

fn ci_profile_info_v(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    profile: u32,
    version: u32,
) -> Result<(nvmlComputeInstanceProfileInfo_v2_t, String), u32> {
    let sym = nvml.lib().nvmlGpuInstanceGetComputeInstanceProfileInfoV.as_ref().unwrap();
    // SAFETY: a plain C struct; all zeroes is a valid value.
    let mut info: nvmlComputeInstanceProfileInfo_v2_t = unsafe { zeroed() };
    info.version = version;
    // SAFETY: `info` is a live, writable struct with its version set.
    rc(unsafe { sym(gi, profile, 0, &mut info) })?;
    // SAFETY: the library NUL-terminates `name` inside the array.
    let name = unsafe { CStr::from_ptr(info.name.as_ptr()) }.to_str().unwrap().to_string();
    Ok((info, name))
}

const CI_PROFILE_INFO_V2: u32 = (size_of::<nvmlComputeInstanceProfileInfo_v2_t>() | 2 << 24) as u32;

fn compute_instances(nvml: &Nvml, gi: nvmlGpuInstance_t, profile: u32) -> Result<Vec<nvmlComputeInstance_t>, u32> {
    let sym = nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref().unwrap();
    let mut buf: Vec<nvmlComputeInstance_t> = vec![ptr::null_mut(); 8];
    let mut count = 8;
    // SAFETY: `buf` holds 8 handles, more than any profile's instanceCount.
    rc(unsafe { sym(gi, profile, buf.as_mut_ptr(), &mut count) })?;
    buf.truncate(count as usize);
    Ok(buf)
}

fn ci_by_id(nvml: &Nvml, gi: nvmlGpuInstance_t, id: u32) -> Result<nvmlComputeInstance_t, u32> {
    let sym = nvml.lib().nvmlGpuInstanceGetComputeInstanceById.as_ref().unwrap();
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `ci` is a live local.
    rc(unsafe { sym(gi, id, &mut ci) }).map(|()| ci)
}

fn ci_info(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<nvmlComputeInstanceInfo_t, u32> {
    let sym = nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref().unwrap();
    // SAFETY: a plain C struct; all zeroes is a valid value.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { zeroed() };
    // SAFETY: `info` is a live, writable struct.
    rc(unsafe { sym(ci, &mut info) }).map(|()| info)
}

fn mig_mode(device: &nvml_wrapper::Device) -> (u32, u32) {
    let mode = device.mig_mode().unwrap();
    (mode.current, mode.pending)
}

/// The MIG device UUIDs in `nvmlDeviceGetMigDeviceHandleByIndex` order, read until NOT_FOUND.
fn mig_uuids(nvml: &Nvml, device: &nvml_wrapper::Device) -> Vec<String> {
    let sym = nvml.lib().nvmlDeviceGetMigDeviceHandleByIndex.as_ref().unwrap();
    let uuid_sym = nvml.lib().nvmlDeviceGetUUID.as_ref().unwrap();
    let mut uuids = Vec::new();
    for index in 0.. {
        let mut mig: nvmlDevice_t = ptr::null_mut();
        // SAFETY: `mig` is a live local.
        let code = unsafe { sym(handle(device), index, &mut mig) };
        if code == NOT_FOUND {
            break;
        }
        assert_eq!(code, SUCCESS, "MIG device {index}");
        let mut buf = [0 as std::ffi::c_char; 96];
        // SAFETY: `buf` holds 96 bytes.
        assert_eq!(unsafe { uuid_sym(mig, buf.as_mut_ptr(), 96) }, SUCCESS);
        // SAFETY: NUL-terminated by the library.
        uuids.push(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_string());
    }
    uuids
}

/// The state's MIG UUIDs of GPU 0, by GPU instance id.
fn state_mig_uuids(state: &Path) -> Vec<String> {
    let mut instances = SimHost::load(state).unwrap().gpus[0].instances.clone();
    instances.sort_by_key(|i| i.id);
    instances.into_iter().filter_map(|i| i.mig_uuid).collect()
}

// ---- scenarios ----

/// The agent's path on an H200: MIG on, two 3g instances, a compute instance in each, then
/// everything torn down again.
fn h200_partitioning(state: &Path) {
    let nvml = start(state, "h200:1");
    let device = nvml.device_by_index(0).unwrap();
    let dev = handle(&device);

    // MIG off: nothing can be created.
    assert_eq!(create_gi(&nvml, dev, H_3G, None).err(), Some(NOT_SUPPORTED));
    assert_eq!(device.set_mig_mode(true).unwrap(), SUCCESS, "activation status");
    assert_eq!(mig_mode(&device), (1, 1), "Hopper switches at once");
    assert_eq!(device.set_mig_mode(true).unwrap(), SUCCESS, "the mode it has");

    // Placement 4 by request, then the driver's choice: the lowest free start, 0.
    let high = create_gi(&nvml, dev, H_3G, Some((4, 4))).unwrap();
    let low = create_gi(&nvml, dev, H_3G, None).unwrap();
    let info = gpu_instance_info(&nvml, high).unwrap();
    assert_eq!((info.id, info.profileId, info.placement.start, info.placement.size), (1, H_3G, 4, 4));
    assert_eq!(info.device, dev);
    let info = gpu_instance_info(&nvml, low).unwrap();
    assert_eq!((info.id, info.placement.start), (2, 0));
    assert_eq!(create_gi(&nvml, dev, H_3G, None).err(), Some(INSUFFICIENT_RESOURCES));
    assert_eq!(create_gi(&nvml, dev, H_3G, Some((0, 4))).err(), Some(INSUFFICIENT_RESOURCES));
    assert_eq!(gpu_instances(&nvml, dev, H_3G).unwrap(), vec![high, low]);
    for profile in [H_3G, H_1G, H_7G] {
        assert_eq!(remaining_capacity(&nvml, dev, profile), Ok(0), "profile {profile} on a full GPU");
    }

    // Compute instance profiles of a 3g instance: only the full-width one.
    let info = ci_profile_info(&nvml, high, CI_3_SLICE, 0).unwrap();
    assert_eq!(
        (info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount, info.sharedCopyEngineCount),
        (CI_3_SLICE, 3, 1, 60, 3)
    );
    let (info_v, name) = ci_profile_info_v(&nvml, high, CI_3_SLICE, CI_PROFILE_INFO_V2).unwrap();
    assert_eq!((info_v.id, info_v.sliceCount, info_v.sharedDecoderCount, name.as_str()), (2, 3, 3, "MIG 3g.71gb"));
    assert_eq!(ci_profile_info_v(&nvml, high, CI_3_SLICE, 1).err(), Some(ARGUMENT_VERSION_MISMATCH));
    assert_eq!(ci_profile_info(&nvml, high, CI_1_SLICE, 0).err(), Some(NOT_SUPPORTED), "1c.3g not modelled");
    assert_eq!(ci_profile_info(&nvml, high, CI_3_SLICE, 1).err(), Some(NOT_SUPPORTED), "engine profile");
    assert_eq!(ci_profile_info(&nvml, high, CI_PROFILE_COUNT, 0).err(), Some(INVALID_ARGUMENT));

    // No compute instance yet: no MIG device.
    assert_eq!(mig_uuids(&nvml, &device), Vec::<String>::new());
    assert_eq!(compute_instances(&nvml, high, CI_3_SLICE).unwrap(), vec![]);
    assert_eq!(ci_by_id(&nvml, high, 0).err(), Some(NOT_FOUND));

    let ci_high = create_ci(&nvml, high, CI_3_SLICE).unwrap();
    assert_eq!(create_ci(&nvml, high, CI_3_SLICE).err(), Some(INSUFFICIENT_RESOURCES), "one per instance");
    assert_eq!(create_ci(&nvml, low, CI_1_SLICE).err(), Some(NOT_SUPPORTED));
    let ci_low = create_ci(&nvml, low, CI_3_SLICE).unwrap();
    assert_ne!(ci_high, ci_low);
    assert_eq!(compute_instances(&nvml, high, CI_3_SLICE).unwrap(), vec![ci_high]);
    assert_eq!(compute_instances(&nvml, high, CI_1_SLICE).err(), Some(NOT_SUPPORTED));
    assert_eq!(ci_by_id(&nvml, high, 0), Ok(ci_high));
    assert_eq!(ci_by_id(&nvml, high, 1).err(), Some(NOT_FOUND));
    let info = ci_info(&nvml, ci_high).unwrap();
    assert_eq!((info.device, info.gpuInstance, info.id, info.profileId), (dev, high, 0, CI_3_SLICE));
    assert_eq!((info.placement.start, info.placement.size), (0, 3));
    assert_eq!(ci_info(&nvml, high.cast()).err(), Some(INVALID_ARGUMENT), "a GI handle");

    // MIG devices appear, by GPU instance id, with the state's UUIDs.
    let uuids = mig_uuids(&nvml, &device);
    assert_eq!(uuids.len(), 2);
    assert!(uuids.iter().all(|u| u.starts_with("MIG-")), "{uuids:?}");
    assert_eq!(uuids, state_mig_uuids(state));
    let mig = device.mig_device_by_index(0).unwrap();
    assert_eq!(raw_u32(nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref().unwrap(), handle(&mig)), Ok(1));
    assert_eq!(nvml.device_by_uuid(uuids[1].as_str()).unwrap().uuid().unwrap(), uuids[1]);

    // Teardown: compute instance first; a stale handle is INVALID_ARGUMENT.
    assert_eq!(destroy_gi(&nvml, high).err(), Some(IN_USE), "still has its compute instance");
    assert_eq!(device.set_mig_mode(false).err().map(|e| matches!(e, NvmlError::InUse)), Some(true));
    assert_eq!(mig_mode(&device), (1, 1));
    destroy_ci(&nvml, ci_high).unwrap();
    assert_eq!(destroy_ci(&nvml, ci_high).err(), Some(INVALID_ARGUMENT));
    assert_eq!(ci_info(&nvml, ci_high).err(), Some(INVALID_ARGUMENT));
    assert_eq!(mig_uuids(&nvml, &device), vec![uuids[1].clone()]);
    destroy_gi(&nvml, high).unwrap();
    assert_eq!(destroy_gi(&nvml, high).err(), Some(INVALID_ARGUMENT));
    assert_eq!(gpu_instance_info(&nvml, high).err(), Some(INVALID_ARGUMENT));
    assert_eq!(gpu_instances(&nvml, dev, H_3G).unwrap(), vec![low]);
    // The upper half is free again: one 3g, or three 1g (1g placements 4, 5, 6).
    assert_eq!(remaining_capacity(&nvml, dev, H_3G), Ok(1));
    assert_eq!(remaining_capacity(&nvml, dev, H_1G), Ok(3));
    assert_eq!(remaining_capacity(&nvml, dev, H_4G), Ok(0), "4g only starts at 0");

    // Ids are reused: the freed 1 comes back.
    let again = create_gi(&nvml, dev, H_1G, None).unwrap();
    assert_eq!(gpu_instance_info(&nvml, again).map(|i| (i.id, i.placement.start)), Ok((1, 4)));
    destroy_gi(&nvml, again).unwrap();

    destroy_ci(&nvml, ci_low).unwrap();
    destroy_gi(&nvml, low).unwrap();
    assert_eq!(device.set_mig_mode(false).unwrap(), SUCCESS);
    assert_eq!(mig_mode(&device), (0, 0));
    assert_eq!(create_gi(&nvml, dev, H_1G, None).err(), Some(NOT_SUPPORTED));
    let host = SimHost::load(state).unwrap();
    assert!(!host.gpus[0].mig_current && host.gpus[0].instances.is_empty(), "{:?}", host.gpus[0]);

    // Foreign handles and arguments.
    let sym = nvml.lib().nvmlDeviceSetMigMode.as_ref().unwrap();
    let mut status = 0;
    // SAFETY: `status` is a live local.
    assert_eq!(unsafe { sym(dev, 2, &mut status) }, INVALID_ARGUMENT, "mode 2");
    // SAFETY: a null status pointer is answered, not written.
    assert_eq!(unsafe { sym(dev, 1, ptr::null_mut()) }, INVALID_ARGUMENT);
    // SAFETY: `status` is a live local; the bad handle is never dereferenced.
    assert_eq!(unsafe { sym(ptr::without_provenance_mut(0x1005), 1, &mut status) }, INVALID_ARGUMENT);
    assert_eq!(mig_mode(&device), (0, 0));
}

/// One placement case: steps of (profile id, placement (start, size) or the driver's choice,
/// expected start or error code), on a GPU with MIG on and no instances.
type Case = (&'static str, Vec<(u32, Option<(u32, u32)>, Result<u32, nvmlReturn_t>)>);

fn h200_cases() -> Vec<Case> {
    let ok = Ok;
    let mut eight_1g: Vec<_> = (0..7).map(|start| (H_1G, None, ok(start))).collect();
    eight_1g.push((H_1G, None, Err(INSUFFICIENT_RESOURCES)));
    let mut six_1g_and_me: Vec<_> = (0..6).map(|start| (H_1G, None, ok(start))).collect();
    six_1g_and_me.push((H_1G_ME, None, ok(6)));
    six_1g_and_me.push((H_1G, None, Err(INSUFFICIENT_RESOURCES)));
    vec![
        ("2g.35gb@1: not a 2g placement", vec![(H_2G, Some((1, 2)), Err(INVALID_ARGUMENT))]),
        ("3g with a 2-slice size", vec![(H_3G, Some((0, 2)), Err(INVALID_ARGUMENT))]),
        ("unknown profile", vec![(21, None, Err(INVALID_ARGUMENT))]),
        ("1g.18gb+me twice", vec![(H_1G_ME, None, ok(0)), (H_1G_ME, Some((3, 1)), Err(INSUFFICIENT_RESOURCES))]),
        ("7g after a 1g", vec![(H_1G, Some((6, 1)), ok(6)), (H_7G, None, Err(INSUFFICIENT_RESOURCES))]),
        ("1g x8", eight_1g),
        ("six 1g, a 1g+me, no slice left", six_1g_and_me),
        // The driver's lowest-start choice strands the 4g; placing the 1g high keeps it.
        ("stranded 4g", vec![(H_1G, None, ok(0)), (H_4G, None, Err(INSUFFICIENT_RESOURCES))]),
        (
            "1g placed high",
            vec![(H_1G, Some((6, 1)), ok(6)), (H_4G, None, ok(0)), (H_3G, None, Err(INSUFFICIENT_RESOURCES))],
        ),
        (
            "overlap",
            vec![(H_3G, Some((0, 4)), ok(0)), (H_2G, Some((2, 2)), Err(INSUFFICIENT_RESOURCES)), (H_2G, None, ok(4))],
        ),
        (
            "double 1g skips taken",
            vec![(H_1G, None, ok(0)), (H_1G_2X, None, ok(2)), (H_1G_2X, Some((1, 2)), Err(INVALID_ARGUMENT))],
        ),
        ("7g fills all", vec![(H_7G, None, ok(0)), (H_1G, None, Err(INSUFFICIENT_RESOURCES))]),
    ]
}

fn a30_cases() -> Vec<Case> {
    let ok = Ok;
    let mut five_1g: Vec<_> = (0..4).map(|start| (A30_1G, None, ok(start))).collect();
    five_1g.push((A30_1G, None, Err(INSUFFICIENT_RESOURCES)));
    vec![
        ("4g.24gb then 1g.6gb", vec![(A30_4G, None, ok(0)), (A30_1G, None, Err(INSUFFICIENT_RESOURCES))]),
        (
            "one +me of either",
            vec![(A30_1G_ME, None, ok(0)), (A30_2G_ME, None, Err(INSUFFICIENT_RESOURCES)), (A30_2G, None, ok(2))],
        ),
        ("2g@1", vec![(A30_2G, Some((1, 2)), Err(INVALID_ARGUMENT))]),
        ("H200 profile id", vec![(19, None, Err(INVALID_ARGUMENT))]),
        ("1g x5", five_1g),
    ]
}

fn placement_table(state: &Path, spec: &str, cases: &[Case]) {
    let nvml = start(state, spec);
    let device = nvml.device_by_index(0).unwrap();
    let dev = handle(&device);
    device.set_mig_mode(true).unwrap();
    for (name, steps) in cases {
        update(state, |h| h.gpus[0].instances.clear());
        for (i, &(profile, at, want)) in steps.iter().enumerate() {
            let got =
                create_gi(&nvml, dev, profile, at).map(|gi| gpu_instance_info(&nvml, gi).unwrap().placement.start);
            assert_eq!(got, want, "{spec} {name}: step {i} (profile {profile} at {at:?})");
        }
        let created = SimHost::load(state).unwrap().gpus[0].instances.len();
        assert_eq!(created, steps.iter().filter(|s| s.2.is_ok()).count(), "{spec} {name}: failed steps change nothing");
    }
}

/// A live process the state places in a GPU instance blocks destroying its compute instance,
/// and the GPU instance itself; once it exits (is reaped), both go.
fn live_process_blocks_destroy(state: &Path) {
    let nvml = start(state, "h200:1");
    let device = nvml.device_by_index(0).unwrap();
    let dev = handle(&device);
    device.set_mig_mode(true).unwrap();
    let gi = create_gi(&nvml, dev, H_1G, None).unwrap();
    let ci = create_ci(&nvml, gi, CI_1_SLICE).unwrap();
    let gi_id = gpu_instance_info(&nvml, gi).unwrap().id;

    let register = |pid: u32| {
        update(state, |h| {
            h.gpus[0].processes.push(SimProcess { pid, used_mib: 512, gpu_instance_id: Some(gi_id), mps_client: false })
        })
    };
    let worker = Sleeper::spawn();
    register(worker.pid());
    assert_eq!(destroy_ci(&nvml, ci).err(), Some(IN_USE));
    assert_eq!(destroy_gi(&nvml, gi).err(), Some(IN_USE));
    drop(worker); // killed and reaped
    destroy_ci(&nvml, ci).unwrap();

    // Without a compute instance, a live process in the GPU instance still blocks it.
    let worker = Sleeper::spawn();
    register(worker.pid());
    assert_eq!(destroy_gi(&nvml, gi).err(), Some(IN_USE));
    drop(worker);
    destroy_gi(&nvml, gi).unwrap();
}

fn faults(state: &Path) {
    SimHost::prepare(state, &"h200:1".parse().unwrap()).unwrap();
    let fault = |call: &str, after, code| Fault { call: call.into(), gpu: Some(0), after, times: 1, code, seen: 0 };
    update(state, |h| {
        h.faults.push(fault("nvmlDeviceCreateGpuInstanceWithPlacement", 2, FAULT_CODE));
        h.faults.push(Fault { gpu: Some(1), ..fault("nvmlDeviceCreateGpuInstanceWithPlacement", 0, 999) });
        h.faults.push(Fault { gpu: None, ..fault("nvmlDeviceSetMigMode", 0, IN_USE) });
        h.faults.push(fault("nvmlGpuInstanceDestroy", 0, 999));
    });
    let seen = |i: usize| SimHost::load(state).unwrap().faults[i].seen;
    let nvml = start(state, "h200:1");
    let device = nvml.device_by_index(0).unwrap();
    let dev = handle(&device);

    assert!(matches!(device.set_mig_mode(true), Err(NvmlError::InUse)), "the injected fault");
    assert_eq!(mig_mode(&device), (0, 0), "a fault changes nothing");
    assert_eq!(device.set_mig_mode(true).unwrap(), SUCCESS, "fires once");
    assert_eq!(seen(2), 2);

    let at = |start| Some((start, 1));
    create_gi(&nvml, dev, H_1G, at(0)).unwrap();
    create_gi(&nvml, dev, H_1G, at(1)).unwrap();
    assert_eq!(
        create_gi(&nvml, dev, H_1G, None).map(|gi| gpu_instance_info(&nvml, gi).unwrap().id),
        Ok(3),
        "another call"
    );
    assert_eq!(seen(0), 2);
    assert_eq!(create_gi(&nvml, dev, H_1G, at(3)).err(), Some(FAULT_CODE), "the third");
    let host = SimHost::load(state).unwrap();
    assert_eq!(host.gpus[0].instances.len(), 3, "the failed create made nothing");
    assert_eq!((host.faults[0].seen, host.faults[1].seen), (3, 0), "counted in the file; GPU 1's untouched");
    create_gi(&nvml, dev, H_1G, at(3)).unwrap();
    assert_eq!(seen(0), 4);

    // A call that fails on its own still counts: a stale handle, then the fault.
    let stale = handle_of_missing_gi();
    assert_eq!(destroy_gi(&nvml, stale).err(), Some(999), "fires even on a bad handle of GPU 0");
    assert_eq!(destroy_gi(&nvml, stale).err(), Some(INVALID_ARGUMENT));
    assert_eq!(seen(3), 2, "the failed call's count was written");
}

/// GPU instance 9 of GPU 0, which no test creates.
fn handle_of_missing_gi() -> nvmlGpuInstance_t {
    ptr::without_provenance_mut(0x20_0009)
}

/// Ampere: a holder makes the reset fail; the mode stays pending until a set succeeds.
fn ampere_mode_stays_pending_while_held(state: &Path) {
    let nvml = start(state, "a100-40gb:1");
    let device = nvml.device_by_index(0).unwrap();
    let node = device_dir(state).join("nvidia0");

    let holder = Holder::new(&node);
    assert_eq!(device.set_mig_mode(true).unwrap(), IN_USE, "activation status");
    assert_eq!(mig_mode(&device), (0, 1), "pending");
    assert_eq!(create_gi(&nvml, handle(&device), 19, None).err(), Some(NOT_SUPPORTED), "not current yet");
    drop(holder);
    assert_eq!(device.set_mig_mode(true).unwrap(), SUCCESS);
    assert_eq!(mig_mode(&device), (1, 1));

    // The way back too, held through nvidiactl this time.
    let holder = Holder::new(&device_dir(state).join("nvidiactl"));
    assert_eq!(device.set_mig_mode(false).unwrap(), IN_USE);
    assert_eq!(mig_mode(&device), (1, 0));
    // Asking for the mode in effect withdraws the pending change.
    assert_eq!(device.set_mig_mode(true).unwrap(), SUCCESS);
    assert_eq!(mig_mode(&device), (1, 1));
    drop(holder);
    assert_eq!(device.set_mig_mode(false).unwrap(), SUCCESS);
    assert_eq!(mig_mode(&device), (0, 0));
}

/// Hopper: a held GPU refuses the change outright.
fn hopper_refuses_mode_change_while_held(state: &Path) {
    let nvml = start(state, "h200:1");
    let device = nvml.device_by_index(0).unwrap();
    let holder = Holder::new(&device_dir(state).join("nvidia0"));
    assert!(matches!(device.set_mig_mode(true), Err(NvmlError::InUse)));
    assert_eq!(mig_mode(&device), (0, 0));
    drop(holder);
    assert_eq!(device.set_mig_mode(true).unwrap(), SUCCESS);
    assert_eq!(mig_mode(&device), (1, 1));
}
