//! The Unix socket: claims it (replacing a stale file, refusing when a live agent answers on it),
//! sets its mode to 0660, and serves gRPC on it until the shutdown future resolves.

use crate::rpc::Rpc;
use gpu_agent_proto::v1::agent_server::AgentServer;
use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("socket {path}: another gpu-agent is already serving on it; stop that one first or pass another --socket")]
    InUse { path: PathBuf },
    #[error("socket {path}: exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("socket {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("socket group {group:?}: {message}")]
    Group { group: String, message: String },
    #[error("serving on {path}: {source}")]
    Serve { path: PathBuf, source: tonic::transport::Error },
}

/// Binds the socket, replacing a stale one left by an agent that died.
pub fn bind(path: &Path, group: Option<&str>) -> Result<UnixListener, ServerError> {
    let io = |source| ServerError::Io { path: path.to_path_buf(), source };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => return Err(ServerError::NotASocket { path: path.to_path_buf() }),
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(ServerError::InUse { path: path.to_path_buf() }),
            Err(_) => {
                tracing::info!(socket = %path.display(), "replacing stale socket");
                std::fs::remove_file(path).map_err(io)?;
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(io)?;
    if let Some(name) = group {
        let gid = nix::unistd::Group::from_name(name)
            .map_err(|e| ServerError::Group { group: name.into(), message: e.to_string() })?
            .ok_or_else(|| ServerError::Group { group: name.into(), message: "no such group".into() })?
            .gid;
        nix::unistd::chown(path, None, Some(gid)).map_err(|e| io(e.into()))?;
    }
    Ok(listener)
}

/// How long open calls may run on once the agent is asked to stop.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn serve(
    listener: UnixListener,
    path: &Path,
    rpc: Rpc,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    // Shutdown waits for open calls to end, but a `gpuctl logs --follow` never does: once asked
    // to stop, calls get a short grace and are then cut off. An apply runs in its own task and
    // is finished by `app::run` (under the apply lock) before the agent exits.
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = stopping_tx.send(());
    };
    let serve = tonic::transport::Server::builder()
        .add_service(AgentServer::new(rpc))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown);
    let cut_off = async {
        if stopping_rx.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let result = tokio::select! {
        r = serve => r,
        () = cut_off => {
            tracing::info!(grace_ms = SHUTDOWN_GRACE.as_millis() as u64, "calls still open at shutdown were cut off");
            Ok(())
        }
    };
    // The socket file goes with the server, so the next start finds no stale file.
    let _ = std::fs::remove_file(path);
    result.map_err(|source| ServerError::Serve { path: path.to_path_buf(), source })
}
