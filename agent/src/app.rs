//! Start-up and shutdown of the agent: state directory lock, driver, worker adoption, socket,
//! the plan at start, serving until a signal.

use crate::driver::nvml::NvmlDriver;
use crate::events::{Events, Level};
use crate::rpc::Rpc;
use crate::server;
use crate::service::{Agent, AgentError};
use crate::settings::Settings;
use crate::store::StateFile;
use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Holds the state directory for one agent at a time.
pub struct DirLock(#[allow(dead_code)] Flock<File>);

pub fn lock_state_dir(dir: &Path) -> anyhow::Result<DirLock> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("state directory {}: {e}", dir.display()))?;
    let path = dir.join("agent.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(DirLock(lock)),
        Err(_) => anyhow::bail!("state directory {} is in use by another gpu-agent", dir.display()),
    }
}

/// Runs the agent until `shutdown` resolves. `nvml_library` is the library to load (None: the
/// system's).
pub async fn run(
    settings: Settings,
    nvml_library: Option<PathBuf>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let _lock = lock_state_dir(&settings.state_dir)?;
    let driver = Arc::new(NvmlDriver::load(nvml_library.as_deref())?);
    let state = Arc::new(StateFile::open(&settings.state_dir)?);
    let events = Arc::new(Events::default());
    let agent = Agent::new(settings.clone(), driver, state, Arc::clone(&events));
    agent.start_restarter();
    agent.start_budget_watch();
    agent.start_log_rotation();
    agent.adopt_workers().await?;
    let listener = server::bind(&settings.socket, settings.socket_group.as_deref())?;
    let inventory = agent.inventory().await?;
    events.emit(
        Level::Info,
        "agent_started",
        None,
        None,
        format!(
            "gpu-agent {} on {} with {} GPU(s), driver {}{}{}",
            env!("CARGO_PKG_VERSION"),
            settings.socket.display(),
            inventory.gpus.len(),
            inventory.driver_version,
            settings.simulate.as_ref().map(|s| format!(", simulated {s}")).unwrap_or_default(),
            if settings.read_only_gpus { ", read-only GPUs" } else { "" }
        ),
    );
    initial_apply(&agent, &settings).await;
    agent.adopt_mps();
    server::serve(listener, &settings.socket, Rpc { agent: Arc::clone(&agent) }, shutdown).await?;
    // Open calls were cut off after a grace; the work they started is finished, not abandoned.
    let _quiet = agent.finish_in_flight().await;
    events.emit(
        Level::Info,
        "agent_stopped",
        None,
        None,
        "gpu-agent stopped; workers keep running and are adopted at the next start",
    );
    Ok(())
}

/// At start: the --plan file if given, else the plan applied last (GPU instances and workers may
/// be gone after a reboot). A plan that fails is reported and the agent serves on.
async fn initial_apply(agent: &Arc<Agent>, settings: &Settings) {
    let (text, source) = match &settings.plan {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => (text, path.display().to_string()),
            Err(e) => {
                let err = AgentError::Internal(format!("--plan {}: {e}", path.display()));
                agent.record_rejected(&path.display().to_string(), &err);
                return;
            }
        },
        None => match agent.stored_plan() {
            Some(p) => (p.text, p.source),
            None => return,
        },
    };
    let input = crate::service::PlanInput::Startup { text, source: source.clone() };
    if let Err(e) = agent.do_apply(input, true, |_| {}).await {
        agent.record_rejected(&source, &e);
    }
}
