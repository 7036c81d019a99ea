//! CUDA (NVIDIA): the driver API's and NVML's wrapped entry points, over the accounting
//! (crate::account) and the launch gate (crate::gate); AMD's are in crate::hip.
//!
//! - [`nvml`]: NVML's memory-info answers and the shim's own NVML queries; [`pool`]:
//!   stream-ordered allocation and memory pools;
//! - [`context`]: context overhead, charged per process and device (measured through NVML);
//! - [`alloc`]: linear allocations and their frees; [`array`]: CUDA arrays; [`vmm`]:
//!   cuMemCreate/Map/Unmap/Release; [`meminfo`]: cuMemGetInfo_v2 and cuDeviceTotalMem_v2
//!   report the limit; [`launch`]: the launch entry points (their fast paths published by the
//!   gate through a callback lib.rs registers);
//! - [`gpa`]: `cuGetProcAddress(_v2)` and the table of every wrapped entry point.

pub mod alloc;
pub mod array;
pub mod context;
pub mod gpa;
pub mod launch;
pub mod meminfo;
pub mod nvml;
pub mod pool;
pub mod vmm;
