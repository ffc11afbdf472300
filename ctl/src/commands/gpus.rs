use super::status::mig_word;
use super::{io_error, rpc_error};
use crate::cli::Global;
use crate::output::{json as print_json, mib, table};
use crate::views;
use crate::{CtlError, Exit, client};
use gpu_agent_proto::v1 as pb;
use std::io::Write;

pub async fn gpus(global: &Global, as_json: bool, out: &mut dyn Write) -> Result<Exit, CtlError> {
    let mut c = client::connect(global).await?;
    let reply = c.list_gpus(pb::ListGpusRequest {}).await.map_err(rpc_error)?.into_inner();
    if as_json {
        print_json(out, &views::Gpus { gpus: reply.gpus.iter().map(views::Gpu::from).collect() }).map_err(io_error)?;
        return Ok(Exit::Ok);
    }
    let mut rows = Vec::new();
    for g in &reply.gpus {
        rows.push(vec![
            g.index.to_string(),
            g.name.clone(),
            g.uuid.clone(),
            mib(g.memory_total_mib),
            mig_word(g.mig_current, g.mig_pending),
            if g.sharing.is_empty() { "-".into() } else { g.sharing.clone() },
            g.processes.len().to_string(),
        ]);
        for i in &g.instances {
            let uuid = if i.uuid.is_empty() { "(no compute instance)".to_string() } else { i.uuid.clone() };
            rows.push(vec![
                String::new(),
                format!("└ {}@{}", i.profile, i.start),
                uuid,
                mib(i.memory_mib),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
    }
    writeln!(out, "{}", table(&["GPU", "NAME", "UUID", "MEMORY", "MIG", "SHARING", "PROCESSES"], rows))
        .map_err(io_error)?;
    Ok(Exit::Ok)
}

pub async fn profiles(global: &Global, gpu: &str, as_json: bool, out: &mut dyn Write) -> Result<Exit, CtlError> {
    let mut c = client::connect(global).await?;
    let reply =
        c.list_profiles(pb::ListProfilesRequest { gpu: gpu.to_string() }).await.map_err(rpc_error)?.into_inner();
    if as_json {
        print_json(out, &views::Profiles::from(&reply)).map_err(io_error)?;
        return Ok(Exit::Ok);
    }
    if reply.profiles.is_empty() {
        writeln!(out, "GPU {} ({}) has no MIG profiles", reply.gpu_index, reply.gpu_name).map_err(io_error)?;
        return Ok(Exit::Ok);
    }
    let rows = reply
        .profiles
        .iter()
        .map(|p| {
            let starts: Vec<String> = p.placements.iter().map(|pl| pl.start.to_string()).collect();
            let size = p.placements.first().map(|pl| pl.size).unwrap_or(0);
            vec![
                p.id.to_string(),
                p.name.clone(),
                mib(p.memory_mib),
                p.sm.to_string(),
                format!("{}/{}/{}/{}/{}", p.copy_engines, p.decoders, p.encoders, p.jpegs, p.ofas),
                p.max.to_string(),
                format!("{{{}}}:{size}", starts.join(",")),
            ]
        })
        .collect();
    writeln!(
        out,
        "GPU {}: {}\n{}",
        reply.gpu_index,
        reply.gpu_name,
        table(&["ID", "PROFILE", "MEMORY", "SM", "CE/DEC/ENC/JPG/OFA", "MAX", "PLACEMENTS"], rows)
    )
    .map_err(io_error)?;
    Ok(Exit::Ok)
}
