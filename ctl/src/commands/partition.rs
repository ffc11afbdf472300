//! `gpuctl partition show|set|clear`. `set` and `clear` edit the agent's stored plan (the one
//! source of truth) and apply it, streaming like `apply`.

use super::apply::follow;
use super::{io_error, rpc_error};
use crate::cli::{Global, PartitionCmd};
use crate::output::{json as print_json, mib, table};
use crate::{CtlError, Exit, client};
use gpu_agent_proto::v1 as pb;
use serde_json::json;
use std::io::Write;

pub async fn run(
    global: &Global,
    cmd: PartitionCmd,
    as_json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CtlError> {
    let mut c = client::connect(global).await?;
    let (gpu, profiles, clear, change) = match cmd {
        PartitionCmd::Show { gpu } => return show(&mut c, gpu.as_deref(), as_json, out).await,
        PartitionCmd::Set { gpu, profiles, change } => (gpu, profiles, false, change),
        PartitionCmd::Clear { gpu, change } => (gpu, Vec::new(), true, change),
    };
    let request = pb::PartitionRequest { gpu, profiles, clear, dry_run: change.dry_run, drain: change.drain };
    let stream = c.partition(request).await.map_err(rpc_error)?.into_inner();
    follow(stream, change.dry_run, as_json, out, err).await
}

/// `gpuctl drain GPU` / `gpuctl undrain GPU`.
pub async fn drain(
    global: &Global,
    gpu: &str,
    undrain: bool,
    as_json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Exit, CtlError> {
    let mut c = client::connect(global).await?;
    let stream = c.drain(pb::DrainRequest { gpu: gpu.to_string(), undrain }).await.map_err(rpc_error)?.into_inner();
    follow(stream, false, as_json, out, err).await
}

/// Free memory slices of a GPU as runs "start-end".
fn free_slices(g: &pb::Gpu) -> Vec<String> {
    let used: u32 = g.instances.iter().fold(0, |m, i| m | (((1u32 << i.size) - 1) << i.start));
    let mut runs = Vec::new();
    let mut s = 0;
    while s < g.memory_slices {
        if used & (1 << s) == 0 {
            let begin = s;
            while s < g.memory_slices && used & (1 << s) == 0 {
                s += 1;
            }
            runs.push(if s - 1 == begin { begin.to_string() } else { format!("{begin}-{}", s - 1) });
        } else {
            s += 1;
        }
    }
    runs
}

async fn show(
    c: &mut client::Client,
    which: Option<&str>,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<Exit, CtlError> {
    let gpus = c.list_gpus(pb::ListGpusRequest {}).await.map_err(rpc_error)?.into_inner().gpus;
    let workers = c.list_workers(pb::ListWorkersRequest {}).await.map_err(rpc_error)?.into_inner().workers;
    let selected: Vec<&pb::Gpu> =
        match which {
            Some(w) => {
                let found = gpus.iter().find(|g| g.index.to_string() == w || g.uuid == w);
                vec![found.ok_or_else(|| {
                    CtlError::usage(format!("no GPU {w:?} on this host (it has {} GPUs)", gpus.len()))
                })?]
            }
            None => gpus.iter().filter(|g| g.mig_current || g.mig_pending || !g.instances.is_empty()).collect(),
        };
    let in_instance = |uuid: &str| -> Vec<String> {
        workers
            .iter()
            .filter(|w| !uuid.is_empty() && w.device == uuid)
            .map(|w| format!("{}/{}", w.model, w.replica))
            .collect()
    };
    if as_json {
        let doc = json!({ "gpus": selected.iter().map(|g| json!({
            "index": g.index,
            "name": g.name,
            "mig": {"current": g.mig_current, "pending": g.mig_pending},
            "memory_slices": g.memory_slices,
            "free_slices": free_slices(g),
            "instances": g.instances.iter().map(|i| json!({
                "profile": i.profile, "profile_id": i.profile_id, "start": i.start, "size": i.size,
                "uuid": (!i.uuid.is_empty()).then_some(&i.uuid), "memory_mib": i.memory_mib, "id": i.id,
                "workers": in_instance(&i.uuid),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>() });
        print_json(out, &doc).map_err(io_error)?;
        return Ok(Exit::Ok);
    }
    if selected.is_empty() {
        writeln!(out, "no GPU has MIG on").map_err(io_error)?;
        return Ok(Exit::Ok);
    }
    for g in selected {
        let mode = match (g.mig_current, g.mig_pending) {
            (true, true) => "MIG on",
            (false, false) => "MIG off",
            (true, false) => "MIG on, off pending",
            (false, true) => "MIG off, on pending",
        };
        let free = free_slices(g);
        let free = if free.is_empty() { "none".to_string() } else { free.join(", ") };
        writeln!(out, "GPU {}: {} ({mode}); free memory slices: {free}", g.index, g.name).map_err(io_error)?;
        let rows = g
            .instances
            .iter()
            .map(|i| {
                let workers = in_instance(&i.uuid);
                vec![
                    format!("{}@{}", i.profile, i.start),
                    i.id.to_string(),
                    mib(i.memory_mib),
                    if i.uuid.is_empty() { "(no compute instance)".into() } else { i.uuid.clone() },
                    if workers.is_empty() { "-".into() } else { workers.join(" ") },
                ]
            })
            .collect();
        writeln!(out, "{}\n", table(&["INSTANCE", "ID", "MEMORY", "MIG DEVICE", "WORKERS"], rows)).map_err(io_error)?;
    }
    Ok(Exit::Ok)
}
