//! A stand-in `libnvidia-ml.so`: exports the NVML C functions that gpu-agent calls through
//! `nvml-wrapper`, answering from the simulated host in the `gpu-sim` state file named by
//! `GPU_SIM_STATE`. The state is read afresh (under its lock) on every call, so the file is the
//! single source of truth: tests and the simulated driver change it, NVML callers see it.
//!
//! Answers follow our probe of a real H200 (`tests/fixtures/h200-probe.txt`) where it shows
//! them; everything the probe does not show is marked "unverified" where it is decided.
//!
//! Every exported `unsafe extern "C"` function has NVML's contract: each pointer argument is
//! null or valid for what its name says (writes of one value, or a buffer of the given length);
//! null output pointers are answered `NVML_ERROR_INVALID_ARGUMENT`. Handles are opaque integers
//! (see `handles`) and never dereferenced.

mod call;
mod device;
mod ffi;
mod handles;
mod instances;
mod mig;
mod pci;
mod process;
mod profiles;
mod ret;
mod session;
mod system;
mod target;
