use agent::settings::{Flags, Settings};
use agent::{app, logging, simulate};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Multi-call: under --simulate the agent links `nvidia-cuda-mps-control` to itself, so the fake
    // MPS control daemon comes from the same `cargo run`.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&argv0).file_name().is_some_and(|n| n == simulate::MPS_CONTROL_NAME) {
        return ExitCode::from(fake_mps::control_main(std::env::args_os().collect()) as u8);
    }
    let mut settings = match Settings::load(Flags::parse()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpu-agent: {e}");
            return ExitCode::from(2);
        }
    };
    logging::init(settings.log_format);
    // The simulated driver is prepared before the runtime starts any thread: the fake NVML
    // library finds its state through an environment variable.
    let library = match settings.simulate.clone() {
        None => settings.nvml_library.clone(),
        Some(spec) => match simulate_host(&spec, &mut settings) {
            Ok(lib) => Some(lib),
            Err(e) => {
                eprintln!("gpu-agent: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    match runtime.block_on(app::run(settings, library, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("gpu-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prepares the simulated host: its state, the fake NVML library it is read through, and the fake
/// MPS control. Runs before any other thread exists: the fake library finds its state through an
/// environment variable.
fn simulate_host(spec: &str, settings: &mut Settings) -> Result<std::path::PathBuf, simulate::SimulateError> {
    let state = simulate::prepare(spec, &settings.state_dir)?;
    // SAFETY: no other thread exists yet; the runtime is built after this returns.
    unsafe { simulate::export_state_path(&state) };
    settings.device_dir = gpu_sim::device_dir(&state);
    // Simulated hosts share the machine's cgroup fs: each keeps its workers' cgroups apart.
    if let Some((_, parent)) = &mut settings.cgroups {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        settings.state_dir.hash(&mut h);
        *parent = format!("{parent}-sim-{:08x}", h.finish() as u32);
    }
    simulate::prepare_mps(settings, &state)?;
    settings.nvml_library.clone().map(Ok).unwrap_or_else(simulate::find_library)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}
