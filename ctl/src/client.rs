//! Connecting to the agent. A failure names the socket tried and why it failed.

use crate::CtlError;
use crate::cli::Global;
use gpu_agent_proto::v1::agent_client::AgentClient;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

pub type Client = AgentClient<Channel>;

pub async fn connect(global: &Global) -> Result<Client, CtlError> {
    if global.host.is_some() {
        return Err(CtlError::usage(
            "--host (a remote agent over mutual TLS) is not available in this version; use --socket on the agent's host",
        ));
    }
    let path: PathBuf = global.socket.clone();
    // Fail early with the OS's reason (missing file, permission) rather than a transport error.
    if let Err(e) = tokio::net::UnixStream::connect(&path).await {
        return Err(CtlError::failed(format!(
            "cannot reach gpu-agent at {}: {e} (is the agent running? set --socket or GPUCTL_SOCKET)",
            path.display()
        )));
    }
    let connector_path = path.clone();
    // The URI is required by the API but unused: the connector dials the socket.
    let channel = Endpoint::from_static("http://agent.local")
        .connect_with_connector(service_fn(move |_: Uri| {
            let p = connector_path.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| CtlError::failed(format!("cannot reach gpu-agent at {}: {e}", path.display())))?;
    Ok(AgentClient::new(channel).max_decoding_message_size(64 << 20))
}
