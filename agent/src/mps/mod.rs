//! The MPS tier: one supervised `nvidia-cuda-mps-control` daemon per GPU (or MIG instance) with
//! `sharing = "mps"`. [`control`] is the seam (the control binary's command interface);
//! [`daemons`] starts, watches and restarts daemons and the workers that are their clients.

pub mod control;
pub mod daemons;

pub use daemons::{DaemonSpec, MpsManager, ObservedDaemon};
