//! The host plan: its types, the schema walk that turns TOML into a [`Plan`] ([`parse`]), and the
//! checks against the live inventory and the agent's settings ([`check`]).
//!
//! Invariant: parsing and checking never stop at the first problem. Every problem carries the key
//! path (`models[2].memory`) and the line, and a plan with any problem changes nothing.

pub mod check;
pub mod edit;
pub mod parse;
pub mod tree;
pub mod units;

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// One thing wrong with a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub path: String,
    /// 1-based; 0 when the problem concerns no one place.
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.line, self.path.is_empty()) {
            (0, true) => write!(f, "{}", self.message),
            (0, false) => write!(f, "{}: {}", self.path, self.message),
            (line, true) => write!(f, "line {line}: {}", self.message),
            (line, false) => write!(f, "{} (line {line}): {}", self.path, self.message),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub gpus: Vec<GpuEntry>,
    pub models: Vec<Model>,
    /// A `[[gpus]]` entry could not be read at all: checks of where models can run would only
    /// repeat that problem, so they are skipped.
    pub gpus_incomplete: bool,
}

/// Which GPUs a `[[gpus]]` entry selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    All,
    Indices(Vec<u32>),
    Uuid(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    Exclusive,
    TimeSlicing,
    Mps,
    Mig,
    Auto,
}

impl Sharing {
    pub const NAMES: &'static [&'static str] = &["exclusive", "time-slicing", "mps", "mig", "auto"];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "exclusive" => Sharing::Exclusive,
            "time-slicing" => Sharing::TimeSlicing,
            "mps" => Sharing::Mps,
            "mig" => Sharing::Mig,
            "auto" => Sharing::Auto,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// Isolation tier of a model, weakest to strongest (`Auto` lets the planner choose).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    TimeSlicing,
    Mps,
    Mig,
    Exclusive,
    Auto,
}

impl Isolation {
    pub const NAMES: &'static [&'static str] = &["time-slicing", "mps", "mig", "exclusive", "auto"];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "time-slicing" => Isolation::TimeSlicing,
            "mps" => Isolation::Mps,
            "mig" => Isolation::Mig,
            "exclusive" => Isolation::Exclusive,
            "auto" => Isolation::Auto,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeslice {
    Default,
    Short,
    Medium,
    Long,
}

/// One `[[gpus]]` entry. `index` is its position in the plan, for messages.
#[derive(Debug, Clone)]
pub struct GpuEntry {
    pub index: usize,
    pub select: Selector,
    pub sharing: Sharing,
    pub mig: Vec<MigInstance>,
    pub mps: Option<MpsDefaults>,
    pub timeslice: Option<Timeslice>,
    /// Its `mig` list had a problem (reported), so its layout is not checked further.
    pub mig_broken: bool,
    /// Some key of the entry had a problem (reported).
    pub broken: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInstance {
    pub profile: String,
    pub start: Option<u32>,
    /// A MIG instance is time-sliced unless it runs its own MPS daemon.
    pub mps: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MpsDefaults {
    pub active_thread_percentage: Option<u32>,
    pub pinned_memory_limit: Option<u64>,
    /// Let the `compute` shares of the models on this device sum past 100%.
    pub allow_compute_oversubscription: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Restart {
    Always,
    OnFailure,
    Never,
}

impl Restart {
    pub const NAMES: &'static [&'static str] = &["always", "on-failure", "never"];
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum HealthProbe {
    Http(String),
    Tcp(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    pub probe: HealthProbe,
    pub interval: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    /// How long a starting worker may take to become healthy before it is restarted.
    pub start_timeout: Duration,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Limits {
    pub memory: Option<u64>,
    pub cpu: Option<f64>,
    pub pids: Option<u64>,
}

/// A GPU named by a model's `gpu` pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum GpuRef {
    Index(u32),
    Uuid(String),
}

/// One `[[models]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    pub index: usize,
    pub name: String,
    pub command: Vec<String>,
    pub isolation: Isolation,
    pub memory_mib: u64,
    pub compute: Option<u32>,
    pub replicas: u32,
    pub gpu: Option<GpuRef>,
    pub user: Option<String>,
    pub working_dir: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub restart: Restart,
    pub health: Option<Health>,
    pub limits: Limits,
    pub stop_timeout: Duration,
    /// Keys that had a problem (reported); they hold placeholders, and checks that need them are
    /// skipped. A plan with any problem never reaches reconciliation.
    #[serde(skip)]
    pub broken: std::collections::BTreeSet<&'static str>,
}

#[cfg(test)]
mod tests;
