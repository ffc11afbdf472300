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
    /// MIG layouts: show, set or clear one GPU's
    #[command(subcommand)]
    Partition(PartitionCmd),
    /// Make the host match a plan
    Apply(PlanArgs),
    /// The steps `apply` would take (exit 0: none, 1: some, above 1: error)
    Diff(DiffArgs),
    /// Each worker: model, replica, pid, state, restarts, device, tier, GPU memory used
    Workers,
    /// What the agent did and saw
    Events,
    /// A model's worker output (every replica's, each line marked, unless --replica)
    Logs {
        model: String,
        #[arg(long)]
        replica: Option<u32>,
        /// Keep printing new output as it comes
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only the last N lines of each replica's log
        #[arg(long, default_value_t = 0)]
        tail: u32,
    },
    /// Stop the workers on one GPU and keep it out of placement (others keep running)
    Drain { gpu: String },
    /// Put a drained GPU back into placement
    Undrain { gpu: String },
    /// Restart one model's workers, one replica at a time
    Restart { model: String },
    /// Stop one model's workers now (they stay stopped until the next apply)
    Stop { model: String },
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Plan file (TOML); - reads standard input
    #[arg(short = 'f', long = "file", value_name = "PLAN")]
    pub file: PathBuf,
    /// Print the ordered steps and change nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Allow steps that kill running workers (destroying their MIG instance, switching MIG mode
    /// under them): stop those workers first and start them again where the plan puts them
    #[arg(long)]
    pub drain: bool,
}

#[derive(Debug, Subcommand)]
pub enum PartitionCmd {
    /// MIG layout of every GPU with MIG on (or of one GPU), with the workers in each instance
    Show {
        /// GPU index or UUID
        gpu: Option<String>,
    },
    /// Make this GPU's MIG layout exactly these instances (enables MIG when needed); existing
    /// instances that match stay untouched
    Set {
        /// GPU index or UUID
        gpu: String,
        /// PROFILE or PROFILE@START, e.g. 3g.71gb 2g.35gb 1g.18gb@6
        #[arg(required = true, value_name = "PROFILE[@START]")]
        profiles: Vec<String>,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Destroy this GPU's instances and turn MIG off (the GPU is then time-sliced)
    Clear {
        /// GPU index or UUID
        gpu: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
}

#[derive(Debug, Args)]
pub struct ChangeArgs {
    /// Print the ordered steps and change nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Stop the workers in instances that must go first, and start them again afterwards
    #[arg(long)]
    pub drain: bool,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Plan file (TOML); - reads standard input
    #[arg(short = 'f', long = "file", value_name = "PLAN")]
    pub file: PathBuf,
}
