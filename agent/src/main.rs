use agent::settings::{Flags, Settings};
use agent::{app, logging, simulate};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
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
    let library = match &settings.simulate {
        None => settings.nvml_library.clone(),
        Some(spec) => match simulate::prepare(spec, &settings.state_dir).and_then(|state| {
            // SAFETY: no other thread exists yet; the runtime is built below.
            unsafe { simulate::export_state_path(&state) };
            settings.device_dir = gpu_sim::device_dir(&state);
            settings.nvml_library.clone().map(Ok).unwrap_or_else(simulate::find_library)
        }) {
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

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}
