//! fgpu-sim: a simulated GPU driver, one cdylib exporting the CUDA driver API
//! (`libcuda.so.1`) and NVML (`libnvidia-ml.so.1`) with the real C ABI and names, and a HIP
//! personality over the same state: the HIP runtime (`libamdhip64.so`) and a ROCm SMI subset
//! (`librocm_smi64.so`), see [`hip`].
//!
//! Device state (memory per process, running processes, the device timeline) lives in a
//! shared-memory file so that every process on the host sees the same simulated device(s);
//! see [`state`], [`timeline`] and [`config`].

mod config;
mod cuda;
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
