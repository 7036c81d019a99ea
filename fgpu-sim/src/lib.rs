//! fgpu-sim: a simulated GPU driver, one cdylib exporting the CUDA driver API
//! (`libcuda.so.1`) and NVML (`libnvidia-ml.so.1`) with the real C ABI and names, and a HIP
//! personality over the same state: the HIP runtime (`libamdhip64.so`) and a ROCm SMI subset
//! (`librocm_smi64.so`), see [`hip`].
//!
//! Device state (memory per process, running processes, the device timeline) lives in a
//! shared-memory file so that every process on the host sees the same simulated device(s);
//! see [`state`], [`timeline`] and [`config`].
//!
//! Device data is process-local ([`process`]): every backing object, a linear allocation
//! (cuMemAlloc, pitch, managed, stream-ordered) or a VMM physical handle (cuMemCreate), keeps
//! the bytes written into it, sparsely in 64 KiB chunks ([`data`]): unwritten bytes read as
//! zero and a multi-GiB allocation costs host memory only where it was written. A device
//! address resolves through the allocations and the VMM mappings (honouring cuMemMap's
//! offset); data belongs to the handle, so a handle mapped elsewhere shows the same bytes and
//! a new handle starts at zero. The copies and memsets (`cuda::copy`) move real bytes, so
//! tests can check data byte for byte across a park (VMM unmap, host copy) and an unpark. An
//! access to memory that is neither allocated nor mapped, a reserved VMM range with nothing
//! mapped included, fails with CUDA_ERROR_ILLEGAL_ADDRESS and poisons the context: every
//! later call on it returns that error, as on a real GPU. So does an access from a device to
//! a VMM mapping that `cuMemSetAccess` gave it no access to (a mapping starts with none; a
//! write needs read-write access); linear memory is reachable from every device's context,
//! as the driver stages copies between devices (`cuda::vmm`, `cuda::copy`). Page-locked host memory
//! (`cuda::host`) is anonymous mappings of the process. Kernels still touch no data.

mod config;
mod cuda;
mod data;
mod exports;
mod exports_hip;
mod ffi;
mod hip;
mod nvml;
mod process;
mod size;
mod state;
mod timeline;
mod visible;
