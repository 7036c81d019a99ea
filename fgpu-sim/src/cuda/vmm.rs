//! Virtual memory management: cuMemCreate / cuMemMap and friends.
//!
//! Physical memory (a `cuMemCreate` with a DEVICE location) is charged at creation and given
//! back only once the handle has been released AND every mapping of it unmapped. Its
//! contents belong to the handle (`VmmHandle::data`): mapped at another address, or at the
//! same one again, a handle shows the same bytes; a new handle starts at zero. A reserved
//! range with nothing mapped is no memory at all: an access to it is an illegal address
//! (see `cuda::copy`).

use super::*;
use crate::ffi::{get, put};
use crate::process::{Local, Mapping, VmmHandle, local};

pub const GRANULARITY: u64 = 2 << 20;
const LOCATION_DEVICE: i32 = 1;

/// Head of `CUmemAllocationProp`: type, requestedHandleTypes, `CUmemLocation { type, id }`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AllocPropHead {
    pub alloc_type: i32,
    pub handle_types: i32,
    pub location_type: i32,
    pub location_id: i32,
}

pub extern "C" fn cu_mem_create(
    out: *mut u64,
    size: usize,
    prop: *const AllocPropHead,
    _flags: u64,
) -> CUresult {
    let Some(pr) = get(prop) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let size = size as u64;
    if out.is_null() || size == 0 || !size.is_multiple_of(GRANULARITY) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let dev = if pr.location_type == LOCATION_DEVICE {
        match device::device_index(pr.location_id) {
            Ok(d) => Some(d),
            Err(_) => return CUDA_ERROR_INVALID_DEVICE,
        }
    } else {
        None
    };
    let mut l = local();
    if let Err(e) = l.current_dev() {
        return e;
    }
    if let Some(d) = dev
        && let Err(e) = l.charge(d, size)
    {
        return e;
    }
    let h = l.handle() as u64;
    l.vmm.insert(
        h,
        VmmHandle {
            dev,
            size,
            released: false,
            mappings: 0,
            data: Default::default(),
        },
    );
    put(out, h);
    CUDA_SUCCESS
}

/// Drops a handle whose last reference went away.
fn maybe_free(l: &mut Local, h: u64) {
    if let Some(v) = l.vmm.get(&h)
        && v.released
        && v.mappings == 0
    {
        let (dev, size) = (v.dev, v.size);
        l.vmm.remove(&h);
        if let Some(d) = dev {
            l.uncharge(d, size);
        }
    }
}

pub extern "C" fn cu_mem_release(h: u64) -> CUresult {
    let mut l = local();
    match l.vmm.get_mut(&h) {
        Some(v) if !v.released => {
            v.released = true;
            maybe_free(&mut l, h);
            CUDA_SUCCESS
        }
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}

pub extern "C" fn cu_mem_address_reserve(
    out: *mut CUdeviceptr,
    size: usize,
    align: usize,
    _addr: CUdeviceptr,
    _flags: u64,
) -> CUresult {
    let size = size as u64;
    if out.is_null() || size == 0 || !size.is_multiple_of(GRANULARITY) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut l = local();
    if let Err(e) = l.current_dev() {
        return e;
    }
    let p = l.va(size, (align as u64).max(GRANULARITY));
    l.reservations.insert(p, size);
    put(out, p);
    CUDA_SUCCESS
}

pub extern "C" fn cu_mem_address_free(ptr: CUdeviceptr, _size: usize) -> CUresult {
    match local().reservations.remove(&ptr) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

fn reserved(l: &Local, ptr: u64, size: u64) -> bool {
    l.reservations
        .range(..=ptr)
        .next_back()
        .is_some_and(|(&s, &len)| ptr + size <= s + len)
}

/// `cuMemMap(ptr, size, offset, handle, flags)`: maps `size` bytes of `handle`, starting
/// `offset` bytes into it, at `ptr` inside a reservation. The CUDA Driver API reference
/// (Virtual Memory Management, cuMemMap) notes that the offset "currently must be zero"; the
/// simulator is more lenient and honours any offset with `offset + size` inside the handle,
/// so that reads through the mapping land where they would.
pub extern "C" fn cu_mem_map(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    h: u64,
    _flags: u64,
) -> CUresult {
    let (size, offset) = (size as u64, offset as u64);
    let mut l = local();
    let end = ptr.saturating_add(size);
    let overlaps = l
        .mappings
        .range(..end)
        .next_back()
        .is_some_and(|(&s, m)| s + m.size > ptr);
    if size == 0 || !reserved(&l, ptr, size) || overlaps {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match l.vmm.get_mut(&h) {
        Some(v) if !v.released && offset.checked_add(size).is_some_and(|e| e <= v.size) => {
            v.mappings += 1
        }
        _ => return CUDA_ERROR_INVALID_HANDLE,
    }
    l.mappings.insert(
        ptr,
        Mapping {
            size,
            handle: h,
            offset,
            read: 0,
            write: 0,
        },
    );
    CUDA_SUCCESS
}

pub extern "C" fn cu_mem_unmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let mut l = local();
    let end = ptr + size as u64;
    let hit: Vec<u64> = l.mappings.range(ptr..end).map(|(&p, _)| p).collect();
    if hit.is_empty() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for p in hit {
        if let Some(m) = l.mappings.remove(&p) {
            if let Some(v) = l.vmm.get_mut(&m.handle) {
                v.mappings = v.mappings.saturating_sub(1);
            }
            maybe_free(&mut l, m.handle);
        }
    }
    CUDA_SUCCESS
}

/// `CUmemAccessDesc`: a location (type, id) and the access flags.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AccessDesc {
    pub location_type: i32,
    pub location_id: i32,
    pub flags: i32,
}

/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`, `_READ`, `_READWRITE`.
const PROT_NONE: i32 = 0;
const PROT_READ: i32 = 1;
const PROT_READWRITE: i32 = 3;

/// `cuMemSetAccess(ptr, size, desc, count)`: sets, for each device a descriptor names, what
/// it may do with the mappings in the range. Modelled after the CUDA Programming Guide
/// (Virtual Memory Management, "Controlling Access Rights"): a new mapping is accessible
/// from no device until access is set, the device that owns the memory included; access is
/// per device and per range, and a context's peer access (`cuCtxEnablePeerAccess`) does not
/// extend to such memory, so a device not named here cannot touch it: an access from a
/// context on that device is an illegal address in `cuda::copy` (UCX met the same on real
/// GPUs: openucx/ucx pull request 11265, cross-device copies of VMM memory failing for want
/// of access rights). The range must lie in a reservation and hold at least one mapping;
/// every mapping it touches is set.
pub extern "C" fn cu_mem_set_access(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> CUresult {
    let size = size as u64;
    if desc.is_null() || count == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes `count` descriptors (API contract, as `crate::ffi` trusts
    // host pointers); checked non-null above.
    let descs = unsafe { std::slice::from_raw_parts(desc, count) };
    let mut set = Vec::with_capacity(count);
    for d in descs {
        if d.location_type != LOCATION_DEVICE {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Ok(dev) = device::device_index(d.location_id) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        let (r, w) = match d.flags {
            PROT_NONE => (false, false),
            PROT_READ => (true, false),
            PROT_READWRITE => (true, true),
            _ => return CUDA_ERROR_INVALID_VALUE,
        };
        set.push((1u64 << dev, r, w));
    }
    let mut l = local();
    if !reserved(&l, ptr, size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let end = ptr + size;
    let first = l
        .mappings
        .range(..ptr)
        .next_back()
        .filter(|(s, m)| *s + m.size > ptr)
        .map(|(&s, _)| s)
        .unwrap_or(ptr);
    let mut touched = false;
    for (_, m) in l.mappings.range_mut(first..end) {
        touched = true;
        for &(bit, r, w) in &set {
            m.read = if r { m.read | bit } else { m.read & !bit };
            m.write = if w { m.write | bit } else { m.write & !bit };
        }
    }
    if touched {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

pub extern "C" fn cu_mem_get_allocation_granularity(
    out: *mut usize,
    prop: *const AllocPropHead,
    _option: i32,
) -> CUresult {
    if prop.is_null() || !put(out, GRANULARITY as usize) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUDA_SUCCESS
}
