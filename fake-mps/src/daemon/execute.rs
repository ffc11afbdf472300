//! Carrying out a control command against the daemon's state, and the exact text the tool prints
//! for it (the probe's replies where it shows them; "unverified" marks the rest).

use super::command::Command;
use super::state::{Shared, State};
use crate::limits::format_pct;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// Unverified: the probe never asked about an unknown server.
const NO_SERVER: &str = "Server PID not found\n";

/// Runs `command` (anything but `quit`, which the daemon's main thread handles) and returns the
/// reply, empty or ending in a newline.
pub fn execute(shared: &Arc<Shared>, st: &mut State, command: Command) -> String {
    match command {
        Command::GetServerList => st.server.iter().map(|s| format!("{}\n", s.pid)).collect(),
        Command::GetServerStatus(pid) => {
            st.server_mut(pid).map_or(NO_SERVER.to_string(), |s| format!("{}\n", s.status.as_str()))
        }
        Command::StartServer { uid } => {
            // Unverified when another user's server is busy: the request waits like a client.
            if st.server.as_ref().is_none_or(|s| s.uid != uid) {
                st.wanted_uid = Some(uid);
                st.schedule(shared);
            }
            String::new()
        }
        Command::GetClientList(pid) => st
            .server_mut(pid)
            .map_or(NO_SERVER.to_string(), |s| s.clients.iter().map(|c| format!("{}\n", c.hello.pid)).collect()),
        Command::Ps => {
            let mut out = String::from("PID ID SERVER DEVICE NAMESPACE COMMAND\n");
            if let Some(s) = &st.server {
                for c in &s.clients {
                    let pid = c.hello.pid;
                    out += &format!("{pid} 1 {} {} {} {}\n", s.pid, shared.device_label, namespace(pid), exe(pid));
                }
            }
            out
        }
        Command::TerminateClient { server, client } => {
            // Unverified: what the tool prints for a client it does not know.
            st.terminate(server, client);
            String::new()
        }
        Command::Quit => String::new(),
        Command::SetDefaultActiveThreadPct(pct) => {
            st.defaults.active_thread_pct = pct;
            String::new()
        }
        Command::GetDefaultActiveThreadPct => format!("{}\n", format_pct(st.defaults.active_thread_pct)),
        Command::SetActiveThreadPct { server, pct } => match st.server_mut(server) {
            Some(s) => {
                s.settings.active_thread_pct = pct;
                String::new()
            }
            None => NO_SERVER.to_string(),
        },
        Command::SetDefaultPinnedLimit { device, limit } => {
            st.defaults.pinned.insert(device, limit);
            String::new()
        }
        Command::GetDefaultPinnedLimit { device } => {
            st.defaults.pinned.get(&device).map_or(String::new(), |l| format!("{}\n", l.spec))
        }
        Command::SetPinnedLimit { server, device, limit } => match st.server_mut(server) {
            Some(s) => {
                s.settings.pinned.insert(device, limit);
                String::new()
            }
            None => NO_SERVER.to_string(),
        },
        Command::SetDefaultClientPriority(p) => {
            st.defaults.client_priority = p;
            String::new()
        }
        Command::FakeFault(pid) => {
            if st.fault(shared, pid) {
                String::new()
            } else {
                NO_SERVER.to_string()
            }
        }
        Command::Unknown(name) => format!("Unknown command \"{name}\"\n"),
        Command::Invalid(text) => format!("{text}\n"),
    }
}

/// The pid namespace inode of a process (the NAMESPACE column), `-` when unreadable.
fn namespace(pid: u32) -> String {
    std::fs::metadata(format!("/proc/{pid}/ns/pid")).map_or("-".to_string(), |m| m.ino().to_string())
}

/// The executable of a process (the COMMAND column), `-` when unreadable.
fn exe(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe")).map_or("-".to_string(), |p| p.display().to_string())
}

/// The DEVICE column: the UUID cut to its first three groups, as the probe shows
/// (`GPU-301ffa02-6cac-68c5`). An index is looked up in the simulated state when there is one.
pub fn device_label(config: &crate::env::Config) -> String {
    let Some(device) = config.device.as_deref() else {
        return "-".to_string();
    };
    let uuid = if device.starts_with("GPU-") || device.starts_with("MIG-") {
        Some(device.to_string())
    } else {
        config.sim_state.as_deref().and_then(|path| {
            let host = gpu_sim::SimHost::load(path).ok()?;
            let (gpu, _) = crate::sim::locate(&host, Some(device))?;
            Some(host.gpus[gpu].uuid.clone())
        })
    };
    match uuid {
        Some(uuid) => uuid.split('-').take(4).collect::<Vec<_>>().join("-"),
        None => device.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Config;

    #[test]
    fn device_labels() {
        let config = |device: Option<&str>| Config {
            pipe_dir: "/p".into(),
            log_dir: "/l".into(),
            device: device.map(String::from),
            sim_state: None,
        };
        assert_eq!(device_label(&config(Some("GPU-301ffa02-6cac-68c5-1234-567890abcdef"))), "GPU-301ffa02-6cac-68c5");
        assert_eq!(device_label(&config(Some("MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"))), "MIG-aaaaaaaa-bbbb-cccc");
        assert_eq!(device_label(&config(Some("0"))), "0");
        assert_eq!(device_label(&config(None)), "-");
    }
}
