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
//!
//! Calls that change the host (MIG mode, GPU and compute instances) read, change and write the
//! state under one lock (`session::write`). Each first counts itself against the state's
//! `faults` (`SimHost::fault`, by exported function name and GPU index): a fault that fires is
//! the call's answer, and nothing but its counter changes.
//!
//! Modules, by what they answer:
//! - `system`: init and shutdown, versions, device count, device handles by index, UUID, bus id;
//! - `device`: a device's identity, memory, architecture, MIG mode (read), compute and
//!   persistence mode;
//! - `mig_mode`: `nvmlDeviceSetMigMode`, with `holders` finding processes that hold a GPU;
//! - `profiles`: GPU instance profiles, placements, remaining capacity;
//! - `instances`: GPU instances: list, get, create (driver's or given placement), destroy;
//! - `compute`: compute instances (the full-width one per GPU instance): profiles, create,
//!   list, get, info, destroy;
//! - `mig`: MIG device handles and their ids;
//! - `process`: running processes per device.
//!
//! Helpers: `call`, `ffi`, `handles`, `pci`, `ret`, `session`, `target`.

mod call;
mod compute;
mod device;
mod ffi;
mod handles;
mod holders;
mod instances;
mod mig;
mod mig_mode;
mod pci;
mod process;
mod profiles;
mod ret;
mod session;
mod system;
mod target;
