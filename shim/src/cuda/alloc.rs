//! Linear allocations: cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocManaged, and their frees
//! (cuMemFree_v2, cuMemFreeAsync(_ptsz) for any pointer).
//!
//! Order on every path: reserve in the ledger, call the driver, release if it failed. Frees
//! forget the pointer *before* the driver call (so that an address the driver hands out again
//! at once cannot meet our stale entry) and give the bytes back after it succeeded.

#![allow(non_snake_case)]

use crate::account::{self, Kind, PTRS, current_ordinal, meta, reserve};
use crate::ledger;
use crate::real::{self, CUDA_ERROR_OUT_OF_MEMORY, CUdeviceptr, CUresult, Handle, read, real_or_3};
use std::ffi::c_uint;
use std::sync::atomic::Ordering::SeqCst;

/// Pitch rows are at least this aligned (CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT is 512
/// or less on every GPU we know); the real pitch is corrected after the call.
const PITCH_ALIGN: usize = 512;

/// A linear allocation of `bytes` on the current device, made by `call`.
fn linear(
    api: &str,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    kind: Kind,
    call: impl Fn() -> CUresult,
) -> CUresult {
    if !ledger::active() || dptr.is_null() {
        return call();
    }
    let charge = match reserve(api, current_ordinal(), bytes as u64) {
        Ok(c) => c,
        Err(_) => return CUDA_ERROR_OUT_OF_MEMORY,
    };
    let mut rc = call();
    // The device is full (not the limit): an idle parkable container may make room.
    while rc == CUDA_ERROR_OUT_OF_MEMORY
        && let Some(c) = charge
        && crate::park::room::ask(c.idx, c.bytes)
    {
        rc = call();
    }
    if kind == Kind::Managed && rc == 0 {
        crate::park::note_pin(fgpu_common::ledger::park::pin::MANAGED);
    }
    if let Some(c) = charge {
        if rc == 0 {
            let p = read(dptr);
            if kind == Kind::Managed {
                account::MANAGED[c.idx].fetch_add(c.bytes, SeqCst);
            }
            account::track(&PTRS, p, c.bytes, meta(kind, c.idx, c.ord), 0);
        } else {
            account::release(c.idx, c.bytes);
        }
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuMemAlloc_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let f = real_or_3!(real::CU_MEM_ALLOC);
    let _door = crate::park::enter();
    if let Some(rc) = crate::park::alloc(dptr, bytesize) {
        return rc;
    }
    // Made the ordinary way: it cannot move if the container becomes parkable later.
    crate::park::note_pin(fgpu_common::ledger::park::pin::EARLY);
    // SAFETY: forwarding the caller's arguments unchanged.
    linear("cuMemAlloc_v2", dptr, bytesize, Kind::Device, || unsafe {
        f(dptr, bytesize)
    })
}

/// # Safety
/// The CUDA driver API contract of `cuMemAllocManaged`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_ALLOC_MANAGED);
    // SAFETY: forwarding the caller's arguments unchanged.
    linear(
        "cuMemAllocManaged",
        dptr,
        bytesize,
        Kind::Managed,
        || unsafe { f(dptr, bytesize, flags) },
    )
}

/// Reserves WidthInBytes rounded up to 512 × Height before the call; the driver's pitch ×
/// Height after it (more is reserved, or the allocation freed and denied, if the real pitch
/// is larger; less is given back).
///
/// # Safety
/// The CUDA driver API contract of `cuMemAllocPitch_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_ALLOC_PITCH);
    // SAFETY: forwarding the caller's arguments unchanged (used in all paths below).
    let call = || unsafe { f(dptr, pitch, width, height, elem) };
    if !ledger::active() || dptr.is_null() || pitch.is_null() {
        return call();
    }
    let api = "cuMemAllocPitch_v2";
    let guess = width
        .checked_next_multiple_of(PITCH_ALIGN)
        .and_then(|w| w.checked_mul(height))
        .unwrap_or(usize::MAX);
    let mut charge = match reserve(api, current_ordinal(), guess as u64) {
        Ok(c) => c,
        Err(_) => return CUDA_ERROR_OUT_OF_MEMORY,
    };
    let rc = call();
    let Some(c) = charge.as_mut() else {
        return rc;
    };
    if rc != 0 {
        account::release(c.idx, c.bytes);
        return rc;
    }
    let p = read(dptr);
    let real_bytes = (read(pitch) as u64).saturating_mul(height as u64);
    if real_bytes > c.bytes {
        if !account::reserve_more(api, c, real_bytes - c.bytes) {
            if let Some(free) = real::CU_MEM_FREE.get() {
                // SAFETY: freeing the allocation the driver just made for this call.
                unsafe { free(p) };
            }
            account::release(c.idx, c.bytes);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else {
        account::release(c.idx, c.bytes - real_bytes);
        c.bytes = real_bytes;
    }
    account::track(&PTRS, p, c.bytes, meta(Kind::Device, c.idx, c.ord), 0);
    crate::park::note_pin(fgpu_common::ledger::park::pin::PITCH);
    rc
}

/// Frees pointer `p` with `call`: forgets it first, restores the entry if the call failed.
fn free_ptr(p: CUdeviceptr, call: impl FnOnce() -> CUresult) -> CUresult {
    if !ledger::active() || p == 0 {
        return call();
    }
    let _door = crate::park::enter();
    if let Some(rc) = crate::park::free(p) {
        return rc;
    }
    let entry = PTRS.remove(p);
    let rc = call();
    if let Some(e) = entry {
        if rc == 0 {
            account::release_entry(&e);
        } else {
            PTRS.insert(e);
        }
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuMemFree_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    let f = real_or_3!(real::CU_MEM_FREE);
    // SAFETY: forwarding the caller's argument unchanged.
    free_ptr(dptr, || unsafe { f(dptr) })
}

/// Stream-ordered free: pool allocations go back to their pool (which keeps them reserved);
/// a cuMemAlloc pointer is given back at once.
///
/// # Safety
/// The CUDA driver API contract of `cuMemFreeAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    let f = real_or_3!(real::CU_MEM_FREE_ASYNC);
    // SAFETY: forwarding the caller's arguments unchanged.
    free_ptr(dptr, || unsafe { f(dptr, stream) })
}

/// # Safety
/// The CUDA driver API contract of `cuMemFreeAsync_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    let f = real_or_3!(real::CU_MEM_FREE_ASYNC_PTSZ);
    // SAFETY: forwarding the caller's arguments unchanged.
    free_ptr(dptr, || unsafe { f(dptr, stream) })
}

/// Legacy CUDA IPC cannot export memory backed for parking (the driver refuses VMM memory:
/// "The new CUDA virtual memory management functions do not support the legacy cuIpc*
/// functions", NVIDIA's VMM introduction): the call fails as the driver answers, and the
/// process is marked pinned, with a line saying why (docs/parking.md, "Limits").
///
/// # Safety
/// The CUDA driver API contract of `cuIpcGetMemHandle`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    handle: *mut std::ffi::c_void,
    dptr: CUdeviceptr,
) -> CUresult {
    let f = real_or_3!(real::CU_IPC_GET_MEM_HANDLE);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(handle, dptr) };
    if rc != 0 && crate::park::is_backed(dptr) {
        crate::park::note_pin(fgpu_common::ledger::park::pin::IPC);
        crate::log::warning!(
            "cuIpcGetMemHandle({dptr:#x}) failed ({rc}): this container is parkable \
             (--park-after / FGPU_PARK_AFTER) and its memory is backed for parking, which \
             legacy CUDA IPC cannot export; do not make containers that share memory with \
             CUDA IPC parkable"
        );
    }
    rc
}
