//! Moving values across the C boundary: output pointers, C strings in and out, and the NVML
//! "buffer plus count" protocol for lists.

use crate::ret::{INSUFFICIENT_SIZE, INVALID_ARGUMENT, Res};
use std::ffi::{CStr, c_char, c_uint};
use std::ptr::{self, NonNull};

/// A caller's non-null output (or in/out) pointer.
pub struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// `NVML_ERROR_INVALID_ARGUMENT` for a null pointer, as NVML answers.
    ///
    /// # Safety
    /// `ptr` is null or valid for writes of one `T` while the `Out` lives (and for reads, if
    /// [`Out::get`] is used: the caller initialised it).
    pub unsafe fn new(ptr: *mut T) -> Res<Self> {
        NonNull::new(ptr).map(Out).ok_or(INVALID_ARGUMENT)
    }

    pub fn set(&mut self, value: T) {
        // SAFETY: `new`'s contract: the pointer is valid for writes of one `T`.
        unsafe { self.0.as_ptr().write(value) }
    }

    /// The raw pointer, for reading one field of a caller-initialised struct.
    pub fn as_ptr(&self) -> *mut T {
        self.0.as_ptr()
    }
}

impl<T: Copy> Out<T> {
    /// Reads an in/out value the caller set (a buffer size, a struct version).
    pub fn get(&self) -> T {
        // SAFETY: `new`'s contract: for in/out parameters the caller initialised the value.
        unsafe { self.0.as_ptr().read() }
    }
}

/// Copies `s` as a NUL-terminated C string into a buffer of `capacity` bytes through `put`.
/// A string that does not fit is truncated, still NUL-terminated (when there is room for the
/// NUL at all), and answered with `NVML_ERROR_INSUFFICIENT_SIZE`.
fn copy_c_str(s: &str, capacity: usize, mut put: impl FnMut(usize, c_char)) -> Res {
    if capacity == 0 {
        return Err(INSUFFICIENT_SIZE);
    }
    let bytes = s.as_bytes();
    let fits = bytes.len() < capacity;
    let n = if fits { bytes.len() } else { capacity - 1 };
    for (i, &byte) in bytes[..n].iter().enumerate() {
        put(i, byte as c_char);
    }
    put(n, 0);
    if fits { Ok(()) } else { Err(INSUFFICIENT_SIZE) }
}

/// Writes `s` into a caller's `buf` of `length` bytes (`nvmlDeviceGetName` and friends).
///
/// # Safety
/// `buf` is null or valid for writes of `length` bytes.
pub unsafe fn write_str(buf: *mut c_char, length: c_uint, s: &str) -> Res {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    copy_c_str(s, length as usize, |i, c| {
        // SAFETY: `copy_c_str` only writes below `length`, and the caller made `buf` valid
        // for `length` bytes.
        unsafe { buf.add(i).write(c) }
    })
}

/// Writes `s` into a fixed `char[N]` field of a struct we fill.
pub fn fill_array<const N: usize>(field: &mut [c_char; N], s: &str) -> Res {
    copy_c_str(s, N, |i, c| field[i] = c)
}

/// Reads a caller's NUL-terminated input string; null or non-UTF-8 is `INVALID_ARGUMENT`.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that outlives `'a`.
pub unsafe fn read_str<'a>(p: *const c_char) -> Res<&'a str> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and the caller guarantees a NUL-terminated string living for `'a`.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| INVALID_ARGUMENT)
}

/// What a list call answers to a NULL buffer (a count query).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountQuery {
    /// `SUCCESS` with the count (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`, as probed).
    Success,
    /// `INSUFFICIENT_SIZE` with the count when there is anything to return, `SUCCESS` with 0
    /// otherwise (the process lists; nvml-wrapper relies on it).
    InsufficientSize,
}

/// The NVML list protocol: `*count` is the buffer's capacity on entry and the number of items
/// on return; a NULL buffer is a count query answered as `query` says; a buffer too small is
/// `INSUFFICIENT_SIZE` with the needed count and nothing written.
///
/// # Safety
/// `count` is null or valid for reads and writes of a `c_uint`; `buf` is null or valid for
/// writes of `*count` items.
pub unsafe fn write_list<T: Copy>(buf: *mut T, count: *mut c_uint, items: &[T], query: CountQuery) -> Res {
    // SAFETY: the caller's contract on `count`.
    let mut count = unsafe { Out::new(count) }?;
    let needed = c_uint::try_from(items.len()).map_err(|_| INSUFFICIENT_SIZE)?;
    if buf.is_null() {
        count.set(needed);
        return match query {
            _ if needed == 0 => Ok(()),
            CountQuery::Success => Ok(()),
            CountQuery::InsufficientSize => Err(INSUFFICIENT_SIZE),
        };
    }
    let capacity = count.get();
    count.set(needed);
    if capacity < needed {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` is valid for `capacity >= items.len()` items (the caller's contract) and
    // cannot overlap our own `items`.
    unsafe { write_slice(buf, items) };
    Ok(())
}

/// Copies `items` to the start of `buf`.
///
/// # Safety
/// `buf` is non-null and valid for writes of `items.len()` items, not overlapping `items`.
pub unsafe fn write_slice<T: Copy>(buf: *mut T, items: &[T]) {
    // SAFETY: the caller's contract.
    unsafe { ptr::copy_nonoverlapping(items.as_ptr(), buf, items.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(buf: &[c_char]) -> String {
        let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn c_strings_fit_truncate_or_fail() {
        // (input, buffer size, expected result, expected text, NUL position)
        let cases: [(&str, usize, Res, &str, Option<usize>); 7] = [
            ("NVIDIA H200", 64, Ok(()), "NVIDIA H200", Some(11)),
            ("NVIDIA H200", 12, Ok(()), "NVIDIA H200", Some(11)),
            ("NVIDIA H200", 11, Err(INSUFFICIENT_SIZE), "NVIDIA H20", Some(10)),
            ("NVIDIA H200", 1, Err(INSUFFICIENT_SIZE), "", Some(0)),
            ("NVIDIA H200", 0, Err(INSUFFICIENT_SIZE), "", None),
            ("", 1, Ok(()), "", Some(0)),
            ("", 0, Err(INSUFFICIENT_SIZE), "", None),
        ];
        for (input, size, want, want_text, nul) in cases {
            // Pre-fill with 'x' so that a missing NUL or an overrun shows.
            let mut buf = vec![b'x' as c_char; size + 4];
            // SAFETY: `buf` holds `size + 4 >= size` bytes.
            let got = unsafe { write_str(buf.as_mut_ptr(), size as c_uint, input) };
            assert_eq!(got, want, "{input:?} into {size}");
            if let Some(nul) = nul {
                assert_eq!(buf[nul], 0, "{input:?} into {size}: NUL at {nul}");
                assert_eq!(text(&buf), want_text, "{input:?} into {size}");
            }
            let untouched = nul.map_or(0, |n| n + 1);
            assert!(
                buf[untouched..].iter().all(|&c| c == b'x' as c_char),
                "{input:?} into {size}: wrote past the string"
            );
        }
    }

    #[test]
    fn fixed_array_fields() {
        let mut legacy = [0 as c_char; 16];
        assert_eq!(fill_array(&mut legacy, "0000:18:00.0"), Ok(()));
        assert_eq!(text(&legacy), "0000:18:00.0");
        let mut small = [b'x' as c_char; 4];
        assert_eq!(fill_array(&mut small, "abcd"), Err(INSUFFICIENT_SIZE));
        assert_eq!(text(&small), "abc");
    }

    #[test]
    fn null_pointers_are_invalid_arguments() {
        // SAFETY: null is allowed by every contract below.
        unsafe {
            assert_eq!(write_str(ptr::null_mut(), 10, "x"), Err(INVALID_ARGUMENT));
            assert_eq!(read_str(ptr::null()).err(), Some(INVALID_ARGUMENT));
            assert!(Out::<u32>::new(ptr::null_mut()).is_err());
            let items = [1u32, 2];
            let r = write_list(ptr::null_mut(), ptr::null_mut(), &items, CountQuery::Success);
            assert_eq!(r, Err(INVALID_ARGUMENT));
        }
    }

    #[test]
    fn list_protocol() {
        let three = [7u32, 8, 9];
        let none: [u32; 0] = [];
        // (items, NULL buffer?, capacity, query, expected result, expected count, written)
        type Case<'a> = (&'a [u32], bool, c_uint, CountQuery, Res, c_uint, &'a [u32]);
        let cases: [Case; 7] = [
            (&three, true, 0, CountQuery::Success, Ok(()), 3, &[]),
            (&three, true, 0, CountQuery::InsufficientSize, Err(INSUFFICIENT_SIZE), 3, &[]),
            (&none, true, 0, CountQuery::InsufficientSize, Ok(()), 0, &[]),
            (&three, false, 2, CountQuery::Success, Err(INSUFFICIENT_SIZE), 3, &[]),
            (&three, false, 3, CountQuery::Success, Ok(()), 3, &[7, 8, 9]),
            (&three, false, 8, CountQuery::InsufficientSize, Ok(()), 3, &[7, 8, 9]),
            (&none, false, 8, CountQuery::InsufficientSize, Ok(()), 0, &[]),
        ];
        for (i, (items, null, capacity, query, want, want_count, written)) in cases.into_iter().enumerate() {
            let mut buf = [0u32; 8];
            let mut count = capacity;
            let p = if null { ptr::null_mut() } else { buf.as_mut_ptr() };
            // SAFETY: `buf` holds 8 >= `capacity` items; `count` is a live local.
            let got = unsafe { write_list(p, &mut count, items, query) };
            assert_eq!(got, want, "case {i}");
            assert_eq!(count, want_count, "case {i}");
            assert_eq!(&buf[..written.len()], written, "case {i}");
            assert!(buf[written.len()..].iter().all(|&v| v == 0), "case {i}: wrote too much");
        }
    }
}
