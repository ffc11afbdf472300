use super::{io_error, rpc_error};
use crate::cli::Global;
use crate::output::{json as print_json, mib, table};
use crate::{CtlError, Exit, client};
use gpu_agent_proto::v1 as pb;
use serde_json::json;
use std::io::Write;

pub async fn run(global: &Global, as_json: bool, out: &mut dyn Write) -> Result<Exit, CtlError> {
    let mut c = client::connect(global).await?;
    let s = c.status(pb::StatusRequest {}).await.map_err(rpc_error)?.into_inner();
    let workers = s.workers.unwrap_or_default();
    if as_json {
        let doc = json!({
            "agent_version": s.agent_version,
            "driver_version": s.driver_version,
            "simulated": (!s.simulated.is_empty()).then_some(&s.simulated),
            "read_only_gpus": s.read_only_gpus,
            "state_dir": s.state_dir,
            "uptime_seconds": s.uptime_seconds,
            "gpus": s.gpus.iter().map(|g| json!({
                "index": g.index, "uuid": g.uuid, "name": g.name,
                "sharing": (!g.sharing.is_empty()).then_some(&g.sharing),
                "mig": {"current": g.mig_current, "pending": g.mig_pending},
                "mig_instances": g.mig_instances, "workers": g.workers, "drained": g.drained,
                "memory_mib": g.memory_total_mib, "memory_used_mib": g.memory_used_mib,
            })).collect::<Vec<_>>(),
            "workers": {"total": workers.total, "running": workers.running, "starting": workers.starting, "stopped": workers.stopped, "failed": workers.failed},
            "mps_daemons": s.mps_daemons.iter().map(|d| json!({
                "name": d.name, "gpu": d.gpu, "device": d.device, "pid": (d.pid != 0).then_some(d.pid),
                "state": d.state, "restarts": d.restarts, "last_error": (!d.last_error.is_empty()).then_some(&d.last_error),
                "active_thread_percentage": d.active_thread_percentage, "pinned_limit_mib": d.pinned_limit_mib,
            })).collect::<Vec<_>>(),
            "last_apply": s.last_apply.as_ref().map(|a| json!({"at_unix": a.at_unix, "ok": a.ok, "source": a.source, "steps": a.steps, "message": a.message})),
        });
        print_json(out, &doc).map_err(io_error)?;
        return Ok(Exit::Ok);
    }
    let mode = if s.simulated.is_empty() { "real driver".to_string() } else { format!("simulated {}", s.simulated) };
    let ro = if s.read_only_gpus { ", read-only GPUs" } else { "" };
    let mut text = format!(
        "Agent:    gpu-agent {} ({mode}{ro}), driver {}, up {}s\nState:    {}\nWorkers:  {} total, {} running, {} stopped, {} failed\n",
        s.agent_version,
        s.driver_version,
        s.uptime_seconds,
        s.state_dir,
        workers.total,
        workers.running,
        workers.stopped,
        workers.failed
    );
    text += &match &s.last_apply {
        Some(a) => format!(
            "Last apply: {} {} ({}): {}\n",
            if a.ok { "ok" } else { "FAILED" },
            a.source,
            age(a.at_unix),
            a.message
        ),
        None => "Last apply: none\n".to_string(),
    };
    let rows = s
        .gpus
        .iter()
        .map(|g| {
            vec![
                g.index.to_string(),
                g.name.clone(),
                match (g.drained, g.sharing.is_empty()) {
                    (true, _) => "(drained)".into(),
                    (false, true) => "(unmanaged)".into(),
                    (false, false) => g.sharing.clone(),
                },
                mig_word(g.mig_current, g.mig_pending),
                g.mig_instances.to_string(),
                g.workers.to_string(),
                format!("{} / {}", mib(g.memory_used_mib), mib(g.memory_total_mib)),
            ]
        })
        .collect();
    writeln!(out, "{text}\n{}", table(&["GPU", "NAME", "SHARING", "MIG", "INSTANCES", "WORKERS", "MEMORY USED"], rows))
        .map_err(io_error)?;
    if !s.mps_daemons.is_empty() {
        let rows = s
            .mps_daemons
            .iter()
            .map(|d| {
                vec![
                    d.name.clone(),
                    d.device.clone(),
                    if d.pid == 0 { "-".into() } else { d.pid.to_string() },
                    d.state.clone(),
                    d.restarts.to_string(),
                    d.active_thread_percentage.map(|p| format!("{p}%")).unwrap_or_else(|| "-".into()),
                    d.pinned_limit_mib.map(mib).unwrap_or_else(|| "-".into()),
                    d.last_error.clone(),
                ]
            })
            .collect();
        writeln!(
            out,
            "\nMPS daemons:\n{}",
            table(&["DAEMON", "DEVICE", "PID", "STATE", "RESTARTS", "THREADS", "PINNED", "LAST ERROR"], rows)
        )
        .map_err(io_error)?;
    }
    Ok(Exit::Ok)
}

pub fn mig_word(current: bool, pending: bool) -> String {
    match (current, pending) {
        (true, true) => "on".into(),
        (false, false) => "off".into(),
        (true, false) => "on (off pending)".into(),
        (false, true) => "off (on pending)".into(),
    }
}

fn age(at_unix: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(at_unix);
    format!("{}s ago", (now - at_unix).max(0))
}
