//! gpuctl's command line, as the contract names it.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

pub const DEFAULT_SOCKET: &str = "/run/gpu-agent/agent.sock";

#[derive(Debug, Parser)]
#[command(name = "gpuctl", version, about = "Control a gpu-agent: GPUs, MIG layouts, plans and model workers")]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// Agent socket
    #[arg(long, global = true, env = "GPUCTL_SOCKET", default_value = DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
    /// Remote agent over mutual TLS (HOST:PORT)
    #[arg(long, global = true, value_name = "HOST:PORT")]
    pub host: Option<String>,
    #[arg(long, global = true, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    #[arg(long, global = true, value_name = "FILE")]
    pub cert: Option<PathBuf>,
    #[arg(long, global = true, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Output format
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Host summary: GPUs, sharing, MIG instances, workers, last apply
    Status,
    /// GPUs and their MIG instances
    Gpus,
    /// MIG profiles of one GPU with their valid placements
    Profiles {
        /// GPU index or UUID
        gpu: String,
    },
    /// Make the host match a plan
    Apply(PlanArgs),
    /// The steps `apply` would take (exit 0: none, 1: some, above 1: error)
    Diff(DiffArgs),
    /// Each worker: model, replica, pid, state, restarts, device, tier, GPU memory used
    Workers,
    /// What the agent did and saw
    Events,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Plan file (TOML); - reads standard input
    #[arg(short = 'f', long = "file", value_name = "PLAN")]
    pub file: PathBuf,
    /// Print the ordered steps and change nothing
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Plan file (TOML); - reads standard input
    #[arg(short = 'f', long = "file", value_name = "PLAN")]
    pub file: PathBuf,
}
