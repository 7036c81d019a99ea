//! Device memory through HIP: linear, managed, pitched, stream-ordered and pools, VMM,
//! arrays, memory info. Each entry point maps HIP ordinals to physical devices and calls the
//! CUDA simulation, which charges the shared state.

use super::*;
use crate::cuda::array::{ArrayDescriptor, cu_array_create, cu_array_destroy};
use crate::cuda::memory as mem;
use crate::cuda::pool::{self, PoolPropsHead};
use crate::cuda::vmm::{self, AllocPropHead};
use crate::ffi::get;
use std::ffi::c_void;

type DPtr = *mut *mut c_void;

fn out(p: DPtr) -> *mut u64 {
    p.cast()
}

pub extern "C" fn hip_malloc(ptr: DPtr, size: usize) -> HipError {
    if size == 0 {
        // hipMalloc(&p, 0) succeeds with a NULL pointer.
        return if crate::ffi::put(ptr, std::ptr::null_mut()) {
            call(|_| HIP_SUCCESS)
        } else {
            HIP_ERROR_INVALID_VALUE
        };
    }
    call(|_| mem::cu_mem_alloc(out(ptr), size))
}

/// `hipExtMallocWithFlags(ptr, size, flags)`: device memory whatever the flags (fine-grained,
/// uncached, ...): all of them take device memory.
pub extern "C" fn hip_ext_malloc_with_flags(ptr: DPtr, size: usize, _flags: u32) -> HipError {
    hip_malloc(ptr, size)
}

pub extern "C" fn hip_malloc_managed(ptr: DPtr, size: usize, flags: u32) -> HipError {
    call(|_| mem::cu_mem_alloc_managed(out(ptr), size, flags))
}

/// `hipMallocPitch(ptr, pitch, width, height)`: pitch = width rounded up to 512.
pub extern "C" fn hip_malloc_pitch(
    ptr: DPtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> HipError {
    call(|_| mem::cu_mem_alloc_pitch(out(ptr), pitch, width, height, 4))
}

pub extern "C" fn hip_free(p: *mut c_void) -> HipError {
    call(|_| mem::cu_mem_free(p as u64))
}

pub extern "C" fn hip_malloc_async(ptr: DPtr, size: usize, stream: usize) -> HipError {
    call(|_| pool::cu_mem_alloc_async(out(ptr), size, stream))
}

pub extern "C" fn hip_malloc_from_pool_async(
    ptr: DPtr,
    size: usize,
    pool: usize,
    stream: usize,
) -> HipError {
    call(|_| pool::cu_mem_alloc_from_pool_async(out(ptr), size, pool, stream))
}

pub extern "C" fn hip_free_async(p: *mut c_void, stream: usize) -> HipError {
    call(|_| pool::cu_mem_free_async(p as u64, stream))
}

/// A copy of a props head with the HIP ordinal of a device location made physical.
fn physical_location<T: Copy>(
    prop: *const T,
    loc: impl Fn(&mut T) -> (&mut i32, i32),
) -> Result<T, HipError> {
    let mut p = get(prop).ok_or(HIP_ERROR_INVALID_VALUE)?;
    let (id, ty) = loc(&mut p);
    if ty == 1 {
        *id = cuda_ord(physical(*id)?)?;
    }
    Ok(p)
}

pub extern "C" fn hip_mem_pool_create(
    pool_out: *mut usize,
    props: *const PoolPropsHead,
) -> HipError {
    call(
        |_| match physical_location(props, |p| (&mut p.location_id, p.location_type)) {
            Ok(p) => pool::cu_mem_pool_create(pool_out, &p),
            Err(e) => e,
        },
    )
}

pub extern "C" fn hip_mem_pool_destroy(p: usize) -> HipError {
    call(|_| pool::cu_mem_pool_destroy(p))
}

pub extern "C" fn hip_mem_pool_trim_to(p: usize, keep: usize) -> HipError {
    call(|_| pool::cu_mem_pool_trim_to(p, keep))
}

pub extern "C" fn hip_device_get_default_mem_pool(pool_out: *mut usize, ord: i32) -> HipError {
    call(|_| match physical(ord) {
        Ok(d) => match cuda_ord(d) {
            Ok(o) => pool::cu_device_get_default_mem_pool(pool_out, o),
            Err(e) => e,
        },
        Err(e) => e,
    })
}

pub extern "C" fn hip_mem_create(
    handle: *mut u64,
    size: usize,
    prop: *const AllocPropHead,
    flags: u64,
) -> HipError {
    call(
        |_| match physical_location(prop, |p| (&mut p.location_id, p.location_type)) {
            Ok(p) => vmm::cu_mem_create(handle, size, &p, flags),
            Err(e) => e,
        },
    )
}

pub extern "C" fn hip_mem_release(h: u64) -> HipError {
    call(|_| vmm::cu_mem_release(h))
}

pub extern "C" fn hip_mem_address_reserve(
    ptr: DPtr,
    size: usize,
    align: usize,
    addr: *mut c_void,
    flags: u64,
) -> HipError {
    call(|_| vmm::cu_mem_address_reserve(out(ptr), size, align, addr as u64, flags))
}

pub extern "C" fn hip_mem_address_free(p: *mut c_void, size: usize) -> HipError {
    call(|_| vmm::cu_mem_address_free(p as u64, size))
}

pub extern "C" fn hip_mem_map(
    p: *mut c_void,
    size: usize,
    offset: usize,
    h: u64,
    flags: u64,
) -> HipError {
    call(|_| vmm::cu_mem_map(p as u64, size, offset, h, flags))
}

pub extern "C" fn hip_mem_unmap(p: *mut c_void, size: usize) -> HipError {
    call(|_| vmm::cu_mem_unmap(p as u64, size))
}

pub extern "C" fn hip_mem_set_access(
    p: *mut c_void,
    size: usize,
    desc: *const u8,
    count: usize,
) -> HipError {
    // hipMemAccessDesc has CUmemAccessDesc's layout and values (location type 1 = device,
    // flags 3 = read and write).
    call(|_| vmm::cu_mem_set_access(p as u64, size, desc.cast(), count))
}

pub extern "C" fn hip_mem_get_allocation_granularity(
    gran: *mut usize,
    prop: *const AllocPropHead,
    option: i32,
) -> HipError {
    call(
        |_| match physical_location(prop, |p| (&mut p.location_id, p.location_type)) {
            Ok(p) => vmm::cu_mem_get_allocation_granularity(gran, &p, option),
            Err(e) => e,
        },
    )
}

/// `hipChannelFormatDesc`: bits per channel x, y, z, w and the kind.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ChannelFormatDesc {
    pub x: i32,
    pub y: i32,
    pub z: i32,
    pub w: i32,
    pub kind: i32,
}

/// Bytes per element of a channel description (at least 1).
pub fn element_bytes(d: &ChannelFormatDesc) -> u32 {
    let bits = [d.x, d.y, d.z, d.w]
        .iter()
        .map(|&b| b.max(0) as u32)
        .sum::<u32>();
    bits.div_ceil(8).max(1)
}

/// `hipMallocArray(array, desc, width, height, flags)`: width × max(height, 1) elements,
/// charged as a CUDA array of one-byte channels (same footprint rounding).
pub extern "C" fn hip_malloc_array(
    array: *mut usize,
    desc: *const ChannelFormatDesc,
    width: usize,
    height: usize,
    _flags: u32,
) -> HipError {
    let Some(d) = get(desc) else {
        return HIP_ERROR_INVALID_VALUE;
    };
    let a = ArrayDescriptor {
        width,
        height,
        format: 0x01,
        channels: element_bytes(&d),
    };
    call(|_| cu_array_create(array, &a))
}

pub extern "C" fn hip_free_array(array: usize) -> HipError {
    call(|_| cu_array_destroy(array))
}

pub extern "C" fn hip_mem_get_info(free: *mut usize, total: *mut usize) -> HipError {
    call(|_| mem::cu_mem_get_info(free, total))
}
