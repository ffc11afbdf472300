//! End-to-end tests: the real gpu-agent binary against the simulated driver (the fake
//! libnvidia-ml.so through nvml-wrapper), driven by the real gpuctl code over a real Unix socket.

mod harness;

mod bad_plans;
mod inventory;
mod lifecycle;
mod mig;
mod mps;
mod supervision;
mod workers;
