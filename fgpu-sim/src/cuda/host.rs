//! Page-locked host memory: cuMemAllocHost_v2, cuMemHostAlloc, cuMemFreeHost, and host memory
//! of the process registered with cuMemHostRegister_v2 / cuMemHostUnregister.
//!
//! Backed by anonymous private mappings of this process (pages cost host memory only once
//! touched), tracked in `Local::host`. Nothing is charged on the device. The memory stays
//! until cuMemFreeHost, also if the context that allocated it is destroyed (a real driver
//! frees it with the context).

use super::*;
use crate::ffi::put;
use crate::process::local;
use std::ffi::c_void;

/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED`.
const HOST_ALLOC_FLAGS: u32 = 0x1 | 0x2 | 0x4;

fn host_alloc(out: *mut *mut c_void, size: usize, flags: u32) -> CUresult {
    // A zero-byte request is refused (the reference does not say; a simulator choice).
    if out.is_null() || size == 0 || flags & !HOST_ALLOC_FLAGS != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut l = local();
    if let Err(e) = l.current_dev() {
        return e;
    }
    // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    l.host.insert(p as usize, size);
    put(out, p);
    CUDA_SUCCESS
}

/// `cuMemAllocHost_v2(pp, bytesize)`: `bytesize` bytes of page-locked host memory
/// (CUDA Driver API reference, Memory Management, cuMemAllocHost).
pub extern "C" fn cu_mem_alloc_host(out: *mut *mut c_void, size: usize) -> CUresult {
    host_alloc(out, size, 0)
}

/// `cuMemHostAlloc(pp, bytesize, flags)`: as cuMemAllocHost; `flags` may combine PORTABLE,
/// DEVICEMAP and WRITECOMBINED, anything else is CUDA_ERROR_INVALID_VALUE (Memory
/// Management, cuMemHostAlloc). With unified addressing the device sees the memory at its
/// host address, so the flags change nothing here.
pub extern "C" fn cu_mem_host_alloc(out: *mut *mut c_void, size: usize, flags: u32) -> CUresult {
    host_alloc(out, size, flags)
}

/// `cuMemFreeHost(p)`: frees memory from cuMemAllocHost / cuMemHostAlloc; any other pointer
/// is CUDA_ERROR_INVALID_VALUE.
pub extern "C" fn cu_mem_free_host(p: *mut c_void) -> CUresult {
    let mut l = local();
    if let Err(e) = l.current_dev() {
        return e;
    }
    match l.host.remove(&(p as usize)) {
        Some(size) => {
            // SAFETY: `p` is a mapping of `size` bytes this module made and nothing else
            // references any more (it just left the table).
            unsafe { libc::munmap(p, size) };
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

/// `CU_MEMHOSTREGISTER_PORTABLE | _DEVICEMAP | _IOMEMORY | _READ_ONLY`.
const HOST_REGISTER_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8;
const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;

/// Registered ranges: start → length (process-wide, like the real driver's).
static REGISTERED: std::sync::Mutex<std::collections::BTreeMap<usize, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// `cuMemHostRegister_v2(p, bytesize, flags)`: page-locks a range of the process's memory
/// (Memory Management, cuMemHostRegister): a range overlapping one already registered is
/// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, unknown flags or a zero size
/// CUDA_ERROR_INVALID_VALUE. The simulator only records the range.
pub extern "C" fn cu_mem_host_register(p: *mut c_void, size: usize, flags: u32) -> CUresult {
    if p.is_null() || size == 0 || flags & !HOST_REGISTER_FLAGS != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if let Err(e) = local().current_dev() {
        return e;
    }
    let start = p as usize;
    let mut r = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    let overlaps = r
        .range(..start + size)
        .next_back()
        .is_some_and(|(&s, &len)| s + len > start);
    if overlaps {
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    r.insert(start, size);
    CUDA_SUCCESS
}

/// `cuMemHostUnregister(p)`: `p` must be the start of a registered range, else
/// CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED.
pub extern "C" fn cu_mem_host_unregister(p: *mut c_void) -> CUresult {
    if let Err(e) = local().current_dev() {
        return e;
    }
    match REGISTERED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(p as usize))
    {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    }
}
