//! fgpu-sim: a simulated NVIDIA driver, one cdylib exporting the CUDA driver API
//! (`libcuda.so.1`) and NVML (`libnvidia-ml.so.1`) with the real C ABI and names.
//!
//! Device state (memory per process, running processes, the device timeline) lives in a
//! shared-memory file so that every process on the host sees the same simulated device(s);
//! see [`state`], [`timeline`] and [`config`].

mod config;
mod cuda;
mod exports;
mod ffi;
mod nvml;
mod process;
mod size;
mod state;
mod timeline;
mod visible;
