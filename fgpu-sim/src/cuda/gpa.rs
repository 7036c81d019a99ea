//! `cuGetProcAddress` / `cuGetProcAddress_v2`: base name + CUDA version + flags → variant.
//!
//! Each base name has rows `(version from which a variant applies, variant)`; the row with the
//! highest version ≤ the requested one wins. With `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`
//! (flags & 2) the `_ptsz` rows are used where a base has any. Where the simulator exports only
//! the newer variant of a function (e.g. `cuMemAlloc_v2`, not the 32-bit `cuMemAlloc`), the
//! older version range maps to the newer variant as well — consistently for every such base.
//! Results are the addresses of our own exported trampolines, never dlsym.

use super::*;
use crate::exports::*;
use crate::ffi::{put, str_arg};
use std::ffi::c_void;

pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
pub const STATUS_SUCCESS: i32 = 0;
pub const STATUS_SYMBOL_NOT_FOUND: i32 = 1;
pub const STATUS_VERSION_NOT_SUFFICIENT: i32 = 2;

struct Row {
    base: &'static str,
    since: i32,
    ptsz: bool,
    f: extern "C" fn(),
}

const fn r(base: &'static str, since: i32, f: extern "C" fn()) -> Row {
    Row {
        base,
        since,
        ptsz: false,
        f,
    }
}

const fn p(base: &'static str, since: i32, f: extern "C" fn()) -> Row {
    Row {
        base,
        since,
        ptsz: true,
        f,
    }
}

static TABLE: &[Row] = &[
    r("cuInit", 2000, cuInit),
    r("cuDriverGetVersion", 2020, cuDriverGetVersion),
    r("cuDeviceGet", 2000, cuDeviceGet),
    r("cuDeviceGetCount", 2000, cuDeviceGetCount),
    r("cuDeviceGetName", 2000, cuDeviceGetName),
    r("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    r("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    r("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    r("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    r("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    r("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    r("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    r(
        "cuDevicePrimaryCtxRelease",
        7000,
        cuDevicePrimaryCtxRelease_v2,
    ),
    r("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    r("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    r("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    r("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    r("cuCtxGetDevice", 2000, cuCtxGetDevice),
    r("cuCtxSynchronize", 2000, cuCtxSynchronize),
    r("cuGetProcAddress", 11030, cuGetProcAddress),
    r("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    r("cuGetExportTable", 3000, cuGetExportTable),
    r("cuGetErrorString", 6000, cuGetErrorString),
    r("cuGetErrorName", 6000, cuGetErrorName),
    r("cuMemAlloc", 2000, cuMemAlloc_v2),
    r("cuMemAllocPitch", 2000, cuMemAllocPitch_v2),
    r("cuMemAllocManaged", 6000, cuMemAllocManaged),
    r("cuMemFree", 2000, cuMemFree_v2),
    r("cuMemGetInfo", 2000, cuMemGetInfo_v2),
    r("cuMemGetAddressRange", 2000, cuMemGetAddressRange_v2),
    r("cuMemcpy", 4000, cuMemcpy),
    p("cuMemcpy", 7000, cuMemcpy_ptds),
    r("cuMemcpyHtoD", 2000, cuMemcpyHtoD_v2),
    p("cuMemcpyHtoD", 7000, cuMemcpyHtoD_v2_ptds),
    r("cuMemcpyDtoH", 2000, cuMemcpyDtoH_v2),
    p("cuMemcpyDtoH", 7000, cuMemcpyDtoH_v2_ptds),
    r("cuMemcpyDtoD", 2000, cuMemcpyDtoD_v2),
    p("cuMemcpyDtoD", 7000, cuMemcpyDtoD_v2_ptds),
    r("cuMemcpyHtoDAsync", 2000, cuMemcpyHtoDAsync_v2),
    p("cuMemcpyHtoDAsync", 7000, cuMemcpyHtoDAsync_v2_ptsz),
    r("cuMemcpyDtoHAsync", 2000, cuMemcpyDtoHAsync_v2),
    p("cuMemcpyDtoHAsync", 7000, cuMemcpyDtoHAsync_v2_ptsz),
    r("cuMemcpyDtoDAsync", 3000, cuMemcpyDtoDAsync_v2),
    p("cuMemcpyDtoDAsync", 7000, cuMemcpyDtoDAsync_v2_ptsz),
    r("cuMemsetD8", 2000, cuMemsetD8_v2),
    p("cuMemsetD8", 7000, cuMemsetD8_v2_ptds),
    r("cuMemsetD32", 2000, cuMemsetD32_v2),
    p("cuMemsetD32", 7000, cuMemsetD32_v2_ptds),
    r("cuMemcpyBatchAsync", 12080, cuMemcpyBatchAsync),
    p("cuMemcpyBatchAsync", 12080, cuMemcpyBatchAsync_ptsz),
    r("cuMemcpyBatchAsync", 13000, cuMemcpyBatchAsync_v2),
    p("cuMemcpyBatchAsync", 13000, cuMemcpyBatchAsync_v2_ptsz),
    r("cuStreamWriteValue32", 8000, cuStreamWriteValue32),
    p("cuStreamWriteValue32", 8000, cuStreamWriteValue32_ptsz),
    r("cuStreamWriteValue32", 11070, cuStreamWriteValue32_v2),
    p("cuStreamWriteValue32", 11070, cuStreamWriteValue32_v2_ptsz),
    r("cuStreamWriteValue64", 9000, cuStreamWriteValue64),
    p("cuStreamWriteValue64", 9000, cuStreamWriteValue64_ptsz),
    r("cuStreamWriteValue64", 11070, cuStreamWriteValue64_v2),
    p("cuStreamWriteValue64", 11070, cuStreamWriteValue64_v2_ptsz),
    r("cuStreamWaitValue32", 8000, cuStreamWaitValue32),
    p("cuStreamWaitValue32", 8000, cuStreamWaitValue32_ptsz),
    r("cuStreamWaitValue32", 11070, cuStreamWaitValue32_v2),
    p("cuStreamWaitValue32", 11070, cuStreamWaitValue32_v2_ptsz),
    r("cuStreamWaitValue64", 9000, cuStreamWaitValue64),
    p("cuStreamWaitValue64", 9000, cuStreamWaitValue64_ptsz),
    r("cuStreamWaitValue64", 11070, cuStreamWaitValue64_v2),
    p("cuStreamWaitValue64", 11070, cuStreamWaitValue64_v2_ptsz),
    r("cuStreamBatchMemOp", 8000, cuStreamBatchMemOp),
    p("cuStreamBatchMemOp", 8000, cuStreamBatchMemOp_ptsz),
    r("cuStreamBatchMemOp", 11070, cuStreamBatchMemOp_v2),
    p("cuStreamBatchMemOp", 11070, cuStreamBatchMemOp_v2_ptsz),
    r("cuMemAllocHost", 2000, cuMemAllocHost_v2),
    r("cuMemHostAlloc", 2020, cuMemHostAlloc),
    r("cuMemFreeHost", 2000, cuMemFreeHost),
    r("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    r("cuMemHostUnregister", 4000, cuMemHostUnregister),
    r("cuMemAllocAsync", 11020, cuMemAllocAsync),
    p("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    r("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    p(
        "cuMemAllocFromPoolAsync",
        11020,
        cuMemAllocFromPoolAsync_ptsz,
    ),
    r("cuMemFreeAsync", 11020, cuMemFreeAsync),
    p("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    r("cuMemPoolCreate", 11020, cuMemPoolCreate),
    r("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    r("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    r(
        "cuDeviceGetDefaultMemPool",
        11020,
        cuDeviceGetDefaultMemPool,
    ),
    r("cuMemCreate", 10020, cuMemCreate),
    r("cuMemRelease", 10020, cuMemRelease),
    r("cuMemAddressReserve", 10020, cuMemAddressReserve),
    r("cuMemAddressFree", 10020, cuMemAddressFree),
    r("cuMemMap", 10020, cuMemMap),
    r("cuMemUnmap", 10020, cuMemUnmap),
    r("cuMemSetAccess", 10020, cuMemSetAccess),
    r(
        "cuMemGetAllocationGranularity",
        10020,
        cuMemGetAllocationGranularity,
    ),
    r("cuArrayCreate", 2000, cuArrayCreate_v2),
    r("cuArray3DCreate", 2000, cuArray3DCreate_v2),
    r("cuArrayDestroy", 2000, cuArrayDestroy),
    r("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    r("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    r("cuStreamCreate", 2000, cuStreamCreate),
    r("cuStreamDestroy", 2000, cuStreamDestroy_v2),
    r("cuStreamSynchronize", 2000, cuStreamSynchronize),
    r("cuStreamQuery", 2000, cuStreamQuery),
    r("cuStreamBeginCapture", 10000, cuStreamBeginCapture_v2),
    r("cuStreamEndCapture", 10000, cuStreamEndCapture),
    r("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    r("cuEventCreate", 2000, cuEventCreate),
    r("cuEventRecord", 2000, cuEventRecord),
    r("cuEventSynchronize", 2000, cuEventSynchronize),
    r("cuEventQuery", 2000, cuEventQuery),
    r("cuEventElapsedTime", 2000, cuEventElapsedTime),
    r("cuEventDestroy", 2000, cuEventDestroy_v2),
    r("cuModuleLoadData", 2000, cuModuleLoadData),
    r("cuModuleLoad", 2000, cuModuleLoad),
    r("cuModuleGetFunction", 2000, cuModuleGetFunction),
    r("cuModuleUnload", 2000, cuModuleUnload),
    r("cuLaunchKernel", 4000, cuLaunchKernel),
    p("cuLaunchKernel", 7000, cuLaunchKernel_ptsz),
    r("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    p("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
    r("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    p(
        "cuLaunchCooperativeKernel",
        9000,
        cuLaunchCooperativeKernel_ptsz,
    ),
    r(
        "cuGraphInstantiateWithFlags",
        11040,
        cuGraphInstantiateWithFlags,
    ),
    r("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    r("cuGraphLaunch", 10000, cuGraphLaunch),
    p("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
    r("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    r("cuGraphDestroy", 10000, cuGraphDestroy),
];

/// Resolves `base` for `version` and `flags`: (address or NULL, query status).
pub fn lookup(base: &str, version: i32, flags: u64) -> (*mut c_void, i32) {
    let rows = || TABLE.iter().filter(|row| row.base == base);
    if rows().next().is_none() {
        return (std::ptr::null_mut(), STATUS_SYMBOL_NOT_FOUND);
    }
    let ptsz =
        flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 && rows().any(|row| row.ptsz);
    match rows()
        .filter(|row| row.ptsz == ptsz && row.since <= version)
        .max_by_key(|row| row.since)
    {
        Some(row) => (row.f as *mut c_void, STATUS_SUCCESS),
        None => (std::ptr::null_mut(), STATUS_VERSION_NOT_SUFFICIENT),
    }
}

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    let Some(base) = str_arg(symbol) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    if pfn.is_null() || flags > 2 || version > DRIVER_VERSION {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (f, st) = lookup(base, version, flags);
    put(pfn, f);
    put(status, st);
    CUDA_SUCCESS
}

pub extern "C" fn cu_get_proc_address_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    get_proc_address(symbol, pfn, version, flags, status)
}

pub extern "C" fn cu_get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
}
