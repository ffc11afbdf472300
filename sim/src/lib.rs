//! The simulated GPU host behind `gpu-agent --simulate`: the product table ([`products`]), the
//! spec parser ([`spec`]) and the durable state ([`state`]) that the fake `libnvidia-ml.so`
//! (crate `fake-nvml`) answers NVML calls from.

pub mod products;
pub mod spec;
pub mod state;

pub use products::{Product, ProfileRow, Source};
pub use spec::SimSpec;
pub use state::{Fault, STATE_ENV, SimGpu, SimGpuInstance, SimHost, SimProcess, device_dir};
