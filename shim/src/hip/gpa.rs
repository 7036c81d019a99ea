//! `hipGetProcAddress` and the table of wrapped HIP / SMI names (for `dlsym` and
//! `hipGetProcAddress`).
//!
//! `hipGetProcAddress` calls the real one first (the runtime decides the result, its status
//! and its return code), then substitutes our wrapper if the pointer it returned is the real
//! function of an entry point we wrap. Any other pointer passes through.

#![allow(non_snake_case)]

use super::{alloc, amdsmi, enabled, info, vmm};
use crate::real::Raw;
use crate::real::hip::{self as real, HipError};
use crate::real::real_or_3;
use std::ffi::{c_char, c_int, c_void};

crate::cuda::gpa::wrap_table! {
    HIP_GET_PROC_ADDRESS => hipGetProcAddress,
    HIP_MALLOC => alloc::hipMalloc,
    HIP_EXT_MALLOC_WITH_FLAGS => alloc::hipExtMallocWithFlags,
    HIP_MALLOC_MANAGED => alloc::hipMallocManaged,
    HIP_MALLOC_PITCH => alloc::hipMallocPitch,
    HIP_FREE => alloc::hipFree,
    HIP_MALLOC_ASYNC => alloc::hipMallocAsync,
    HIP_MALLOC_FROM_POOL_ASYNC => alloc::hipMallocFromPoolAsync,
    HIP_FREE_ASYNC => alloc::hipFreeAsync,
    HIP_MEM_CREATE => vmm::hipMemCreate,
    HIP_MEM_RELEASE => vmm::hipMemRelease,
    HIP_MEM_MAP => vmm::hipMemMap,
    HIP_MEM_UNMAP => vmm::hipMemUnmap,
    HIP_MALLOC_ARRAY => vmm::hipMallocArray,
    HIP_FREE_ARRAY => vmm::hipFreeArray,
    HIP_MEM_GET_INFO => info::hipMemGetInfo,
    HIP_DEVICE_TOTAL_MEM => info::hipDeviceTotalMem,
    RSMI_DEV_MEMORY_TOTAL_GET => info::rsmi_dev_memory_total_get,
    RSMI_DEV_MEMORY_USAGE_GET => info::rsmi_dev_memory_usage_get,
    AMDSMI_GET_GPU_MEMORY_TOTAL => amdsmi::amdsmi_get_gpu_memory_total,
    AMDSMI_GET_GPU_MEMORY_USAGE => amdsmi::amdsmi_get_gpu_memory_usage,
    AMDSMI_GET_GPU_VRAM_USAGE => amdsmi::amdsmi_get_gpu_vram_usage,
}

/// # Safety
/// The HIP API contract of `hipGetProcAddress` (ROCm 6.2+).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> HipError {
    let f = real_or_3!(real::HIP_GET_PROC_ADDRESS);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(symbol, pfn, version, flags, status) };
    if rc == 0 && !pfn.is_null() {
        // SAFETY: the caller's out-pointer, just written by the runtime.
        let p = unsafe { pfn.read_unaligned() } as usize;
        // Launch entry points: always ours (one atomic load while nothing is gated).
        let w = super::launch::wrapper_by_real(p)
            .or_else(|| enabled().then(|| wrapper_by_real(p)).flatten());
        if let Some(w) = w.filter(|_| p != 0) {
            // SAFETY: writing the caller's out-pointer.
            unsafe { pfn.write_unaligned(w as *mut c_void) };
        }
    }
    rc
}
