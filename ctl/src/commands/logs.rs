//! `gpuctl logs`, `gpuctl restart`, `gpuctl stop`: one model's workers.

use super::{io_error, rpc_error};
use crate::cli::Global;
use crate::output::json as print_json;
use crate::{CtlError, Exit, client};
use gpu_agent_proto::v1 as pb;
use std::collections::BTreeMap;
use std::io::Write;

pub async fn logs(
    global: &Global,
    model: &str,
    replica: Option<u32>,
    follow: bool,
    tail: u32,
    out: &mut dyn Write,
) -> Result<Exit, CtlError> {
    let mut c = client::connect(global).await?;
    let request = pb::LogsRequest { model: model.to_string(), replica, follow, tail };
    let mut stream = c.logs(request).await.map_err(rpc_error)?.into_inner();
    // Without --replica every line is marked with its replica; partial lines wait for the rest.
    let mut pending: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    while let Some(chunk) = stream.message().await.map_err(rpc_error)? {
        if replica.is_some() {
            out.write_all(&chunk.data).map_err(io_error)?;
        } else {
            let buf = pending.entry(chunk.replica).or_default();
            buf.extend_from_slice(&chunk.data);
            while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                write!(out, "{model}/{} | ", chunk.replica).map_err(io_error)?;
                out.write_all(&line).map_err(io_error)?;
            }
        }
        out.flush().map_err(io_error)?;
    }
    for (r, rest) in pending.into_iter().filter(|(_, b)| !b.is_empty()) {
        write!(out, "{model}/{r} | ").map_err(io_error)?;
        out.write_all(&rest).map_err(io_error)?;
        writeln!(out).map_err(io_error)?;
    }
    Ok(Exit::Ok)
}

pub async fn action(
    global: &Global,
    model: &str,
    action: &str,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<Exit, CtlError> {
    let mut c = client::connect(global).await?;
    let reply = c
        .model_action(pb::ModelActionRequest { model: model.to_string(), action: action.to_string() })
        .await
        .map_err(rpc_error)?
        .into_inner();
    if as_json {
        print_json(out, &serde_json::json!({ "done": reply.done })).map_err(io_error)?;
    } else {
        for line in &reply.done {
            writeln!(out, "{line}").map_err(io_error)?;
        }
    }
    Ok(Exit::Ok)
}
