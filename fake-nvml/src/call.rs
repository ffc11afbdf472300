//! The shape shared by the device queries: read the state, resolve the handle, answer through
//! the caller's pointer.

use crate::ffi::{self, Out};
use crate::ret::{Res, guard, nvmlReturn_t};
use crate::session;
use crate::target::{self, Target};
use nvml_wrapper_sys::bindings::nvmlDevice_t;
use std::ffi::{c_char, c_uint};

/// Answers `f(device)` through `out`.
///
/// # Safety
/// `out` is null or valid for writes of one `T`.
pub unsafe fn answer<T>(device: nvmlDevice_t, out: *mut T, f: impl FnOnce(Target<'_>) -> Res<T>) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let target = target::resolve(&host, device)?;
        // SAFETY: the caller's contract on `out`.
        let mut out = unsafe { Out::new(out) }?;
        out.set(f(target)?);
        Ok(())
    })
}

/// Answers the string `f(device)` into the caller's buffer.
///
/// # Safety
/// `buf` is null or valid for writes of `length` bytes.
pub unsafe fn answer_str(
    device: nvmlDevice_t,
    buf: *mut c_char,
    length: c_uint,
    f: impl FnOnce(Target<'_>) -> Res<String>,
) -> nvmlReturn_t {
    guard(|| {
        let host = session::host()?;
        let s = f(target::resolve(&host, device)?)?;
        // SAFETY: the caller's contract on `buf`.
        unsafe { ffi::write_str(buf, length, &s) }
    })
}
