//! The simulated H200 must answer, through nvml-wrapper, exactly what the real H200 answered in
//! our read-only probe (`tests/fixtures/h200-probe.txt`). Expected values are parsed from the
//! fixture, not restated here, so a change to either side shows.

mod common;

use common::*;
use gpu_sim::{SimHost, SimProcess};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlPciInfo_t};
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::mem::zeroed;
use std::path::Path;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/h200-probe.txt");

// ---- reading the fixture ----

struct Fixture {
    lines: Vec<String>,
}

impl Fixture {
    fn load() -> Fixture {
        let text = std::fs::read_to_string(FIXTURE).unwrap_or_else(|e| panic!("{FIXTURE}: {e}"));
        Fixture { lines: text.lines().map(str::to_string).collect() }
    }

    fn position(&self, prefix: &str) -> usize {
        self.lines
            .iter()
            .position(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("fixture has no line starting with {prefix:?}"))
    }

    /// The first line starting (after indentation) with `prefix`, less the prefix.
    fn line(&self, prefix: &str) -> &str {
        self.lines[self.position(prefix)].trim_start()[prefix.len()..].trim()
    }

    /// As `line`, joined with the indented continuation line after it.
    fn line2(&self, prefix: &str) -> String {
        let at = self.position(prefix);
        format!("{} {}", self.line(prefix), self.lines[at + 1].trim())
    }

    /// nvidia-smi's `--query-gpu` CSV row: name, uuid, pci.bus_id, mig.mode.current,
    /// mig.mode.pending, compute_mode, persistence_mode, memory.total, memory.used,
    /// driver_version.
    fn smi_csv(&self) -> Vec<String> {
        let row = &self.lines[self.position("NVIDIA H200, GPU-")];
        row.split(", ").map(str::to_string).collect()
    }

    fn lines_starting(&self, prefix: &str) -> impl Iterator<Item = (usize, &str)> {
        self.lines
            .iter()
            .enumerate()
            .filter_map(move |(i, l)| l.trim_start().strip_prefix(prefix).map(|rest| (i, rest.trim())))
    }
}

/// Every run of decimal digits in `s`.
fn numbers(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit()).filter(|t| !t.is_empty()).map(|t| t.parse().unwrap()).collect()
}

/// The number right after `key`.
fn num_after(s: &str, key: &str) -> u64 {
    let at = s.find(key).unwrap_or_else(|| panic!("{key:?} not in {s:?}")) + key.len();
    let digits: String = s[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("no number after {key:?} in {s:?}"))
}

fn hex_after(s: &str, key: &str) -> u32 {
    let at = s.find(key).unwrap_or_else(|| panic!("{key:?} not in {s:?}")) + key.len();
    let digits: String = s[at..].trim_start_matches("0x").chars().take_while(char::is_ascii_hexdigit).collect();
    u32::from_str_radix(&digits, 16).unwrap()
}

fn quoted(s: &str) -> &str {
    let start = s.find('"').unwrap_or_else(|| panic!("no quoted text in {s:?}")) + 1;
    let len = s[start..].find('"').unwrap();
    &s[start..start + len]
}

/// `lhs -> NAME (code)` segments of a `;`-separated line.
fn outcomes(s: &str) -> Vec<(&str, u32)> {
    s.split(';')
        .filter_map(|seg| seg.split_once("->"))
        .map(|(lhs, rhs)| (lhs.trim(), *numbers(rhs).last().expect("(code)") as u32))
        .collect()
}

/// `[(pid, MiB[, gi, ci]), ...]`: the tuples of a process list, as numbers.
fn tuples(list: &str) -> Vec<Vec<u64>> {
    let inner = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    inner.split(')').map(numbers).filter(|t| !t.is_empty()).collect()
}

// ---- asking the fake ----

fn handle(device: &nvml_wrapper::Device) -> nvmlDevice_t {
    // SAFETY: the handle is only passed back to the library that made it.
    unsafe { device.handle() }
}

fn pci_info_raw(nvml: &Nvml, device: nvmlDevice_t) -> nvmlPciInfo_t {
    let sym = nvml.lib().nvmlDeviceGetPciInfo_v3.as_ref().unwrap();
    // SAFETY: a plain C struct; all zeroes is a valid value.
    let mut pci: nvmlPciInfo_t = unsafe { zeroed() };
    // SAFETY: `pci` is a live, writable struct.
    assert_eq!(unsafe { sym(device, &mut pci) }, SUCCESS);
    pci
}

fn c_field(field: &[std::ffi::c_char]) -> String {
    // SAFETY: the library NUL-terminates the field inside the array.
    unsafe { CStr::from_ptr(field.as_ptr()) }.to_str().unwrap().to_string()
}

#[test]
fn simulated_h200_answers_as_the_probed_card() {
    let fx = Fixture::load();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("nvml.json");
    SimHost::prepare(&state, &"h200:1".parse().unwrap()).unwrap();

    // The probed card's identity (UUID and bus id are per card, not per product).
    let (name, uuid) = fx.line("name ").split_once(" uuid ").unwrap();
    let bus_id = fx.line("name: NVIDIA H200;").rsplit(' ').next().unwrap().to_string();
    SimHost::update(&state, |h| {
        h.gpus[0].uuid = uuid.to_string();
        h.gpus[0].bus_id = bus_id.clone();
        Ok::<_, ()>(())
    })
    .unwrap()
    .unwrap();
    use_state(&state);

    let nvml = init();
    check_system(&fx, &nvml);
    check_smi_csv(&fx, &nvml);
    let device = nvml.device_by_index(0).unwrap();
    assert_eq!(device.name().unwrap(), name);
    assert_eq!(device.uuid().unwrap(), uuid);
    check_lookups(&fx, &nvml, uuid, &bus_id);
    check_pci(&fx, &nvml, &device);
    check_memory(&fx, &nvml, &device);
    check_modes(&fx, &nvml, &device);
    check_profiles(&fx, &nvml, &device);
    check_smi_profile_table(&fx, &nvml, &device);
    check_placements(&fx, &nvml, &device);
    check_instances_with_mig_off(&fx, &nvml, &device);
    check_processes(&fx, &state, &device);
}

fn check_system(fx: &Fixture, nvml: &Nvml) {
    // "driver 580.159.04 nvml 13.580.159.04 cuda 13000"
    let v: Vec<&str> = fx.line("driver ").split_whitespace().collect();
    assert_eq!(nvml.sys_driver_version().unwrap(), v[0]);
    assert_eq!(v[1], "nvml");
    assert_eq!(nvml.sys_nvml_version().unwrap(), v[2]);
    let cuda: i32 = v[4].parse().unwrap();
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), cuda);
    let v1 = nvml.lib().nvmlSystemGetCudaDriverVersion.as_ref().unwrap();
    let mut version = 0;
    // SAFETY: `version` is a live local.
    assert_eq!(unsafe { v1(&mut version) }, SUCCESS);
    assert_eq!(version, cuda);
    let line = fx.line("supported event types");
    assert_eq!(version as u64, num_after(line, "CUDA driver version "));
    assert_eq!(nvml.device_count().unwrap(), 1);
}

fn check_smi_csv(fx: &Fixture, nvml: &Nvml) {
    let csv = fx.smi_csv();
    let device = nvml.device_by_index(0).unwrap();
    assert_eq!(device.name().unwrap(), csv[0]);
    assert_eq!(device.uuid().unwrap(), csv[1]);
    assert_eq!(device.pci_info().unwrap().bus_id, csv[2]);
    let mode = device.mig_mode().unwrap();
    let enabled = |on: u32| if on == 1 { "Enabled" } else { "Disabled" };
    assert_eq!([enabled(mode.current), enabled(mode.pending)], [&csv[3][..], &csv[4]]);
    let lib = nvml.lib();
    let compute = raw_u32(lib.nvmlDeviceGetComputeMode.as_ref().unwrap(), handle(&device));
    assert_eq!((compute, &csv[5][..]), (Ok(0), "Default"));
    let persistence = raw_u32(lib.nvmlDeviceGetPersistenceMode.as_ref().unwrap(), handle(&device));
    assert_eq!(enabled(persistence.unwrap()), csv[6]);
    assert_eq!(nvml.sys_driver_version().unwrap(), csv[9]);
}

fn check_lookups(fx: &Fixture, nvml: &Nvml, uuid: &str, bus_id: &str) {
    let by_uuid = nvml.device_by_uuid(uuid).unwrap();
    assert_eq!(by_uuid.index().unwrap(), 0);
    let by_bus = nvml.device_by_pci_bus_id(bus_id).unwrap();
    assert_eq!(by_bus.uuid().unwrap(), uuid);

    // "nvmlDeviceGetHandleByUUID(unknown) -> NOT_FOUND (6); nvmlDeviceGetHandleByIndex(1) on a
    // 1-GPU host -> INVALID_ARGUMENT (2)"
    let lib = nvml.lib();
    let line = format!("nvmlDeviceGetHandleByUUID(unknown) {}", fx.line("nvmlDeviceGetHandleByUUID(unknown)"));
    let got = outcomes(&line);
    assert_eq!(got.len(), 2, "{line}");
    for (call, code) in got {
        let mut out: nvmlDevice_t = std::ptr::null_mut();
        let rc = if call.starts_with("nvmlDeviceGetHandleByUUID") {
            let unknown = CString::new("GPU-00000000-0000-0000-0000-000000000000").unwrap();
            // SAFETY: a NUL-terminated string and a live out pointer.
            unsafe { lib.nvmlDeviceGetHandleByUUID.as_ref().unwrap()(unknown.as_ptr(), &mut out) }
        } else {
            let index = numbers(call)[0] as u32;
            // SAFETY: a live out pointer.
            unsafe { lib.nvmlDeviceGetHandleByIndex_v2.as_ref().unwrap()(index, &mut out) }
        };
        assert_eq!(rc, code, "{call}");
    }
}

fn check_pci(fx: &Fixture, nvml: &Nvml, device: &nvml_wrapper::Device) {
    // "name: NVIDIA H200; PCI device id 0x233510de, subsystem 0x18bf10de; bus 00000000:00:06.0"
    let line = fx.line("name: NVIDIA H200;");
    let pci = device.pci_info().unwrap();
    assert_eq!(pci.pci_device_id, hex_after(line, "PCI device id "));
    assert_eq!(pci.pci_sub_system_id, Some(hex_after(line, "subsystem ")));
    let bus_id = line.rsplit(' ').next().unwrap();
    assert_eq!(pci.bus_id, bus_id);
    let parts: Vec<u32> = bus_id.split([':', '.']).map(|p| u32::from_str_radix(p, 16).unwrap()).collect();
    assert_eq!((pci.domain, pci.bus, pci.device), (parts[0], parts[1], parts[2]));
    let raw = pci_info_raw(nvml, handle(device));
    let legacy = format!("{:04X}:{:02X}:{:02X}.0", parts[0], parts[1], parts[2]);
    assert_eq!(c_field(&raw.busIdLegacy), legacy);
    assert_eq!(c_field(&raw.busId), bus_id);
}

fn check_memory(fx: &Fixture, nvml: &Nvml, device: &nvml_wrapper::Device) {
    // "nvmlDeviceGetMemoryInfo (v1): total 150754820096, free 150109880320, used 644939776 bytes"
    let line = fx.line("nvmlDeviceGetMemoryInfo (v1):");
    let v1 = memory_v1(nvml, handle(device));
    assert_eq!(v1.total, num_after(line, "total "));
    assert_eq!(v1.free, num_after(line, "free "));
    assert_eq!(v1.used, num_after(line, "used "));

    // "nvmlDeviceGetMemoryInfo_v2: total ..., reserved ..., free ..., used 0"
    let line = fx.line("nvmlDeviceGetMemoryInfo_v2:");
    let v2 = device.memory_info().unwrap();
    assert_eq!(v2.total, num_after(line, "total "));
    assert_eq!(v2.reserved, num_after(line, "reserved "));
    assert_eq!(v2.free, num_after(line, "free "));
    assert_eq!(v2.used, num_after(line, "used "));

    // "mem total/used/free MiB 143771 615 143155" (python, v1)
    let mib = numbers(fx.line("mem total/used/free MiB"));
    assert_eq!(vec![v1.total / MIB, v1.used / MIB, v1.free / MIB], mib);

    // nvidia-smi: memory.total 143771 MiB, memory.used 0 MiB (v2's used).
    let csv = fx.smi_csv();
    assert_eq!(v2.total / MIB, numbers(&csv[7])[0]);
    assert_eq!(v2.used / MIB, numbers(&csv[8])[0]);

    // The version field is checked.
    let sym = nvml.lib().nvmlDeviceGetMemoryInfo_v2.as_ref().unwrap();
    // SAFETY: a plain C struct; all zeroes is a valid value.
    let mut wrong: nvml_wrapper_sys::bindings::nvmlMemory_v2_t = unsafe { zeroed() };
    wrong.version = 1;
    // SAFETY: `wrong` is a live, writable struct.
    let rc = unsafe { sym(handle(device), &mut wrong) };
    assert_eq!(rc, ARGUMENT_VERSION_MISMATCH);
}

fn check_modes(fx: &Fixture, nvml: &Nvml, device: &nvml_wrapper::Device) {
    let lib = nvml.lib();
    // "mig mode [0, 0]", "max mig 0" (python) and the NVML section's line.
    let mode = device.mig_mode().unwrap();
    assert_eq!(vec![mode.current as u64, mode.pending as u64], numbers(fx.line("mig mode")));
    let line = fx.line("nvmlDeviceGetMigMode:");
    assert_eq!(mode.current as u64, num_after(line, "current "));
    assert_eq!(mode.pending as u64, num_after(line, "pending "));
    let max = device.mig_device_count().unwrap() as u64;
    assert_eq!(max, num_after(line, "nvmlDeviceGetMaxMigDeviceCount: "));
    assert_eq!(max, numbers(fx.line("max mig"))[0]);

    // "nvmlDeviceGetMigDeviceHandleByIndex(dev, 0): NVML_ERROR_NOT_FOUND (6);
    //  nvmlDeviceIsMigDeviceHandle: 0"
    let line = fx.line("nvmlDeviceGetMigDeviceHandleByIndex(dev, 0):");
    let mut mig: nvmlDevice_t = std::ptr::null_mut();
    let sym = lib.nvmlDeviceGetMigDeviceHandleByIndex.as_ref().unwrap();
    // SAFETY: a live out pointer.
    let rc = unsafe { sym(handle(device), 0, &mut mig) };
    assert_eq!(rc as u64, numbers(line.split(';').next().unwrap())[0]);
    assert_eq!(device.mig_is_mig_device_handle().unwrap() as u64, num_after(line, "nvmlDeviceIsMigDeviceHandle: "));

    // "compute mode 0 (DEFAULT); persistence mode 1", and the python "compute mode 0".
    let line = fx.line("compute mode 0 (DEFAULT);");
    let compute = raw_u32(lib.nvmlDeviceGetComputeMode.as_ref().unwrap(), handle(device)).unwrap();
    assert_eq!(compute, 0);
    assert_eq!(numbers(fx.line("compute mode"))[0], 0);
    let persistence = raw_u32(lib.nvmlDeviceGetPersistenceMode.as_ref().unwrap(), handle(device));
    assert_eq!(persistence.unwrap() as u64, num_after(line, "persistence mode "));

    // "architecture 9 (Hopper); CUDA compute capability 9.0"
    let line = fx.line("supported event types");
    let arch = raw_u32(lib.nvmlDeviceGetArchitecture.as_ref().unwrap(), handle(device)).unwrap();
    assert_eq!(arch as u64, num_after(line, "architecture "));
    let cc = device.cuda_compute_capability().unwrap();
    let at = line.find("compute capability ").unwrap() + "compute capability ".len();
    let (major, minor) = line[at..].split(';').next().unwrap().split_once('.').unwrap();
    assert_eq!((cc.major.to_string().as_str(), cc.minor.to_string().as_str()), (major, minor));
}

fn check_profiles(fx: &Fixture, nvml: &Nvml, device: &nvml_wrapper::Device) {
    // "gi profile N id I slices S count C memMiB M sm X copy a dec b enc c jpeg d ofa e" or
    // "gi profile N err Not Supported", for N in 0..16.
    let lines: Vec<&str> = fx.lines_starting("gi profile ").map(|(_, l)| l).collect();
    assert_eq!(lines.len(), 16, "the probe read indexes 0..16");
    for line in lines {
        let index = numbers(line)[0] as u32;
        let got = device.profile_info(index);
        if let Some(err) = line.split_once(" err ").map(|(_, e)| e) {
            let sym = nvml.lib().nvmlDeviceGetGpuInstanceProfileInfo.as_ref().unwrap();
            // SAFETY: a plain C struct; all zeroes is a valid value.
            let mut info = unsafe { zeroed() };
            // SAFETY: `info` is a live, writable struct.
            let rc = unsafe { sym(handle(device), index, &mut info) };
            assert_eq!(error_string(nvml, rc), err, "index {index}: rc {rc}");
            assert!(got.is_err(), "index {index}");
            continue;
        }
        let info = got.unwrap_or_else(|e| panic!("index {index}: {e:?}"));
        let field = |key: &str| num_after(line, &format!(" {key} "));
        assert_eq!(info.id as u64, field("id"), "index {index}");
        assert_eq!(info.slice_count as u64, field("slices"), "index {index}");
        assert_eq!(info.instance_count as u64, field("count"), "index {index}");
        assert_eq!(info.memory_size_mb, field("memMiB"), "index {index}");
        assert_eq!(info.multiprocessor_count as u64, field("sm"), "index {index}");
        assert_eq!(info.copy_engine_count as u64, field("copy"), "index {index}");
        assert_eq!(info.decoder_count as u64, field("dec"), "index {index}");
        assert_eq!(info.encoder_count as u64, field("enc"), "index {index}");
        assert_eq!(info.jpeg_count as u64, field("jpeg"), "index {index}");
        assert_eq!(info.ofa_count as u64, field("ofa"), "index {index}");
        assert!(!info.is_p2p_supported, "index {index}");
    }

    // "nvmlDeviceGetGpuInstanceProfileInfo: index 5 -> NOT_SUPPORTED (3); index 18 or 99 ->
    // INVALID_ARGUMENT (2)"
    let sym = nvml.lib().nvmlDeviceGetGpuInstanceProfileInfo.as_ref().unwrap();
    let cases = outcomes(fx.line("nvmlDeviceGetGpuInstanceProfileInfo:"));
    assert_eq!(cases.len(), 2);
    for (lhs, code) in cases {
        for index in numbers(lhs) {
            // SAFETY: a plain C struct; all zeroes is a valid value.
            let mut info = unsafe { zeroed() };
            // SAFETY: `info` is a live, writable struct.
            let rc = unsafe { sym(handle(device), index as u32, &mut info) };
            assert_eq!(rc, code, "profile index {index}");
        }
    }

    // "nvmlDeviceGetGpuInstanceProfileInfoV(index 0): id 19, name "MIG 1g.18gb" (...),
    //  sliceCount 1, memorySizeMB 16384; index 7: id 20 "MIG 1g.18gb+me""
    let line = fx.line2("nvmlDeviceGetGpuInstanceProfileInfoV(");
    for seg in line.split(';') {
        let index = num_after(seg, "index ") as u32;
        let (info, name) = profile_info_v(nvml, handle(device), index).unwrap();
        assert_eq!(info.id as u64, num_after(seg, "id "), "V index {index}");
        assert_eq!(name, quoted(seg), "V index {index}");
        if seg.contains("sliceCount") {
            assert_eq!(info.sliceCount as u64, num_after(seg, "sliceCount "));
            assert_eq!(info.memorySizeMB, num_after(seg, "memorySizeMB "));
        }
    }
    // The V call checks its version field.
    let sym = nvml.lib().nvmlDeviceGetGpuInstanceProfileInfoV.as_ref().unwrap();
    // SAFETY: a plain C struct; all zeroes is a valid value.
    let mut wrong: nvml_wrapper_sys::bindings::nvmlGpuInstanceProfileInfo_v2_t = unsafe { zeroed() };
    wrong.version = 2 << 24;
    // SAFETY: `wrong` is a live, writable struct.
    let rc = unsafe { sym(handle(device), 0, &mut wrong) };
    assert_eq!(rc, ARGUMENT_VERSION_MISMATCH);
}

/// One profile row of `nvidia-smi mig -lgip`.
struct SmiProfile {
    name: String,
    id: u32,
    free: u32,
    total: u32,
    gib: f64,
    p2p: bool,
    sm_dec_enc: [u32; 3],
    ce_jpeg_ofa: [u32; 3],
}

fn smi_profiles(fx: &Fixture) -> Vec<SmiProfile> {
    fx.lines_starting("|   0  MIG ")
        .map(|(i, rest)| {
            let t: Vec<&str> = rest.split_whitespace().collect();
            // "1g.18gb 19 7/7 16.00 No 16 1 0 |"
            let (free, total) = t[2].split_once('/').unwrap();
            let second: Vec<u32> = numbers(&fx.lines[i + 1]).into_iter().map(|n| n as u32).collect();
            SmiProfile {
                name: format!("MIG {}", t[0]),
                id: t[1].parse().unwrap(),
                free: free.parse().unwrap(),
                total: total.parse().unwrap(),
                gib: t[3].parse().unwrap(),
                p2p: t[4] != "No",
                sm_dec_enc: [t[5].parse().unwrap(), t[6].parse().unwrap(), t[7].parse().unwrap()],
                ce_jpeg_ofa: second.try_into().expect("CE JPEG OFA"),
            }
        })
        .collect()
}

fn check_smi_profile_table(fx: &Fixture, nvml: &Nvml, device: &nvml_wrapper::Device) {
    let rows = smi_profiles(fx);
    assert_eq!(rows.len(), 7, "nvidia-smi lists 7 profiles");
    // The profiles by id, through the V call over every index.
    let by_id: BTreeMap<u32, _> = (0..17)
        .filter_map(|index| profile_info_v(nvml, handle(device), index).ok())
        .map(|(info, name)| (info.id, (info, name)))
        .collect();
    assert_eq!(by_id.len(), rows.len(), "the same set of profiles");
    for row in rows {
        let (info, name) = &by_id[&row.id];
        assert_eq!(name, &row.name, "id {}", row.id);
        assert_eq!(info.instanceCount, row.total, "{}", row.name);
        assert_eq!(remaining_capacity(nvml, handle(device), row.id), Ok(row.free), "{}", row.name);
        assert_eq!(info.memorySizeMB as f64 / 1024.0, row.gib, "{}", row.name);
        assert_eq!(info.isP2pSupported != 0, row.p2p, "{}", row.name);
        let got = [info.multiprocessorCount, info.decoderCount, info.encoderCount];
        assert_eq!(got, row.sm_dec_enc, "{} SM DEC ENC", row.name);
        let got = [info.copyEngineCount, info.jpegCount, info.ofaCount];
        assert_eq!(got, row.ce_jpeg_ofa, "{} CE JPEG OFA", row.name);
    }
}

fn check_placements(fx: &Fixture, nvml: &Nvml, device: &nvml_wrapper::Device) {
    // "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1" / "... Placement : {0}:8"
    let lines: Vec<&str> = fx.lines_starting("GPU  0 Profile ID").map(|(_, l)| l).collect();
    assert_eq!(lines.len(), 7);
    for line in lines {
        let id = numbers(line)[0] as u32;
        let braces = &line[line.find('{').unwrap()..];
        let (starts, size) = braces.split_once("}:").unwrap();
        let size = size.trim().parse::<u32>().unwrap();
        let want: Vec<(u32, u32)> = numbers(starts).into_iter().map(|s| (s as u32, size)).collect();
        assert_eq!(placements(nvml, handle(device), id), Ok(want), "profile id {id}");
    }
    // "count query (NULL buffer) SUCCESS; id 19 -> (0,1)..(6,1); id 14 -> (0,2),(2,2),(4,2); ..."
    let line = fx.line2("nvmlDeviceGetGpuInstancePossiblePlacements_v2:");
    assert!(line.starts_with("count query (NULL buffer) SUCCESS"), "{line}");
    let mut checked = 0;
    for (lhs, rhs) in line.split(';').filter_map(|seg| seg.split_once("->")) {
        let id = numbers(lhs)[0] as u32;
        let n = numbers(rhs);
        let want: Vec<(u32, u32)> = if rhs.contains("..") {
            // "(first,size)..(last,size)": every start from first to last.
            (n[0]..=n[2]).map(|s| (s as u32, n[1] as u32)).collect()
        } else {
            n.chunks(2).map(|p| (p[0] as u32, p[1] as u32)).collect()
        };
        assert_eq!(placements(nvml, handle(device), id), Ok(want), "profile id {id}");
        checked += 1;
    }
    assert_eq!(checked, 4);
    // A buffer one short: INSUFFICIENT_SIZE with the count needed.
    let sym = nvml.lib().nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref().unwrap();
    let mut buf = [nvml_wrapper_sys::bindings::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 6];
    let mut count = 6;
    // SAFETY: `buf` holds `count` placements.
    let rc = unsafe { sym(handle(device), 19, buf.as_mut_ptr(), &mut count) };
    assert_eq!((rc, count), (INSUFFICIENT_SIZE, 7));
}

fn check_instances_with_mig_off(fx: &Fixture, nvml: &Nvml, device: &nvml_wrapper::Device) {
    // "nvmlDeviceGetGpuInstanceRemainingCapacity with MIG disabled: SUCCESS, 7 (id 19), ..."
    let line = fx.line("nvmlDeviceGetGpuInstanceRemainingCapacity with MIG disabled:");
    let (status, rest) = line.split_once(',').unwrap();
    assert_eq!(status, "SUCCESS");
    let pairs = numbers(rest);
    assert_eq!(pairs.len(), 8);
    for pair in pairs.chunks(2) {
        let (want, id) = (pair[0] as u32, pair[1] as u32);
        assert_eq!(remaining_capacity(nvml, handle(device), id), Ok(want), "profile id {id}");
    }
    // "nvmlDeviceGetGpuInstances with MIG disabled: SUCCESS, count 0"
    let line = fx.line("nvmlDeviceGetGpuInstances with MIG disabled:");
    assert!(line.starts_with("SUCCESS"), "{line}");
    let count = num_after(line, "count ") as usize;
    for row in smi_profiles(fx) {
        assert_eq!(gpu_instances(nvml, handle(device), row.id).map(|v| v.len()), Ok(count), "{}", row.name);
    }
}

fn expect_processes(list: &str, pids: &BTreeMap<u64, u32>) -> Vec<ProcessInfo> {
    tuples(list)
        .into_iter()
        .map(|t| {
            let none = |i: usize| t.get(i).copied().filter(|&v| v != u32::MAX as u64).map(|v| v as u32);
            ProcessInfo {
                pid: pids[&t[0]],
                used_gpu_memory: UsedGpuMemory::Used(t[1] * MIB),
                gpu_instance_id: none(2),
                compute_instance_id: none(3),
            }
        })
        .collect()
}

/// Registers one live process per tuple of `compute` (MPS clients: those also in `mps`), then
/// expects both lists back, with the probe's pids mapped to ours.
fn check_process_scenario(state: &Path, device: &nvml_wrapper::Device, compute: &str, mps: &str) {
    let mps_pids: Vec<u64> = tuples(mps).into_iter().map(|t| t[0]).collect();
    let sleepers: Vec<(Vec<u64>, Sleeper)> = tuples(compute).into_iter().map(|t| (t, Sleeper::spawn())).collect();
    let pids: BTreeMap<u64, u32> = sleepers.iter().map(|(t, s)| (t[0], s.pid())).collect();
    SimHost::update(state, |h| {
        h.gpus[0].processes = sleepers
            .iter()
            .map(|(t, s)| SimProcess {
                pid: s.pid(),
                used_mib: t[1],
                gpu_instance_id: None,
                mps_client: mps_pids.contains(&t[0]),
            })
            .collect();
        Ok::<_, ()>(())
    })
    .unwrap()
    .unwrap();
    assert_eq!(device.running_compute_processes().unwrap(), expect_processes(compute, &pids), "{compute}");
    assert_eq!(device.mps_running_compute_processes().unwrap(), expect_processes(mps, &pids), "{mps}");
    drop(sleepers);
    // Once they are gone, NVML shows none of them though the state still lists them.
    assert_eq!(device.running_compute_processes().unwrap(), vec![]);
    assert_eq!(device.mps_running_compute_processes().unwrap(), vec![]);
}

fn check_processes(fx: &Fixture, state: &Path, device: &nvml_wrapper::Device) {
    // "procs []" with nothing running.
    assert!(tuples(fx.line("procs")).is_empty());
    assert_eq!(device.running_compute_processes().unwrap(), vec![]);

    // "one plain CUDA process:    ComputeRunningProcesses [(461, 774, 4294967295, 4294967295)];
    //  MPSComputeRunningProcesses []"
    let line = fx.line("one plain CUDA process:");
    let (compute, mps) = line.split_once(';').unwrap();
    check_process_scenario(state, device, compute, mps);

    // "MPS daemon + two clients:  ComputeRunningProcesses [(531 nvidia-cuda-mps-server, 66),
    //  (498, 772), (499, 772)]" then "MPSComputeRunningProcesses [(498, 772), (499, 772)]"
    let line = fx.line2("MPS daemon + two clients:");
    let (compute, mps) = line.split_once("MPSComputeRunningProcesses").unwrap();
    check_process_scenario(state, device, compute, mps);
}
