//! Helpers for pointers received over the C ABI.
//!
//! Every function here is handed pointers that a C caller passed to an exported entry point.
//! The driver API contract is that such pointers are either NULL or valid for the access the
//! entry point documents; NULL is checked here, validity is the caller's promise (exactly as
//! with the real driver, which would crash just the same on a wild pointer).

use std::ffi::{CStr, c_char};

/// Writes `v` through `p`; false if `p` is NULL.
pub fn put<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: non-NULL pointer from a C caller, valid per the API contract (module docs).
    unsafe { p.write_unaligned(v) };
    true
}

/// Reads through `p`; None if `p` is NULL.
pub fn get<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL pointer from a C caller, valid per the API contract (module docs).
    Some(unsafe { p.read_unaligned() })
}

/// Borrows a NUL-terminated C string; None if NULL or not UTF-8.
pub fn str_arg<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL NUL-terminated string from a C caller (module docs).
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// Copies `s` plus a NUL into a caller buffer of `len` bytes; false if it does not fit.
pub fn put_str(buf: *mut c_char, len: usize, s: &str) -> bool {
    if buf.is_null() || len < s.len() + 1 {
        return false;
    }
    // SAFETY: `buf` is non-NULL and the caller promises `len` writable bytes (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    true
}
