//! Virtual memory management: cuMemCreate, cuMemMap, cuMemUnmap, cuMemRelease,
//! cuMemRetainAllocationHandle.
//!
//! Physical memory with a DEVICE location is charged at cuMemCreate and given back only when
//! its last reference is gone: the handle itself (cuMemRelease) and every mapping
//! (cuMemUnmap); cuMemRetainAllocationHandle adds a reference. Host-located memory is not GPU
//! memory and passes through.

#![allow(non_snake_case)]

use crate::account::{self, Kind, MAPS, VMM, idx_of, meta, reserve};
use crate::ledger;
use crate::real::{
    self, AllocPropHead, CU_MEM_LOCATION_TYPE_DEVICE, CUDA_ERROR_OUT_OF_MEMORY, CUdeviceptr,
    CUresult, MemHandle,
};
use crate::real::{read, real_or_3};
use std::ffi::{c_ulonglong, c_void};

/// Drops one reference of handle `h`; gives its memory back when none is left.
pub fn unref(h: MemHandle) {
    let mut gone = None;
    VMM.update(h, |e| {
        e.aux = e.aux.saturating_sub(1);
        if e.aux == 0 {
            gone = Some(*e);
            return false;
        }
        true
    });
    if let Some(e) = gone {
        account::release(idx_of(&e), e.size);
    }
}

/// # Safety
/// The CUDA driver API contract of `cuMemCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut MemHandle,
    size: usize,
    prop: *const AllocPropHead,
    flags: c_ulonglong,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_CREATE);
    // SAFETY: forwarding the caller's arguments unchanged.
    let call = || unsafe { f(handle, size, prop, flags) };
    if !ledger::active() || handle.is_null() || prop.is_null() {
        return call();
    }
    // SAFETY: the caller's CUmemAllocationProp (non-NULL), read before the driver reads it.
    let p = unsafe { prop.read_unaligned() };
    if p.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
        return call();
    }
    let charge = match reserve("cuMemCreate", Some(p.location_id), size as u64) {
        Ok(c) => c,
        Err(_) => return CUDA_ERROR_OUT_OF_MEMORY,
    };
    let rc = call();
    if let Some(c) = charge {
        if rc == 0 {
            crate::park::note_pin(fgpu_common::ledger::park::pin::VMM);
            account::track(
                &VMM,
                read(handle),
                c.bytes,
                meta(Kind::Vmm, c.idx, c.ord),
                1,
            );
        } else {
            account::release(c.idx, c.bytes);
        }
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuMemRelease`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: MemHandle) -> CUresult {
    let f = real_or_3!(real::CU_MEM_RELEASE);
    // SAFETY: forwarding the caller's argument unchanged.
    let rc = unsafe { f(handle) };
    if rc == 0 && ledger::active() {
        unref(handle);
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuMemMap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: MemHandle,
    flags: c_ulonglong,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_MAP);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(ptr, size, offset, handle, flags) };
    if rc == 0 && ledger::active() {
        let tracked = VMM.update(handle, |e| {
            e.aux += 1;
            true
        });
        if let Some(e) = tracked {
            account::track(
                &MAPS,
                ptr,
                size as u64,
                meta(Kind::Mapping, idx_of(&e), account::ord_of(&e)),
                handle,
            );
        }
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuMemUnmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let f = real_or_3!(real::CU_MEM_UNMAP);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(ptr, size) };
    if rc == 0 && ledger::active() {
        // The range covers whole mappings: walk them from its start.
        let end = ptr.saturating_add(size as u64);
        let mut p = ptr;
        while p < end {
            match MAPS.remove(p) {
                Some(m) => {
                    unref(m.aux);
                    p = p.saturating_add(m.size.max(1));
                }
                None => break,
            }
        }
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuMemRetainAllocationHandle`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut MemHandle,
    addr: *mut c_void,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_RETAIN_ALLOCATION_HANDLE);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(handle, addr) };
    if rc == 0 && ledger::active() && !handle.is_null() {
        VMM.update(read(handle.cast_const()), |e| {
            e.aux += 1;
            true
        });
    }
    rc
}
