use super::{io_error, rpc_error};
use crate::cli::Global;
use crate::output::json as print_json;
use crate::{CtlError, Exit, client};
use gpu_agent_proto::v1 as pb;
use serde_json::json;
use std::io::Write;

pub async fn run(global: &Global, as_json: bool, out: &mut dyn Write) -> Result<Exit, CtlError> {
    let mut c = client::connect(global).await?;
    let reply = c.list_events(pb::ListEventsRequest {}).await.map_err(rpc_error)?.into_inner();
    if as_json {
        let events: Vec<_> = reply
            .events
            .iter()
            .map(|e| {
                json!({"at_unix_ms": e.at_unix_ms, "level": e.level, "kind": e.kind, "message": e.message,
                "model": (!e.model.is_empty()).then_some(&e.model), "gpu": e.gpu})
            })
            .collect();
        print_json(out, &json!({ "events": events })).map_err(io_error)?;
        return Ok(Exit::Ok);
    }
    for e in &reply.events {
        let secs = e.at_unix_ms / 1000;
        let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
        writeln!(out, "{h:02}:{m:02}:{s:02}.{:03} {:7} {:20} {}", e.at_unix_ms % 1000, e.level, e.kind, e.message)
            .map_err(io_error)?;
    }
    Ok(Exit::Ok)
}
