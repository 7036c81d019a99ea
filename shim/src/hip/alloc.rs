//! Linear HIP allocations and their frees: hipMalloc, hipExtMallocWithFlags,
//! hipMallocManaged (charged in full, as for CUDA), hipMallocPitch, hipMallocAsync,
//! hipMallocFromPoolAsync; hipFree, hipFreeAsync.
//!
//! Stream-ordered allocations are charged per request (rounded up to 512 bytes) and given
//! back at hipFreeAsync: unlike the CUDA side, bytes a HIP pool keeps cached after a free are
//! not counted (docs/amd.md).

#![allow(non_snake_case)]

use super::{guarded, reserve};
use crate::account::{self, Kind, PTRS, meta};
use crate::real::hip::{self as real, HIP_ERROR_OUT_OF_MEMORY, HipError};
use crate::real::{Handle, read, real_or_3};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::Ordering::SeqCst;

const ALIGN: u64 = 512;

/// A linear allocation of `bytes` on the current device, made by `call`.
fn linear(
    api: &str,
    ptr: *mut *mut c_void,
    bytes: u64,
    kind: Kind,
    call: impl Fn() -> HipError,
) -> HipError {
    guarded(&call, || {
        if ptr.is_null() || bytes == 0 {
            return call();
        }
        let charge = match reserve(api, None, bytes) {
            Ok(c) => c,
            Err(_) => return HIP_ERROR_OUT_OF_MEMORY,
        };
        let rc = call();
        if let Some(c) = charge {
            let p = super::read_ptr(ptr.cast_const()) as u64;
            if rc == 0 && p != 0 {
                if kind == Kind::Managed {
                    account::MANAGED[c.idx].fetch_add(c.bytes, SeqCst);
                }
                account::track(&PTRS, p, c.bytes, meta(kind, c.idx, c.ord), 0);
            } else {
                account::release(c.idx, c.bytes);
            }
        }
        rc
    })
}

/// # Safety
/// The HIP API contract of `hipMalloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> HipError {
    let f = real_or_3!(real::HIP_MALLOC);
    // SAFETY: forwarding the caller's arguments unchanged.
    linear("hipMalloc", ptr, size as u64, Kind::Device, || unsafe {
        f(ptr, size)
    })
}

/// # Safety
/// The HIP API contract of `hipExtMallocWithFlags`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipExtMallocWithFlags(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> HipError {
    let f = real_or_3!(real::HIP_EXT_MALLOC_WITH_FLAGS);
    // SAFETY: forwarding the caller's arguments unchanged.
    linear(
        "hipExtMallocWithFlags",
        ptr,
        size as u64,
        Kind::Device,
        || unsafe { f(ptr, size, flags) },
    )
}

/// # Safety
/// The HIP API contract of `hipMallocManaged`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMallocManaged(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> HipError {
    let f = real_or_3!(real::HIP_MALLOC_MANAGED);
    // SAFETY: forwarding the caller's arguments unchanged.
    linear(
        "hipMallocManaged",
        ptr,
        size as u64,
        Kind::Managed,
        || unsafe { f(ptr, size, flags) },
    )
}

/// Reserves width rounded up to 512 × height before the call; corrected to the runtime's
/// pitch × height after it (the allocation is freed and denied if a larger pitch does not
/// fit).
///
/// # Safety
/// The HIP API contract of `hipMallocPitch`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMallocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> HipError {
    let f = real_or_3!(real::HIP_MALLOC_PITCH);
    // SAFETY: forwarding the caller's arguments unchanged (used in all paths below).
    let call = || unsafe { f(ptr, pitch, width, height) };
    guarded(call, || {
        if ptr.is_null() || pitch.is_null() {
            return call();
        }
        let api = "hipMallocPitch";
        let guess = (width as u64)
            .checked_next_multiple_of(ALIGN)
            .and_then(|w| w.checked_mul(height as u64))
            .unwrap_or(u64::MAX);
        let mut charge = match reserve(api, None, guess) {
            Ok(c) => c,
            Err(_) => return HIP_ERROR_OUT_OF_MEMORY,
        };
        let rc = call();
        let Some(c) = charge.as_mut() else {
            return rc;
        };
        if rc != 0 {
            account::release(c.idx, c.bytes);
            return rc;
        }
        let p = super::read_ptr(ptr.cast_const());
        let real_bytes = (read(pitch.cast_const()) as u64).saturating_mul(height as u64);
        if real_bytes > c.bytes {
            match reserve(api, Some(c.ord), real_bytes - c.bytes) {
                Err(_) => {
                    if let Some(free) = real::HIP_FREE.get() {
                        // SAFETY: freeing the allocation the runtime just made for this call.
                        unsafe { free(p) };
                    }
                    account::release(c.idx, c.bytes);
                    return HIP_ERROR_OUT_OF_MEMORY;
                }
                Ok(_) => c.bytes = real_bytes,
            }
        } else {
            account::release(c.idx, c.bytes - real_bytes);
            c.bytes = real_bytes;
        }
        account::track(
            &PTRS,
            p as u64,
            c.bytes,
            meta(Kind::Device, c.idx, c.ord),
            0,
        );
        rc
    })
}

/// # Safety
/// The HIP API contract of `hipMallocAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMallocAsync(
    ptr: *mut *mut c_void,
    size: usize,
    stream: Handle,
) -> HipError {
    let f = real_or_3!(real::HIP_MALLOC_ASYNC);
    let bytes = (size as u64).next_multiple_of(ALIGN);
    // SAFETY: forwarding the caller's arguments unchanged.
    linear("hipMallocAsync", ptr, bytes, Kind::Device, || unsafe {
        f(ptr, size, stream)
    })
}

/// # Safety
/// The HIP API contract of `hipMallocFromPoolAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    pool: Handle,
    stream: Handle,
) -> HipError {
    let f = real_or_3!(real::HIP_MALLOC_FROM_POOL_ASYNC);
    let bytes = (size as u64).next_multiple_of(ALIGN);
    // SAFETY: forwarding the caller's arguments unchanged.
    linear(
        "hipMallocFromPoolAsync",
        ptr,
        bytes,
        Kind::Device,
        || unsafe { f(ptr, size, pool, stream) },
    )
}

/// Frees pointer `p` with `call`: forgets it first, restores the entry if the call failed.
fn free_ptr(p: *mut c_void, call: impl Fn() -> HipError) -> HipError {
    guarded(&call, || {
        if p.is_null() {
            return call();
        }
        let entry = PTRS.remove(p as u64);
        let rc = call();
        if let Some(e) = entry {
            if rc == 0 {
                account::release_entry(&e);
            } else {
                PTRS.insert(e);
            }
        }
        rc
    })
}

/// # Safety
/// The HIP API contract of `hipFree`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipFree(ptr: *mut c_void) -> HipError {
    let f = real_or_3!(real::HIP_FREE);
    // SAFETY: forwarding the caller's argument unchanged.
    free_ptr(ptr, || unsafe { f(ptr) })
}

/// # Safety
/// The HIP API contract of `hipFreeAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipFreeAsync(ptr: *mut c_void, stream: Handle) -> HipError {
    let f = real_or_3!(real::HIP_FREE_ASYNC);
    // SAFETY: forwarding the caller's arguments unchanged.
    free_ptr(ptr, || unsafe { f(ptr, stream) })
}
