//! HIP virtual memory (hipMemCreate with a device location: charged at creation, given back
//! when the handle is released and every mapping unmapped, as for CUDA) and arrays
//! (hipMallocArray: width × max(height, 1) × element size, rounded up to 2 MiB like CUDA
//! arrays; hipFreeArray).

#![allow(non_snake_case)]

use super::{guarded, reserve};
use crate::account::{self, ARRAYS, Kind, MAPS, VMM, idx_of, meta};
use crate::real::hip::{self as real, ChannelFormatDesc, HIP_ERROR_OUT_OF_MEMORY, HipError};
use crate::real::read;
use crate::real::real_or_3;
use crate::real::{AllocPropHead, CU_MEM_LOCATION_TYPE_DEVICE, Handle, MemHandle};
use std::ffi::{c_uint, c_ulonglong, c_void};

/// hipMemLocationTypeDevice has the same value as CUDA's.
const DEVICE: i32 = CU_MEM_LOCATION_TYPE_DEVICE;
const ARRAY_ROUND: u64 = 2 << 20;

/// # Safety
/// The HIP API contract of `hipMemCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMemCreate(
    handle: *mut MemHandle,
    size: usize,
    prop: *const AllocPropHead,
    flags: c_ulonglong,
) -> HipError {
    let f = real_or_3!(real::HIP_MEM_CREATE);
    // SAFETY: forwarding the caller's arguments unchanged.
    let call = || unsafe { f(handle, size, prop, flags) };
    guarded(call, || {
        if handle.is_null() || prop.is_null() {
            return call();
        }
        // SAFETY: the caller's hipMemAllocationProp (non-NULL), read before the runtime does.
        let p = unsafe { prop.read_unaligned() };
        if p.location_type != DEVICE {
            return call();
        }
        let charge = match reserve("hipMemCreate", Some(p.location_id), size as u64) {
            Ok(c) => c,
            Err(_) => return HIP_ERROR_OUT_OF_MEMORY,
        };
        let rc = call();
        if let Some(c) = charge {
            if rc == 0 {
                let h = read(handle.cast_const());
                account::track(&VMM, h, c.bytes, meta(Kind::Vmm, c.idx, c.ord), 1);
            } else {
                account::release(c.idx, c.bytes);
            }
        }
        rc
    })
}

/// # Safety
/// The HIP API contract of `hipMemRelease`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMemRelease(handle: MemHandle) -> HipError {
    let f = real_or_3!(real::HIP_MEM_RELEASE);
    // SAFETY: forwarding the caller's argument unchanged.
    let call = || unsafe { f(handle) };
    guarded(call, || {
        let rc = call();
        if rc == 0 {
            crate::cuda::vmm::unref(handle);
        }
        rc
    })
}

/// # Safety
/// The HIP API contract of `hipMemMap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMemMap(
    ptr: *mut c_void,
    size: usize,
    offset: usize,
    handle: MemHandle,
    flags: c_ulonglong,
) -> HipError {
    let f = real_or_3!(real::HIP_MEM_MAP);
    // SAFETY: forwarding the caller's arguments unchanged.
    let call = || unsafe { f(ptr, size, offset, handle, flags) };
    guarded(call, || {
        let rc = call();
        if rc == 0 {
            let tracked = VMM.update(handle, |e| {
                e.aux += 1;
                true
            });
            if let Some(e) = tracked {
                let m = meta(Kind::Mapping, idx_of(&e), account::ord_of(&e));
                account::track(&MAPS, ptr as u64, size as u64, m, handle);
            }
        }
        rc
    })
}

/// # Safety
/// The HIP API contract of `hipMemUnmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMemUnmap(ptr: *mut c_void, size: usize) -> HipError {
    let f = real_or_3!(real::HIP_MEM_UNMAP);
    // SAFETY: forwarding the caller's arguments unchanged.
    let call = || unsafe { f(ptr, size) };
    guarded(call, || {
        let rc = call();
        if rc == 0 {
            let end = (ptr as u64).saturating_add(size as u64);
            let mut p = ptr as u64;
            while p < end {
                match MAPS.remove(p) {
                    Some(m) => {
                        crate::cuda::vmm::unref(m.aux);
                        p = p.saturating_add(m.size.max(1));
                    }
                    None => break,
                }
            }
        }
        rc
    })
}

/// The footprint charged for a `hipMallocArray`.
pub fn array_bytes(d: &ChannelFormatDesc, width: usize, height: usize) -> u64 {
    let bits: u64 = [d.x, d.y, d.z, d.w].iter().map(|&b| b.max(0) as u64).sum();
    let elem = bits.div_ceil(8).max(1);
    (width.max(1) as u64)
        .saturating_mul(height.max(1) as u64)
        .saturating_mul(elem)
        .div_ceil(ARRAY_ROUND)
        .saturating_mul(ARRAY_ROUND)
}

/// # Safety
/// The HIP API contract of `hipMallocArray`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMallocArray(
    array: *mut Handle,
    desc: *const ChannelFormatDesc,
    width: usize,
    height: usize,
    flags: c_uint,
) -> HipError {
    let f = real_or_3!(real::HIP_MALLOC_ARRAY);
    // SAFETY: forwarding the caller's arguments unchanged.
    let call = || unsafe { f(array, desc, width, height, flags) };
    guarded(call, || {
        if array.is_null() || desc.is_null() {
            return call();
        }
        let bytes = array_bytes(&read(desc), width, height);
        let charge = match reserve("hipMallocArray", None, bytes) {
            Ok(c) => c,
            Err(_) => return HIP_ERROR_OUT_OF_MEMORY,
        };
        let rc = call();
        if let Some(c) = charge {
            if rc == 0 {
                let h = super::read_ptr(array.cast_const()) as u64;
                account::track(&ARRAYS, h, c.bytes, meta(Kind::Array, c.idx, c.ord), 0);
            } else {
                account::release(c.idx, c.bytes);
            }
        }
        rc
    })
}

/// # Safety
/// The HIP API contract of `hipFreeArray`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipFreeArray(array: Handle) -> HipError {
    let f = real_or_3!(real::HIP_FREE_ARRAY);
    // SAFETY: forwarding the caller's argument unchanged.
    let call = || unsafe { f(array) };
    guarded(call, || {
        let e = ARRAYS.remove(array as u64);
        let rc = call();
        if let Some(e) = e {
            if rc == 0 {
                account::release_entry(&e);
            } else {
                ARRAYS.insert(e);
            }
        }
        rc
    })
}
