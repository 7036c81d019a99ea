//! The real HIP runtime and ROCm SMI entry points (resolved like the CUDA ones, by
//! [`crate::real`], from `libamdhip64.so*` / `librocm_smi64.so*` already in the process).

#![allow(clippy::type_complexity)]

use super::{AllocPropHead, Handle, Lib, MemHandle, Raw, Sym};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

pub type HipError = c_int;
pub type RsmiStatus = c_int;
pub type AmdsmiStatus = c_uint;
pub const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
pub const HIP_ERROR_NOT_INITIALIZED: HipError = 3;
// crate::real::real_or_3! returns CUDA's value from the HIP wrappers too.
const _: () = assert!(HIP_ERROR_NOT_INITIALIZED == super::CUDA_ERROR_NOT_INITIALIZED);
pub const RSMI_STATUS_INIT_ERROR: RsmiStatus = 8;
pub const RSMI_MEM_TYPE_VRAM: c_int = 0;
pub const AMDSMI_STATUS_INIT_ERROR: AmdsmiStatus = 18;
pub const AMDSMI_MEM_TYPE_VRAM: c_int = 0;

/// `amdsmi_vram_usage_t` (MB).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct VramUsage {
    pub vram_total: u32,
    pub vram_used: u32,
    pub reserved: [u32; 2],
}

/// `dim3` (passed by value to `hipLaunchKernel` and `hipExtLaunchKernel`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Dim3 {
    pub x: c_uint,
    pub y: c_uint,
    pub z: c_uint,
}

/// `hipChannelFormatDesc`: bits per channel x, y, z, w and the kind.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ChannelFormatDesc {
    pub x: c_int,
    pub y: c_int,
    pub z: c_int,
    pub w: c_int,
    pub kind: c_int,
}

type P = *mut *mut c_void;

macro_rules! hip_syms {
    ($( $id:ident $lib:ident $name:literal : fn($($a:ty),*) -> $r:ty ; )*) => {
        $( pub static $id: Sym<unsafe extern "C" fn($($a),*) -> $r> = Sym::new(Lib::$lib, $name); )*
        /// Every HIP and SMI entry point (resolved with the library, crate::real::resolve).
        pub static ALL: &[&Raw] = &[$( &$id.raw ),*];
    };
}

hip_syms! {
    HIP_GET_PROC_ADDRESS Hip c"hipGetProcAddress":
        fn(*const c_char, P, c_int, u64, *mut c_int) -> HipError;
    HIP_MALLOC Hip c"hipMalloc": fn(P, usize) -> HipError;
    HIP_EXT_MALLOC_WITH_FLAGS Hip c"hipExtMallocWithFlags": fn(P, usize, c_uint) -> HipError;
    HIP_MALLOC_MANAGED Hip c"hipMallocManaged": fn(P, usize, c_uint) -> HipError;
    HIP_MALLOC_PITCH Hip c"hipMallocPitch": fn(P, *mut usize, usize, usize) -> HipError;
    HIP_FREE Hip c"hipFree": fn(*mut c_void) -> HipError;
    HIP_MALLOC_ASYNC Hip c"hipMallocAsync": fn(P, usize, Handle) -> HipError;
    HIP_MALLOC_FROM_POOL_ASYNC Hip c"hipMallocFromPoolAsync":
        fn(P, usize, Handle, Handle) -> HipError;
    HIP_FREE_ASYNC Hip c"hipFreeAsync": fn(*mut c_void, Handle) -> HipError;
    HIP_MEM_CREATE Hip c"hipMemCreate":
        fn(*mut MemHandle, usize, *const AllocPropHead, c_ulonglong) -> HipError;
    HIP_MEM_RELEASE Hip c"hipMemRelease": fn(MemHandle) -> HipError;
    HIP_MEM_MAP Hip c"hipMemMap":
        fn(*mut c_void, usize, usize, MemHandle, c_ulonglong) -> HipError;
    HIP_MEM_UNMAP Hip c"hipMemUnmap": fn(*mut c_void, usize) -> HipError;
    HIP_MALLOC_ARRAY Hip c"hipMallocArray":
        fn(*mut Handle, *const ChannelFormatDesc, usize, usize, c_uint) -> HipError;
    HIP_FREE_ARRAY Hip c"hipFreeArray": fn(Handle) -> HipError;
    HIP_MEM_GET_INFO Hip c"hipMemGetInfo": fn(*mut usize, *mut usize) -> HipError;
    HIP_DEVICE_TOTAL_MEM Hip c"hipDeviceTotalMem": fn(*mut usize, c_int) -> HipError;
    // Helpers, never wrapped.
    HIP_GET_DEVICE Hip c"hipGetDevice": fn(*mut c_int) -> HipError;
    HIP_DEVICE_GET_UUID Hip c"hipDeviceGetUuid": fn(*mut [u8; 16], c_int) -> HipError;
    // Launches (compute shares, crate::hip::launch); `_spt` = per-thread default stream.
    HIP_LAUNCH_KERNEL Hip c"hipLaunchKernel":
        fn(*const c_void, Dim3, Dim3, P, usize, Handle) -> HipError;
    HIP_LAUNCH_KERNEL_SPT Hip c"hipLaunchKernel_spt":
        fn(*const c_void, Dim3, Dim3, P, usize, Handle) -> HipError;
    HIP_EXT_LAUNCH_KERNEL Hip c"hipExtLaunchKernel":
        fn(*const c_void, Dim3, Dim3, P, usize, Handle, Handle, Handle, c_int) -> HipError;
    HIP_MODULE_LAUNCH_KERNEL Hip c"hipModuleLaunchKernel": fn(Handle, c_uint, c_uint, c_uint,
        c_uint, c_uint, c_uint, c_uint, Handle, P, P) -> HipError;
    HIP_GRAPH_LAUNCH Hip c"hipGraphLaunch": fn(Handle, Handle) -> HipError;
    HIP_GRAPH_LAUNCH_SPT Hip c"hipGraphLaunch_spt": fn(Handle, Handle) -> HipError;
    // The launch gate's helpers (crate::gate::driver), never wrapped.
    HIP_SET_DEVICE Hip c"hipSetDevice": fn(c_int) -> HipError;
    HIP_EVENT_CREATE_WITH_FLAGS Hip c"hipEventCreateWithFlags": fn(*mut Handle, c_uint) -> HipError;
    HIP_EVENT_DESTROY Hip c"hipEventDestroy": fn(Handle) -> HipError;
    HIP_EVENT_RECORD Hip c"hipEventRecord": fn(Handle, Handle) -> HipError;
    HIP_EVENT_QUERY Hip c"hipEventQuery": fn(Handle) -> HipError;
    HIP_EVENT_SYNCHRONIZE Hip c"hipEventSynchronize": fn(Handle) -> HipError;
    HIP_EVENT_ELAPSED_TIME Hip c"hipEventElapsedTime": fn(*mut f32, Handle, Handle) -> HipError;
    HIP_STREAM_IS_CAPTURING Hip c"hipStreamIsCapturing": fn(Handle, *mut c_int) -> HipError;
    HIP_STREAM_QUERY Hip c"hipStreamQuery": fn(Handle) -> HipError;
    HIP_THREAD_EXCHANGE_STREAM_CAPTURE_MODE Hip c"hipThreadExchangeStreamCaptureMode":
        fn(*mut c_int) -> HipError;

    RSMI_DEV_MEMORY_TOTAL_GET RocmSmi c"rsmi_dev_memory_total_get":
        fn(u32, c_int, *mut u64) -> RsmiStatus;
    RSMI_DEV_MEMORY_USAGE_GET RocmSmi c"rsmi_dev_memory_usage_get":
        fn(u32, c_int, *mut u64) -> RsmiStatus;
    RSMI_DEV_UNIQUE_ID_GET RocmSmi c"rsmi_dev_unique_id_get": fn(u32, *mut u64) -> RsmiStatus;

    AMDSMI_GET_GPU_MEMORY_TOTAL AmdSmi c"amdsmi_get_gpu_memory_total":
        fn(Handle, c_int, *mut u64) -> AmdsmiStatus;
    AMDSMI_GET_GPU_MEMORY_USAGE AmdSmi c"amdsmi_get_gpu_memory_usage":
        fn(Handle, c_int, *mut u64) -> AmdsmiStatus;
    AMDSMI_GET_GPU_VRAM_USAGE AmdSmi c"amdsmi_get_gpu_vram_usage":
        fn(Handle, *mut VramUsage) -> AmdsmiStatus;
    // Helpers, never wrapped.
    AMDSMI_GET_GPU_DEVICE_UUID AmdSmi c"amdsmi_get_gpu_device_uuid":
        fn(Handle, *mut c_uint, *mut c_char) -> AmdsmiStatus;
    AMDSMI_GET_SOCKET_HANDLES AmdSmi c"amdsmi_get_socket_handles":
        fn(*mut u32, *mut Handle) -> AmdsmiStatus;
    AMDSMI_GET_PROCESSOR_HANDLES AmdSmi c"amdsmi_get_processor_handles":
        fn(Handle, *mut u32, *mut Handle) -> AmdsmiStatus;
}
