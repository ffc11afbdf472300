use super::{io_error, rpc_error};
use crate::cli::Global;
use crate::output::{json as print_json, mib, table};
use crate::views;
use crate::{CtlError, Exit, client};
use gpu_agent_proto::v1 as pb;
use std::io::Write;

pub async fn run(global: &Global, as_json: bool, out: &mut dyn Write) -> Result<Exit, CtlError> {
    let mut c = client::connect(global).await?;
    let reply = c.list_workers(pb::ListWorkersRequest {}).await.map_err(rpc_error)?.into_inner();
    if as_json {
        print_json(out, &views::Workers { workers: reply.workers.iter().map(views::Worker::from).collect() })
            .map_err(io_error)?;
        return Ok(Exit::Ok);
    }
    if reply.workers.is_empty() {
        writeln!(out, "no workers").map_err(io_error)?;
        return Ok(Exit::Ok);
    }
    let rows = reply
        .workers
        .iter()
        .map(|w| {
            vec![
                w.model.clone(),
                w.replica.to_string(),
                if w.pid == 0 { "-".into() } else { w.pid.to_string() },
                w.state.clone(),
                w.restarts.to_string(),
                format!("{} ({})", w.gpu, short(&w.device)),
                w.isolation.clone(),
                format!("{} / {}", mib(w.gpu_memory_used_mib), mib(w.memory_budget_mib)),
                w.last_exit.clone(),
            ]
        })
        .collect();
    writeln!(
        out,
        "{}",
        table(
            &[
                "MODEL",
                "REPLICA",
                "PID",
                "STATE",
                "RESTARTS",
                "GPU (DEVICE)",
                "ISOLATION",
                "GPU MEM / BUDGET",
                "LAST EXIT"
            ],
            rows
        )
    )
    .map_err(io_error)?;
    Ok(Exit::Ok)
}

/// `GPU-9189792d-c677-...` -> `GPU-9189792d`: enough to tell devices apart in a table.
fn short(uuid: &str) -> &str {
    uuid.match_indices('-').nth(1).map(|(i, _)| &uuid[..i]).unwrap_or(uuid)
}
