//! Return codes, `nvmlErrorString`'s texts, and [`guard`], which turns the body of every exported
//! function into its `nvmlReturn_t`.

use nvml_wrapper_sys::bindings as b;
pub use nvml_wrapper_sys::bindings::nvmlReturn_t;
use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};

pub const SUCCESS: nvmlReturn_t = b::nvmlReturn_enum_NVML_SUCCESS;
pub const UNINITIALIZED: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub const INVALID_ARGUMENT: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NOT_SUPPORTED: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NOT_FOUND: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const INSUFFICIENT_SIZE: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const DRIVER_NOT_LOADED: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub const IN_USE: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_IN_USE;
pub const INSUFFICIENT_RESOURCES: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
pub const ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub const UNKNOWN: nvmlReturn_t = b::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// Result of an NVML call body: `Err` carries the failing return code.
pub type Res<T = ()> = Result<T, nvmlReturn_t>;

/// Runs the body of an exported function. A panic (a bug here, or a state file that breaks an
/// invariant) must not unwind into C, so it becomes `NVML_ERROR_UNKNOWN`; the panic message has
/// already gone to stderr through the default hook.
pub fn guard(body: impl FnOnce() -> Res) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// `nvmlErrorString`'s text for `code`. Codes 1..=18 and 999 are the texts nvidia-ml-py keeps
/// for the real library's answers ("Not Supported" is also in our H200 probe); the others and
/// "Success" are unverified.
pub fn error_string(code: nvmlReturn_t) -> &'static CStr {
    match code {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt Request Issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, becasue ECC is enabled",
        23 => c"Ran out of critical resources, other than memory",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"The requested functionality has been deprecated",
        27 => c"The system is not ready for the request",
        28 => c"No GPUs were found",
        29 => c"Resource not in correct state to perform requested operation",
        _ => c"Unknown Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_maps_ok_err_and_panic() {
        assert_eq!(guard(|| Ok(())), SUCCESS);
        assert_eq!(guard(|| Err(NOT_FOUND)), NOT_FOUND);
        assert_eq!(guard(|| panic!("deliberate panic in a test")), UNKNOWN);
    }

    #[test]
    fn error_strings() {
        let cases = [
            (NOT_SUPPORTED, "Not Supported"),
            (INVALID_ARGUMENT, "Invalid Argument"),
            (NOT_FOUND, "Not Found"),
            (DRIVER_NOT_LOADED, "Driver Not Loaded"),
            (UNKNOWN, "Unknown Error"),
            (12345, "Unknown Error"),
        ];
        for (code, text) in cases {
            assert_eq!(error_string(code).to_str().unwrap(), text, "code {code}");
        }
    }
}
