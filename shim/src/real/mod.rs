//! The real driver entry points, resolved with the real `dlsym` on a handle of the real
//! library (`dlopen(name, RTLD_NOW | RTLD_NOLOAD)`), never through our own exports.
//!
//! Resolution is lock-free and idempotent: any thread that finds a pointer missing resolves
//! the whole library again and stores what it finds (racing stores store the same values).
//! It takes no lock of ours, so it can run inside a `dlsym` or `dlopen` of the program.

#![allow(clippy::type_complexity)]

pub mod dl;
pub mod hip;
mod types;

pub use types::*;

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::marker::PhantomData;

use crate::registered::Registered;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Acquire, Ordering::Release};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
/// CUcontext, CUstream, CUarray, CUmemoryPool, CUmipmappedArray: opaque pointers.
pub type Handle = *mut c_void;
/// CUmemGenericAllocationHandle.
pub type MemHandle = c_ulonglong;
pub type NvmlReturn = c_int;
pub type NvmlDevice = *mut c_void;

pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    Cuda = 0,
    Nvml = 1,
    /// AMD's HIP runtime and ROCm SMI (crate::hip).
    Hip = 2,
    RocmSmi = 3,
    /// AMD SMI (`libamd_smi`, used by `amd-smi`; crate::hip::amdsmi).
    AmdSmi = 4,
}

/// The names each library is looked up by (RTLD_NOLOAD), first one also loaded by.
const LIB_NAMES: [&[&CStr]; 5] = [
    &[c"libcuda.so.1"],
    &[c"libnvidia-ml.so.1"],
    &[
        c"libamdhip64.so",
        c"libamdhip64.so.7",
        c"libamdhip64.so.6",
        c"libamdhip64.so.5",
    ],
    &[
        c"librocm_smi64.so",
        c"librocm_smi64.so.7",
        c"librocm_smi64.so.6",
        c"librocm_smi64.so.5",
    ],
    &[
        c"libamd_smi.so",
        c"libamd_smi.so.26",
        c"libamd_smi.so.25",
        c"libamd_smi.so.24",
    ],
];

/// Library handles (0 = not found yet).
static HANDLES: [AtomicUsize; 5] = [const { AtomicUsize::new(0) }; 5];
/// Whether every entry point of a library has been looked up in its loaded handle: an entry
/// point still unresolved then is missing from this driver, and is not looked up again on
/// every use (a failing `dlsym` costs microseconds: it formats an error message).
static RESOLVED: [AtomicBool; 5] = [const { AtomicBool::new(false) }; 5];

/// One entry point: its name, library and resolved address (0 = unresolved).
pub struct Raw {
    pub name: &'static CStr,
    pub lib: Lib,
    ptr: AtomicUsize,
    /// Where to call it when that is not `ptr`: the trampoline of an inline hook
    /// (crate::hook), whose entry point now leads to our wrapper. 0 = call `ptr`.
    code: AtomicUsize,
}

impl Raw {
    /// The address if resolved, without trying to resolve.
    pub fn loaded(&self) -> usize {
        self.ptr.load(Acquire)
    }

    /// The address, resolving the library on first need; 0 if unavailable.
    pub fn addr(&self) -> usize {
        match self.loaded() {
            0 if !RESOLVED[self.lib as usize].load(Acquire) => {
                resolve(self.lib, false);
                self.loaded()
            }
            p => p,
        }
    }

    /// The address to *call* (resolving on first need): the trampoline if the entry point
    /// is hooked, else the entry point itself; 0 if unavailable.
    pub fn callable(&self) -> usize {
        match self.addr() {
            0 => 0,
            p => match self.code.load(Acquire) {
                0 => p,
                c => c,
            },
        }
    }

    /// Calls go to `code` from now on (crate::hook).
    pub fn set_code(&self, code: usize) {
        self.code.store(code, Release);
    }
}

/// A typed entry point.
pub struct Sym<F> {
    pub raw: Raw,
    _f: PhantomData<F>,
}

impl<F: Copy> Sym<F> {
    pub(crate) const fn new(lib: Lib, name: &'static CStr) -> Self {
        Sym {
            raw: Raw {
                name,
                lib,
                ptr: AtomicUsize::new(0),
                code: AtomicUsize::new(0),
            },
            _f: PhantomData,
        }
    }

    /// The function, resolving on first need.
    pub fn get(&self) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<usize>()) };
        match self.raw.callable() {
            0 => None,
            // SAFETY: F is the `unsafe extern "C" fn` type of this entry point as the driver
            // documents it (see the table below), and the address came from the real dlsym
            // for exactly this name (or is its hook's trampoline, which behaves as the
            // original); both are pointer-sized (checked above).
            p => Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) }),
        }
    }

    /// The function, loading the library if the program has not (an exported wrapper was
    /// called directly, so the program expects the driver).
    pub fn load(&self) -> Option<F> {
        self.get().or_else(|| {
            resolve(self.raw.lib, true);
            self.get()
        })
    }
}

macro_rules! syms {
    ($( $id:ident $lib:ident $name:literal : fn($($a:ty),*) -> $r:ty ; )*) => {
        $( pub static $id: Sym<unsafe extern "C" fn($($a),*) -> $r> = Sym::new(Lib::$lib, $name); )*
        static ALL: &[&Raw] = &[$( &$id.raw ),*];
    };
}

syms! {
    CU_GET_PROC_ADDRESS Cuda c"cuGetProcAddress":
        fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
    CU_GET_PROC_ADDRESS_V2 Cuda c"cuGetProcAddress_v2":
        fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
    CU_MEM_ALLOC Cuda c"cuMemAlloc_v2": fn(*mut CUdeviceptr, usize) -> CUresult;
    CU_MEM_ALLOC_PITCH Cuda c"cuMemAllocPitch_v2":
        fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
    CU_MEM_ALLOC_MANAGED Cuda c"cuMemAllocManaged": fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
    CU_MEM_ALLOC_ASYNC Cuda c"cuMemAllocAsync": fn(*mut CUdeviceptr, usize, Handle) -> CUresult;
    CU_MEM_ALLOC_ASYNC_PTSZ Cuda c"cuMemAllocAsync_ptsz":
        fn(*mut CUdeviceptr, usize, Handle) -> CUresult;
    CU_MEM_ALLOC_FROM_POOL_ASYNC Cuda c"cuMemAllocFromPoolAsync":
        fn(*mut CUdeviceptr, usize, Handle, Handle) -> CUresult;
    CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ Cuda c"cuMemAllocFromPoolAsync_ptsz":
        fn(*mut CUdeviceptr, usize, Handle, Handle) -> CUresult;
    CU_MEM_FREE Cuda c"cuMemFree_v2": fn(CUdeviceptr) -> CUresult;
    CU_MEM_FREE_ASYNC Cuda c"cuMemFreeAsync": fn(CUdeviceptr, Handle) -> CUresult;
    CU_MEM_FREE_ASYNC_PTSZ Cuda c"cuMemFreeAsync_ptsz": fn(CUdeviceptr, Handle) -> CUresult;
    CU_MEM_POOL_CREATE Cuda c"cuMemPoolCreate": fn(*mut Handle, *const PoolPropsHead) -> CUresult;
    CU_MEM_POOL_DESTROY Cuda c"cuMemPoolDestroy": fn(Handle) -> CUresult;
    CU_MEM_POOL_TRIM_TO Cuda c"cuMemPoolTrimTo": fn(Handle, usize) -> CUresult;
    CU_MEM_CREATE Cuda c"cuMemCreate":
        fn(*mut MemHandle, usize, *const AllocPropHead, c_ulonglong) -> CUresult;
    CU_MEM_RELEASE Cuda c"cuMemRelease": fn(MemHandle) -> CUresult;
    CU_MEM_MAP Cuda c"cuMemMap":
        fn(CUdeviceptr, usize, usize, MemHandle, c_ulonglong) -> CUresult;
    CU_MEM_UNMAP Cuda c"cuMemUnmap": fn(CUdeviceptr, usize) -> CUresult;
    CU_IPC_GET_MEM_HANDLE Cuda c"cuIpcGetMemHandle": fn(*mut c_void, CUdeviceptr) -> CUresult;
    CU_MEM_RETAIN_ALLOCATION_HANDLE Cuda c"cuMemRetainAllocationHandle":
        fn(*mut MemHandle, *mut c_void) -> CUresult;
    CU_ARRAY_CREATE Cuda c"cuArrayCreate_v2": fn(*mut Handle, *const ArrayDescriptor) -> CUresult;
    CU_ARRAY3D_CREATE Cuda c"cuArray3DCreate_v2":
        fn(*mut Handle, *const Array3dDescriptor) -> CUresult;
    CU_MIPMAPPED_ARRAY_CREATE Cuda c"cuMipmappedArrayCreate":
        fn(*mut Handle, *const Array3dDescriptor, c_uint) -> CUresult;
    CU_ARRAY_DESTROY Cuda c"cuArrayDestroy": fn(Handle) -> CUresult;
    CU_MIPMAPPED_ARRAY_DESTROY Cuda c"cuMipmappedArrayDestroy": fn(Handle) -> CUresult;
    CU_MEM_GET_INFO Cuda c"cuMemGetInfo_v2": fn(*mut usize, *mut usize) -> CUresult;
    CU_DEVICE_TOTAL_MEM Cuda c"cuDeviceTotalMem_v2": fn(*mut usize, CUdevice) -> CUresult;
    CU_DEVICE_PRIMARY_CTX_RETAIN Cuda c"cuDevicePrimaryCtxRetain":
        fn(*mut Handle, CUdevice) -> CUresult;
    CU_DEVICE_PRIMARY_CTX_RELEASE Cuda c"cuDevicePrimaryCtxRelease_v2": fn(CUdevice) -> CUresult;
    CU_DEVICE_PRIMARY_CTX_RESET Cuda c"cuDevicePrimaryCtxReset_v2": fn(CUdevice) -> CUresult;
    // Launches (compute shares, crate::cuda::launch); `_ptsz` variants are separate entries.
    CU_LAUNCH_KERNEL Cuda c"cuLaunchKernel": fn(Handle, c_uint, c_uint, c_uint, c_uint, c_uint,
        c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    CU_LAUNCH_KERNEL_PTSZ Cuda c"cuLaunchKernel_ptsz": fn(Handle, c_uint, c_uint, c_uint, c_uint,
        c_uint, c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    CU_LAUNCH_KERNEL_EX Cuda c"cuLaunchKernelEx":
        fn(*const LaunchConfigHead, Handle, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    CU_LAUNCH_KERNEL_EX_PTSZ Cuda c"cuLaunchKernelEx_ptsz":
        fn(*const LaunchConfigHead, Handle, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    CU_LAUNCH_COOPERATIVE_KERNEL Cuda c"cuLaunchCooperativeKernel": fn(Handle, c_uint, c_uint,
        c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void) -> CUresult;
    CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ Cuda c"cuLaunchCooperativeKernel_ptsz": fn(Handle, c_uint,
        c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void) -> CUresult;
    CU_GRAPH_LAUNCH Cuda c"cuGraphLaunch": fn(Handle, Handle) -> CUresult;
    CU_GRAPH_LAUNCH_PTSZ Cuda c"cuGraphLaunch_ptsz": fn(Handle, Handle) -> CUresult;
    // Helpers, never wrapped.
    CU_CTX_GET_DEVICE Cuda c"cuCtxGetDevice": fn(*mut CUdevice) -> CUresult;
    CU_DEVICE_GET_UUID_V2 Cuda c"cuDeviceGetUuid_v2": fn(*mut [u8; 16], CUdevice) -> CUresult;
    CU_DEVICE_GET_UUID Cuda c"cuDeviceGetUuid": fn(*mut [u8; 16], CUdevice) -> CUresult;
    CU_DEVICE_GET_MEM_POOL Cuda c"cuDeviceGetMemPool": fn(*mut Handle, CUdevice) -> CUresult;
    CU_DEVICE_GET_DEFAULT_MEM_POOL Cuda c"cuDeviceGetDefaultMemPool":
        fn(*mut Handle, CUdevice) -> CUresult;
    // The launch gate's helpers (crate::gate), never wrapped.
    CU_CTX_GET_CURRENT Cuda c"cuCtxGetCurrent": fn(*mut Handle) -> CUresult;
    CU_CTX_SET_CURRENT Cuda c"cuCtxSetCurrent": fn(Handle) -> CUresult;
    CU_EVENT_CREATE Cuda c"cuEventCreate": fn(*mut Handle, c_uint) -> CUresult;
    CU_EVENT_DESTROY Cuda c"cuEventDestroy_v2": fn(Handle) -> CUresult;
    CU_EVENT_RECORD Cuda c"cuEventRecord": fn(Handle, Handle) -> CUresult;
    CU_EVENT_QUERY Cuda c"cuEventQuery": fn(Handle) -> CUresult;
    CU_EVENT_SYNCHRONIZE Cuda c"cuEventSynchronize": fn(Handle) -> CUresult;
    CU_EVENT_ELAPSED_TIME Cuda c"cuEventElapsedTime": fn(*mut f32, Handle, Handle) -> CUresult;
    CU_EVENT_ELAPSED_TIME_V2 Cuda c"cuEventElapsedTime_v2":
        fn(*mut f32, Handle, Handle) -> CUresult;
    CU_STREAM_IS_CAPTURING Cuda c"cuStreamIsCapturing": fn(Handle, *mut c_int) -> CUresult;
    CU_STREAM_QUERY Cuda c"cuStreamQuery": fn(Handle) -> CUresult;
    CU_THREAD_EXCHANGE_STREAM_CAPTURE_MODE Cuda c"cuThreadExchangeStreamCaptureMode":
        fn(*mut c_int) -> CUresult;

    // Parking's helpers (crate::park), never wrapped.
    CU_MEM_ADDRESS_RESERVE Cuda c"cuMemAddressReserve":
        fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong) -> CUresult;
    CU_MEM_ADDRESS_FREE Cuda c"cuMemAddressFree": fn(CUdeviceptr, usize) -> CUresult;
    CU_MEM_SET_ACCESS Cuda c"cuMemSetAccess":
        fn(CUdeviceptr, usize, *const AccessDesc, usize) -> CUresult;
    CU_DEVICE_CAN_ACCESS_PEER Cuda c"cuDeviceCanAccessPeer":
        fn(*mut c_int, CUdevice, CUdevice) -> CUresult;
    CU_MEM_GET_ALLOCATION_GRANULARITY Cuda c"cuMemGetAllocationGranularity":
        fn(*mut usize, *const AllocProp, c_int) -> CUresult;
    CU_MEM_HOST_ALLOC Cuda c"cuMemHostAlloc": fn(*mut *mut c_void, usize, c_uint) -> CUresult;
    CU_MEM_FREE_HOST Cuda c"cuMemFreeHost": fn(*mut c_void) -> CUresult;
    CU_MEM_HOST_REGISTER Cuda c"cuMemHostRegister_v2": fn(*mut c_void, usize, c_uint) -> CUresult;
    CU_MEM_HOST_UNREGISTER Cuda c"cuMemHostUnregister": fn(*mut c_void) -> CUresult;
    CU_STREAM_CREATE Cuda c"cuStreamCreate": fn(*mut Handle, c_uint) -> CUresult;
    CU_STREAM_DESTROY Cuda c"cuStreamDestroy_v2": fn(Handle) -> CUresult;
    CU_STREAM_SYNCHRONIZE Cuda c"cuStreamSynchronize": fn(Handle) -> CUresult;
    CU_CTX_SYNCHRONIZE Cuda c"cuCtxSynchronize": fn() -> CUresult;
    CU_CTX_PUSH_CURRENT Cuda c"cuCtxPushCurrent_v2": fn(Handle) -> CUresult;
    CU_CTX_POP_CURRENT Cuda c"cuCtxPopCurrent_v2": fn(*mut Handle) -> CUresult;
    // Copies and sets: a parkable process's copies wait while it is parked (crate::park).
    CU_MEMCPY Cuda c"cuMemcpy": fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult;
    CU_MEMCPY_PTDS Cuda c"cuMemcpy_ptds": fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult;
    CU_MEMCPY_ASYNC Cuda c"cuMemcpyAsync": fn(CUdeviceptr, CUdeviceptr, usize, Handle) -> CUresult;
    CU_MEMCPY_ASYNC_PTSZ Cuda c"cuMemcpyAsync_ptsz":
        fn(CUdeviceptr, CUdeviceptr, usize, Handle) -> CUresult;
    CU_MEMCPY_HTOD Cuda c"cuMemcpyHtoD_v2": fn(CUdeviceptr, *const c_void, usize) -> CUresult;
    CU_MEMCPY_HTOD_PTDS Cuda c"cuMemcpyHtoD_v2_ptds":
        fn(CUdeviceptr, *const c_void, usize) -> CUresult;
    CU_MEMCPY_HTOD_ASYNC Cuda c"cuMemcpyHtoDAsync_v2":
        fn(CUdeviceptr, *const c_void, usize, Handle) -> CUresult;
    CU_MEMCPY_HTOD_ASYNC_PTSZ Cuda c"cuMemcpyHtoDAsync_v2_ptsz":
        fn(CUdeviceptr, *const c_void, usize, Handle) -> CUresult;
    CU_MEMCPY_DTOH Cuda c"cuMemcpyDtoH_v2": fn(*mut c_void, CUdeviceptr, usize) -> CUresult;
    CU_MEMCPY_DTOH_PTDS Cuda c"cuMemcpyDtoH_v2_ptds":
        fn(*mut c_void, CUdeviceptr, usize) -> CUresult;
    CU_MEMCPY_DTOH_ASYNC Cuda c"cuMemcpyDtoHAsync_v2":
        fn(*mut c_void, CUdeviceptr, usize, Handle) -> CUresult;
    CU_MEMCPY_DTOH_ASYNC_PTSZ Cuda c"cuMemcpyDtoHAsync_v2_ptsz":
        fn(*mut c_void, CUdeviceptr, usize, Handle) -> CUresult;
    CU_MEMCPY_DTOD Cuda c"cuMemcpyDtoD_v2": fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult;
    CU_MEMCPY_DTOD_PTDS Cuda c"cuMemcpyDtoD_v2_ptds":
        fn(CUdeviceptr, CUdeviceptr, usize) -> CUresult;
    CU_MEMCPY_DTOD_ASYNC Cuda c"cuMemcpyDtoDAsync_v2":
        fn(CUdeviceptr, CUdeviceptr, usize, Handle) -> CUresult;
    CU_MEMCPY_DTOD_ASYNC_PTSZ Cuda c"cuMemcpyDtoDAsync_v2_ptsz":
        fn(CUdeviceptr, CUdeviceptr, usize, Handle) -> CUresult;
    CU_MEMCPY_2D Cuda c"cuMemcpy2D_v2": fn(*const c_void) -> CUresult;
    CU_MEMCPY_2D_PTDS Cuda c"cuMemcpy2D_v2_ptds": fn(*const c_void) -> CUresult;
    CU_MEMCPY_2D_UNALIGNED Cuda c"cuMemcpy2DUnaligned_v2": fn(*const c_void) -> CUresult;
    CU_MEMCPY_2D_UNALIGNED_PTDS Cuda c"cuMemcpy2DUnaligned_v2_ptds": fn(*const c_void) -> CUresult;
    CU_MEMCPY_2D_ASYNC Cuda c"cuMemcpy2DAsync_v2": fn(*const c_void, Handle) -> CUresult;
    CU_MEMCPY_2D_ASYNC_PTSZ Cuda c"cuMemcpy2DAsync_v2_ptsz": fn(*const c_void, Handle) -> CUresult;
    CU_MEMCPY_3D Cuda c"cuMemcpy3D_v2": fn(*const c_void) -> CUresult;
    CU_MEMCPY_3D_PTDS Cuda c"cuMemcpy3D_v2_ptds": fn(*const c_void) -> CUresult;
    CU_MEMCPY_3D_ASYNC Cuda c"cuMemcpy3DAsync_v2": fn(*const c_void, Handle) -> CUresult;
    CU_MEMCPY_3D_ASYNC_PTSZ Cuda c"cuMemcpy3DAsync_v2_ptsz": fn(*const c_void, Handle) -> CUresult;
    CU_MEMCPY_PEER Cuda c"cuMemcpyPeer":
        fn(CUdeviceptr, Handle, CUdeviceptr, Handle, usize) -> CUresult;
    CU_MEMCPY_PEER_PTDS Cuda c"cuMemcpyPeer_ptds":
        fn(CUdeviceptr, Handle, CUdeviceptr, Handle, usize) -> CUresult;
    CU_MEMCPY_PEER_ASYNC Cuda c"cuMemcpyPeerAsync":
        fn(CUdeviceptr, Handle, CUdeviceptr, Handle, usize, Handle) -> CUresult;
    CU_MEMCPY_PEER_ASYNC_PTSZ Cuda c"cuMemcpyPeerAsync_ptsz":
        fn(CUdeviceptr, Handle, CUdeviceptr, Handle, usize, Handle) -> CUresult;
    CU_MEMSET_D8 Cuda c"cuMemsetD8_v2": fn(CUdeviceptr, u8, usize) -> CUresult;
    CU_MEMSET_D8_PTDS Cuda c"cuMemsetD8_v2_ptds": fn(CUdeviceptr, u8, usize) -> CUresult;
    CU_MEMSET_D16 Cuda c"cuMemsetD16_v2": fn(CUdeviceptr, u16, usize) -> CUresult;
    CU_MEMSET_D16_PTDS Cuda c"cuMemsetD16_v2_ptds": fn(CUdeviceptr, u16, usize) -> CUresult;
    CU_MEMSET_D32 Cuda c"cuMemsetD32_v2": fn(CUdeviceptr, c_uint, usize) -> CUresult;
    CU_MEMSET_D32_PTDS Cuda c"cuMemsetD32_v2_ptds": fn(CUdeviceptr, c_uint, usize) -> CUresult;
    CU_MEMSET_D8_ASYNC Cuda c"cuMemsetD8Async": fn(CUdeviceptr, u8, usize, Handle) -> CUresult;
    CU_MEMSET_D8_ASYNC_PTSZ Cuda c"cuMemsetD8Async_ptsz":
        fn(CUdeviceptr, u8, usize, Handle) -> CUresult;
    CU_MEMSET_D16_ASYNC Cuda c"cuMemsetD16Async": fn(CUdeviceptr, u16, usize, Handle) -> CUresult;
    CU_MEMSET_D16_ASYNC_PTSZ Cuda c"cuMemsetD16Async_ptsz":
        fn(CUdeviceptr, u16, usize, Handle) -> CUresult;
    CU_MEMSET_D32_ASYNC Cuda c"cuMemsetD32Async":
        fn(CUdeviceptr, c_uint, usize, Handle) -> CUresult;
    CU_MEMSET_D32_ASYNC_PTSZ Cuda c"cuMemsetD32Async_ptsz":
        fn(CUdeviceptr, c_uint, usize, Handle) -> CUresult;
    CU_MEMSET_D2D8 Cuda c"cuMemsetD2D8_v2": fn(CUdeviceptr, usize, u8, usize, usize) -> CUresult;
    CU_MEMSET_D2D8_PTDS Cuda c"cuMemsetD2D8_v2_ptds":
        fn(CUdeviceptr, usize, u8, usize, usize) -> CUresult;
    CU_MEMSET_D2D16 Cuda c"cuMemsetD2D16_v2": fn(CUdeviceptr, usize, u16, usize, usize) -> CUresult;
    CU_MEMSET_D2D16_PTDS Cuda c"cuMemsetD2D16_v2_ptds":
        fn(CUdeviceptr, usize, u16, usize, usize) -> CUresult;
    CU_MEMSET_D2D32 Cuda c"cuMemsetD2D32_v2":
        fn(CUdeviceptr, usize, c_uint, usize, usize) -> CUresult;
    CU_MEMSET_D2D32_PTDS Cuda c"cuMemsetD2D32_v2_ptds":
        fn(CUdeviceptr, usize, c_uint, usize, usize) -> CUresult;
    CU_MEMSET_D2D8_ASYNC Cuda c"cuMemsetD2D8Async":
        fn(CUdeviceptr, usize, u8, usize, usize, Handle) -> CUresult;
    CU_MEMSET_D2D8_ASYNC_PTSZ Cuda c"cuMemsetD2D8Async_ptsz":
        fn(CUdeviceptr, usize, u8, usize, usize, Handle) -> CUresult;
    CU_MEMSET_D2D16_ASYNC Cuda c"cuMemsetD2D16Async":
        fn(CUdeviceptr, usize, u16, usize, usize, Handle) -> CUresult;
    CU_MEMSET_D2D16_ASYNC_PTSZ Cuda c"cuMemsetD2D16Async_ptsz":
        fn(CUdeviceptr, usize, u16, usize, usize, Handle) -> CUresult;
    CU_MEMSET_D2D32_ASYNC Cuda c"cuMemsetD2D32Async":
        fn(CUdeviceptr, usize, c_uint, usize, usize, Handle) -> CUresult;
    CU_MEMSET_D2D32_ASYNC_PTSZ Cuda c"cuMemsetD2D32Async_ptsz":
        fn(CUdeviceptr, usize, c_uint, usize, usize, Handle) -> CUresult;
    CU_MEMCPY_3D_PEER Cuda c"cuMemcpy3DPeer": fn(*const c_void) -> CUresult;
    CU_MEMCPY_3D_PEER_PTDS Cuda c"cuMemcpy3DPeer_ptds": fn(*const c_void) -> CUresult;
    CU_MEMCPY_3D_PEER_ASYNC Cuda c"cuMemcpy3DPeerAsync": fn(*const c_void, Handle) -> CUresult;
    CU_MEMCPY_3D_PEER_ASYNC_PTSZ Cuda c"cuMemcpy3DPeerAsync_ptsz":
        fn(*const c_void, Handle) -> CUresult;
    // The batched copies: CUDA 12.8's (with `failIdx`), and CUDA 13.0's `_v2` (without).
    CU_MEMCPY_BATCH_ASYNC Cuda c"cuMemcpyBatchAsync": fn(
        *const CUdeviceptr, *const CUdeviceptr, *const usize, usize,
        *const c_void, *const usize, usize, *mut usize, Handle) -> CUresult;
    CU_MEMCPY_BATCH_ASYNC_PTSZ Cuda c"cuMemcpyBatchAsync_ptsz": fn(
        *const CUdeviceptr, *const CUdeviceptr, *const usize, usize,
        *const c_void, *const usize, usize, *mut usize, Handle) -> CUresult;
    CU_MEMCPY_BATCH_ASYNC_V2 Cuda c"cuMemcpyBatchAsync_v2": fn(
        *const CUdeviceptr, *const CUdeviceptr, *const usize, usize,
        *const c_void, *const usize, usize, Handle) -> CUresult;
    CU_MEMCPY_BATCH_ASYNC_V2_PTSZ Cuda c"cuMemcpyBatchAsync_v2_ptsz": fn(
        *const CUdeviceptr, *const CUdeviceptr, *const usize, usize,
        *const c_void, *const usize, usize, Handle) -> CUresult;
    CU_MEMCPY_3D_BATCH_ASYNC Cuda c"cuMemcpy3DBatchAsync":
        fn(usize, *const c_void, *mut usize, c_ulonglong, Handle) -> CUresult;
    CU_MEMCPY_3D_BATCH_ASYNC_PTSZ Cuda c"cuMemcpy3DBatchAsync_ptsz":
        fn(usize, *const c_void, *mut usize, c_ulonglong, Handle) -> CUresult;
    CU_MEMCPY_3D_BATCH_ASYNC_V2 Cuda c"cuMemcpy3DBatchAsync_v2":
        fn(usize, *const c_void, c_ulonglong, Handle) -> CUresult;
    CU_MEMCPY_3D_BATCH_ASYNC_V2_PTSZ Cuda c"cuMemcpy3DBatchAsync_v2_ptsz":
        fn(usize, *const c_void, c_ulonglong, Handle) -> CUresult;
    // Stream memory operations: the GPU reads or writes device memory at an address.
    CU_STREAM_WAIT_VALUE32 Cuda c"cuStreamWaitValue32":
        fn(Handle, CUdeviceptr, u32, c_uint) -> CUresult;
    CU_STREAM_WAIT_VALUE32_PTSZ Cuda c"cuStreamWaitValue32_ptsz":
        fn(Handle, CUdeviceptr, u32, c_uint) -> CUresult;
    CU_STREAM_WAIT_VALUE32_V2 Cuda c"cuStreamWaitValue32_v2":
        fn(Handle, CUdeviceptr, u32, c_uint) -> CUresult;
    CU_STREAM_WAIT_VALUE32_V2_PTSZ Cuda c"cuStreamWaitValue32_v2_ptsz":
        fn(Handle, CUdeviceptr, u32, c_uint) -> CUresult;
    CU_STREAM_WAIT_VALUE64 Cuda c"cuStreamWaitValue64":
        fn(Handle, CUdeviceptr, u64, c_uint) -> CUresult;
    CU_STREAM_WAIT_VALUE64_PTSZ Cuda c"cuStreamWaitValue64_ptsz":
        fn(Handle, CUdeviceptr, u64, c_uint) -> CUresult;
    CU_STREAM_WAIT_VALUE64_V2 Cuda c"cuStreamWaitValue64_v2":
        fn(Handle, CUdeviceptr, u64, c_uint) -> CUresult;
    CU_STREAM_WAIT_VALUE64_V2_PTSZ Cuda c"cuStreamWaitValue64_v2_ptsz":
        fn(Handle, CUdeviceptr, u64, c_uint) -> CUresult;
    CU_STREAM_WRITE_VALUE32 Cuda c"cuStreamWriteValue32":
        fn(Handle, CUdeviceptr, u32, c_uint) -> CUresult;
    CU_STREAM_WRITE_VALUE32_PTSZ Cuda c"cuStreamWriteValue32_ptsz":
        fn(Handle, CUdeviceptr, u32, c_uint) -> CUresult;
    CU_STREAM_WRITE_VALUE32_V2 Cuda c"cuStreamWriteValue32_v2":
        fn(Handle, CUdeviceptr, u32, c_uint) -> CUresult;
    CU_STREAM_WRITE_VALUE32_V2_PTSZ Cuda c"cuStreamWriteValue32_v2_ptsz":
        fn(Handle, CUdeviceptr, u32, c_uint) -> CUresult;
    CU_STREAM_WRITE_VALUE64 Cuda c"cuStreamWriteValue64":
        fn(Handle, CUdeviceptr, u64, c_uint) -> CUresult;
    CU_STREAM_WRITE_VALUE64_PTSZ Cuda c"cuStreamWriteValue64_ptsz":
        fn(Handle, CUdeviceptr, u64, c_uint) -> CUresult;
    CU_STREAM_WRITE_VALUE64_V2 Cuda c"cuStreamWriteValue64_v2":
        fn(Handle, CUdeviceptr, u64, c_uint) -> CUresult;
    CU_STREAM_WRITE_VALUE64_V2_PTSZ Cuda c"cuStreamWriteValue64_v2_ptsz":
        fn(Handle, CUdeviceptr, u64, c_uint) -> CUresult;
    CU_STREAM_BATCH_MEM_OP Cuda c"cuStreamBatchMemOp":
        fn(Handle, c_uint, *const c_void, c_uint) -> CUresult;
    CU_STREAM_BATCH_MEM_OP_PTSZ Cuda c"cuStreamBatchMemOp_ptsz":
        fn(Handle, c_uint, *const c_void, c_uint) -> CUresult;
    CU_STREAM_BATCH_MEM_OP_V2 Cuda c"cuStreamBatchMemOp_v2":
        fn(Handle, c_uint, *const c_void, c_uint) -> CUresult;
    CU_STREAM_BATCH_MEM_OP_V2_PTSZ Cuda c"cuStreamBatchMemOp_v2_ptsz":
        fn(Handle, c_uint, *const c_void, c_uint) -> CUresult;

    NVML_DEVICE_GET_MEMORY_INFO Nvml c"nvmlDeviceGetMemoryInfo":
        fn(NvmlDevice, *mut NvmlMemory) -> NvmlReturn;
    NVML_DEVICE_GET_MEMORY_INFO_V2 Nvml c"nvmlDeviceGetMemoryInfo_v2":
        fn(NvmlDevice, *mut NvmlMemoryV2) -> NvmlReturn;
    NVML_INIT_V2 Nvml c"nvmlInit_v2": fn() -> NvmlReturn;
    NVML_DEVICE_GET_HANDLE_BY_UUID Nvml c"nvmlDeviceGetHandleByUUID":
        fn(*const c_char, *mut NvmlDevice) -> NvmlReturn;
    NVML_DEVICE_GET_UUID Nvml c"nvmlDeviceGetUUID": fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn;
    NVML_DEVICE_GET_INDEX Nvml c"nvmlDeviceGetIndex": fn(NvmlDevice, *mut c_uint) -> NvmlReturn;
    NVML_DEVICE_GET_COMPUTE_RUNNING_PROCESSES_V3 Nvml c"nvmlDeviceGetComputeRunningProcesses_v3":
        fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfo) -> NvmlReturn;
}

/// The handle of `lib` if it is loaded in this process (0 if not).
pub fn handle(lib: Lib) -> usize {
    let h = HANDLES[lib as usize].load(Acquire);
    if h != 0 {
        return h;
    }
    let h = LIB_NAMES[lib as usize]
        .iter()
        // SAFETY: a valid C string; RTLD_NOLOAD never loads anything, it only looks up.
        .map(|n| unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) } as usize)
        .find(|&h| h != 0)
        .unwrap_or(0);
    if h != 0 {
        HANDLES[lib as usize].store(h, Release);
    }
    h
}

/// Uses `h` (a handle the program obtained for a library that has `lib`'s symbols) if we
/// have none for `lib` yet.
pub fn adopt(lib: Lib, h: usize) {
    if h != 0 && HANDLES[lib as usize].load(Acquire) == 0 {
        HANDLES[lib as usize].store(h, Release);
        resolve(lib, false);
    }
}

/// Resolves every entry point of `lib`; with `load`, loads the library if it is not there.
/// Returns whether the library is available.
pub fn resolve(lib: Lib, load: bool) -> bool {
    let mut h = handle(lib);
    if h == 0 && load {
        // SAFETY: a valid C string; loading the driver library the program asked us to use.
        h = unsafe { libc::dlopen(LIB_NAMES[lib as usize][0].as_ptr(), libc::RTLD_NOW) } as usize;
        if h != 0 {
            HANDLES[lib as usize].store(h, Release);
        }
    }
    if h == 0 {
        return false;
    }
    for raw in ALL.iter().chain(hip::ALL).filter(|r| r.lib == lib) {
        if raw.loaded() == 0 {
            let p = dl::real_dlsym(h as *mut c_void, raw.name.as_ptr()) as usize;
            if p != 0 {
                raw.ptr.store(p, Release);
            }
        }
    }
    RESOLVED[lib as usize].store(true, Release);
    if lib == Lib::Cuda
        && let Some(f) = AFTER_CUDA.get()
    {
        f();
    }
    true
}

/// What runs after every resolution of CUDA's entry points (none yet): the launch hooks'
/// installation (crate::hook), registered by lib.rs at load time.
static AFTER_CUDA: Registered<fn()> = Registered::new();

/// Registers `f` to run after every resolution of CUDA's entry points; called once, by the
/// library's constructor, before it resolves anything.
pub fn after_cuda_resolved(f: &'static fn()) {
    AFTER_CUDA.set(f);
}

/// The function in `$sym` (a [`Sym`]), loading its library if needed; or returns 3 from the
/// calling wrapper: `CUDA_ERROR_NOT_INITIALIZED`, and `hipErrorNotInitialized` alike (both
/// 3, asserted in real::hip), for the CUDA and the HIP wrappers.
macro_rules! real_or_3 {
    ($sym:expr) => {
        match $sym.load() {
            Some(f) => f,
            None => return $crate::real::CUDA_ERROR_NOT_INITIALIZED,
        }
    };
}
pub(crate) use real_or_3;

/// Reads `*p` (NULL-safe): an out-parameter the driver wrote.
pub fn read<T: Copy + Default>(p: *const T) -> T {
    if p.is_null() {
        return T::default();
    }
    // SAFETY: non-NULL pointer the driver just wrote through (driver API contract).
    unsafe { p.read_unaligned() }
}
