//! `cuGetProcAddress` / `cuGetProcAddress_v2`, and the table of what the shim wraps.
//!
//! The CUDA runtime gets every driver entry point from `cuGetProcAddress_v2(base name,
//! version, flags)`. Our wrapper calls the real one first, so the driver alone decides the
//! variant, the status and the return code; then, if the pointer it returned is the real
//! function of an entry point we wrap (`cuMemAllocAsync` and `cuMemAllocAsync_ptsz` are
//! different entries), it hands out our wrapper for exactly that variant. Any other pointer
//! passes through. A request for `cuGetProcAddress` itself returns ours the same way.

#![allow(non_snake_case)]

use super::{alloc, array, context, meminfo, nvml, pool, vmm};
use crate::real::real_or_3;
use crate::real::{self, CUresult, Raw};
use std::ffi::{c_char, c_int, c_void};

/// The table of wrapped entry points: `REAL => wrapper` pairs, where `real::REAL` (resolved
/// where the table is written: CUDA's or HIP's symbol table) is the real entry point. Makes
/// `wrapper_by_name` (for `dlsym`) and `wrapper_by_real` (for `*GetProcAddress`).
macro_rules! wrap_table {
    ($($real:ident => $wrapper:path,)*) => {
        /// (our wrapper, the real entry) for an exported name we wrap.
        pub fn wrapper_by_name(name: &[u8]) -> Option<(usize, &'static Raw)> {
            $(
                if name == real::$real.raw.name.to_bytes() {
                    return Some(($wrapper as *const () as usize, &real::$real.raw));
                }
            )*
            None
        }

        /// Our wrapper for a real entry point's address.
        pub fn wrapper_by_real(p: usize) -> Option<usize> {
            $(
                if p == real::$real.raw.loaded() {
                    return Some($wrapper as *const () as usize);
                }
            )*
            None
        }
    };
}
pub(crate) use wrap_table;

wrap_table! {
    CU_GET_PROC_ADDRESS => cuGetProcAddress,
    CU_GET_PROC_ADDRESS_V2 => cuGetProcAddress_v2,
    CU_MEM_ALLOC => alloc::cuMemAlloc_v2,
    CU_MEM_ALLOC_PITCH => alloc::cuMemAllocPitch_v2,
    CU_MEM_ALLOC_MANAGED => alloc::cuMemAllocManaged,
    CU_MEM_FREE => alloc::cuMemFree_v2,
    CU_MEM_FREE_ASYNC => alloc::cuMemFreeAsync,
    CU_MEM_FREE_ASYNC_PTSZ => alloc::cuMemFreeAsync_ptsz,
    CU_MEM_ALLOC_ASYNC => pool::cuMemAllocAsync,
    CU_MEM_ALLOC_ASYNC_PTSZ => pool::cuMemAllocAsync_ptsz,
    CU_MEM_ALLOC_FROM_POOL_ASYNC => pool::cuMemAllocFromPoolAsync,
    CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => pool::cuMemAllocFromPoolAsync_ptsz,
    CU_MEM_POOL_CREATE => pool::cuMemPoolCreate,
    CU_MEM_POOL_DESTROY => pool::cuMemPoolDestroy,
    CU_MEM_POOL_TRIM_TO => pool::cuMemPoolTrimTo,
    CU_MEM_CREATE => vmm::cuMemCreate,
    CU_MEM_RELEASE => vmm::cuMemRelease,
    CU_MEM_MAP => vmm::cuMemMap,
    CU_MEM_UNMAP => vmm::cuMemUnmap,
    CU_MEM_RETAIN_ALLOCATION_HANDLE => vmm::cuMemRetainAllocationHandle,
    CU_IPC_GET_MEM_HANDLE => alloc::cuIpcGetMemHandle,
    CU_ARRAY_CREATE => array::cuArrayCreate_v2,
    CU_ARRAY3D_CREATE => array::cuArray3DCreate_v2,
    CU_MIPMAPPED_ARRAY_CREATE => array::cuMipmappedArrayCreate,
    CU_ARRAY_DESTROY => array::cuArrayDestroy,
    CU_MIPMAPPED_ARRAY_DESTROY => array::cuMipmappedArrayDestroy,
    CU_MEM_GET_INFO => meminfo::cuMemGetInfo_v2,
    CU_DEVICE_TOTAL_MEM => meminfo::cuDeviceTotalMem_v2,
    CU_DEVICE_PRIMARY_CTX_RETAIN => context::cuDevicePrimaryCtxRetain,
    CU_DEVICE_PRIMARY_CTX_RELEASE => context::cuDevicePrimaryCtxRelease_v2,
    CU_DEVICE_PRIMARY_CTX_RESET => context::cuDevicePrimaryCtxReset_v2,
    NVML_DEVICE_GET_MEMORY_INFO => nvml::nvmlDeviceGetMemoryInfo,
    NVML_DEVICE_GET_MEMORY_INFO_V2 => nvml::nvmlDeviceGetMemoryInfo_v2,
}

/// Replaces a real entry point the driver handed out with our wrapper of the same variant.
/// Launch entry points are wrapped whether or not a limit is set (super::launch: one atomic
/// load while nothing is gated); the others only while the shim enforces.
fn substitute(pfn: *mut *mut c_void) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: the caller's out-pointer, just written by the driver.
    let p = unsafe { pfn.read_unaligned() } as usize;
    if p == 0 {
        return;
    }
    let w = match super::launch::wrapper_by_real(p) {
        Some(w) => Some(w),
        None if crate::ledger::active() => {
            wrapper_by_real(p).or_else(|| super::copies::wrapper_by_real(p))
        }
        None => None,
    };
    if let Some(w) = w {
        // SAFETY: writing the caller's out-pointer.
        unsafe { pfn.write_unaligned(w as *mut c_void) };
    }
}

/// # Safety
/// The CUDA driver API contract of `cuGetProcAddress` (CUDA 11.3–12.x signature).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    let f = real_or_3!(real::CU_GET_PROC_ADDRESS);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(symbol, pfn, version, flags) };
    if rc == 0 {
        substitute(pfn);
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuGetProcAddress_v2` (CUDA 12.0+).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let f = real_or_3!(real::CU_GET_PROC_ADDRESS_V2);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(symbol, pfn, version, flags, status) };
    if rc == 0 {
        let driver = read(pfn);
        substitute(pfn);
        trace_request(symbol, driver, read(pfn), version, flags);
    }
    rc
}

fn read(pfn: *mut *mut c_void) -> usize {
    if pfn.is_null() {
        return 0;
    }
    // SAFETY: the caller's out-pointer (checked non-null), written by the driver.
    unsafe { pfn.read_unaligned() as usize }
}

/// At `FGPU_LOG=debug`, one line per entry point handed out: which, and whether we wrapped it.
fn trace_request(symbol: *const c_char, driver: usize, given: usize, version: c_int, flags: u64) {
    if !crate::log::enabled(crate::log::Level::Debug) || symbol.is_null() {
        return;
    }
    // SAFETY: the caller's NUL-terminated symbol name (checked non-null).
    let name = unsafe { std::ffi::CStr::from_ptr(symbol) };
    crate::log::debug!(
        "cuGetProcAddress_v2({name:?}, {version}, {flags}) -> {driver:#x}{}",
        if given != driver { " (wrapped)" } else { "" }
    );
}
