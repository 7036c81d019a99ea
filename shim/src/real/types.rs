//! The C types and constants of the entry points in [`super`]'s table, as the CUDA driver
//! API (`cuda.h`) and NVML (`nvml.h`) lay them out.

use super::Handle;
use std::ffi::{c_int, c_uint, c_void};

/// Head of `CUmemAllocationProp`: type, requestedHandleTypes, `CUmemLocation { type, id }`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AllocPropHead {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}

/// The whole `CUmemAllocationProp` (parking fills it in itself): the head, then
/// `win32HandleMetaData` and `allocFlags` (compression, RDMA, usage, reserved), zeroed.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AllocProp {
    pub head: AllocPropHead,
    pub win32_meta: *mut c_void,
    pub alloc_flags: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<AllocProp>() == 32);

/// `CUmemAccessDesc`: a location (type, id) and the access flags.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AccessDesc {
    pub location_type: c_int,
    pub location_id: c_int,
    pub flags: c_int,
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
/// `CU_MEMHOSTREGISTER_PORTABLE`.
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 1;
/// `CU_STREAM_NON_BLOCKING`.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;

/// Head of `CUlaunchConfig` (cuLaunchKernelEx): grid, block, shared memory, then the stream
/// at offset 32.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfigHead {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: Handle,
}

const _: () = assert!(std::mem::offset_of!(LaunchConfigHead, stream) == 32);

/// Head of `CUmemPoolProps` (same head as `CUmemAllocationProp`).
pub type PoolPropsHead = AllocPropHead;

pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlProcessInfo_t` (v3 API).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}
