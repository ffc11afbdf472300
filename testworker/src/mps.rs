//! The worker as an MPS client, with real CUDA's behaviour around it: no daemon answering means
//! running without MPS, silently (`mps: none`; the probe saw exactly that after the daemon was
//! killed); a lost or faulted connection means the next CUDA call fails, so the worker exits 1.

use fake_mps::client::{self, Client, Error};
use fake_mps::env::PIPE_DIR_ENV;
use std::sync::Arc;

/// Connects when `CUDA_MPS_PIPE_DIRECTORY` is set; blocks while the client is pending.
pub fn connect() -> Option<Arc<Client>> {
    let dir = std::env::var_os(PIPE_DIR_ENV).filter(|d| !d.is_empty())?;
    match client::connect(dir.as_ref()) {
        Ok(client) => {
            let limit = client.pinned_limit_mib.map_or("none".to_string(), |l| l.to_string());
            println!(
                "mps: server {} pct {} limit {limit}",
                client.server_pid,
                fake_mps::limits::format_pct(client.active_thread_pct)
            );
            let client = Arc::new(client);
            let watched = Arc::clone(&client);
            std::thread::spawn(move || {
                let lost = watched.wait_fault();
                eprintln!("testworker: MPS connection ended: {lost:?}");
                println!("CUDA error: MPS server connection lost");
                crate::exit::exit(1);
            });
            Some(client)
        }
        Err(Error::NoDaemon { .. }) => {
            println!("mps: none");
            None
        }
        Err(e) => {
            println!("CUDA error: MPS client failed: {e}");
            crate::exit::exit(1)
        }
    }
}
