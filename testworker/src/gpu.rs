//! Simulated GPU memory: the worker registers itself in gpu-sim's NVML state on the device
//! `CUDA_VISIBLE_DEVICES` names (GPU or MIG UUID), as a CUDA process shows up in NVML's process
//! lists. Under MPS the claim plus the CUDA context counts against the client's pinned memory
//! limit (probe: with `0=1G` a 512 MiB allocation failed), and a failed allocation is an
//! out-of-memory error that a worker may survive.

use fake_mps::client::Client;
use gpu_sim::SimProcess;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The CUDA context's share of the pinned limit (about 500 MiB on the H200 probe).
const CONTEXT_MIB: u64 = 500;
const GROW_TICK: Duration = Duration::from_millis(100);

/// Registers `mib` (or nothing past the limit) and starts growing it if asked.
pub fn claim(mib: u64, grow_per_sec: u64, mps: Option<&Arc<Client>>, exit_on_oom: bool) {
    let Some(state) = std::env::var_os(gpu_sim::STATE_ENV).filter(|s| !s.is_empty()).map(PathBuf::from) else {
        crate::exit::fail("--gpu-memory needs GPU_SIM_STATE (the simulated NVML state)");
    };
    let limit = mps.and_then(|c| c.pinned_limit_mib);
    let claimed = if fits(mib, limit) {
        mib
    } else {
        out_of_memory(limit, exit_on_oom);
        0
    };
    let device = std::env::var(fake_mps::env::VISIBLE_DEVICES_ENV).ok();
    let device = device.as_deref().and_then(|d| d.split(',').next());
    let process =
        SimProcess { pid: std::process::id(), used_mib: claimed, gpu_instance_id: None, mps_client: mps.is_some() };
    crate::exit::registered(state.clone());
    match fake_mps::sim::register(&state, device, process) {
        Ok(()) => println!("gpu memory: {claimed} MiB"),
        Err(fake_mps::sim::SimError::NoDevice(_)) => {
            println!("CUDA error: no CUDA-capable device is detected");
            crate::exit::exit(1);
        }
        Err(e) => crate::exit::fail(&e.to_string()),
    }
    if grow_per_sec > 0 && claimed == mib {
        std::thread::spawn(move || grow(&state, mib, grow_per_sec, limit, exit_on_oom));
    }
}

fn fits(mib: u64, limit: Option<u64>) -> bool {
    limit.is_none_or(|l| mib + CONTEXT_MIB <= l)
}

fn out_of_memory(limit: Option<u64>, exit_on_oom: bool) {
    println!("CUDA error: out of memory (limit {} MiB)", limit.unwrap_or(0));
    if exit_on_oom {
        crate::exit::exit(2);
    }
}

/// Raises the claim every tick until an allocation would pass the limit.
fn grow(state: &Path, base: u64, per_sec: u64, limit: Option<u64>, exit_on_oom: bool) {
    let start = Instant::now();
    let mut current = base;
    loop {
        std::thread::sleep(GROW_TICK);
        let wanted = base + (per_sec as f64 * start.elapsed().as_secs_f64()) as u64;
        if wanted == current {
            continue;
        }
        if !fits(wanted, limit) {
            out_of_memory(limit, exit_on_oom);
            return;
        }
        current = wanted;
        let _ = fake_mps::sim::set_used(state, std::process::id(), current);
    }
}
