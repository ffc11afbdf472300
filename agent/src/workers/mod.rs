//! Model workers: spawning ([`spawn`]), watching processes ([`proc`]) and the supervisor that
//! keeps each worker's record true ([`supervisor`]).

pub mod cgroup;
pub mod health;
pub mod proc;
pub mod restart;
pub mod spawn;
pub mod supervisor;

pub use supervisor::{Supervisor, WorkerError};
