//! gpu-agent: the per-host root agent. See ARCHITECTURE.md for the code map and invariants.

pub mod app;
pub mod driver;
pub mod events;
pub mod executor;
pub mod holders;
pub mod inventory;
pub mod logging;
pub mod logs;
pub mod mig;
pub mod mps;
pub mod plan;
pub mod reconcile;
pub mod rpc;
pub mod server;
pub mod service;
pub mod settings;
pub mod simulate;
pub mod store;
pub mod workers;
