//! `cuGetExportTable`: the driver's private tables of entry points. The real CUDA runtime
//! reaches launches this way (through pointers that lead into libcuda's exported launch
//! functions, never through `dlsym` or `cuGetProcAddress`); the simulator offers one table
//! with the same property so that the shim's inline launch hooks can be tested.
//!
//! [`LAUNCH_TABLE_ID`]: `{ size, cuLaunchKernel, cuLaunchKernel_ptsz, cuGraphLaunch }`, each
//! pointer the address of the exported symbol itself.

use super::*;
use std::sync::OnceLock;

/// The id of the simulator's launch table.
pub const LAUNCH_TABLE_ID: [u8; 16] = *b"fgpu-sim-launch\0";

#[repr(C)]
pub struct LaunchTable {
    pub size: usize,
    pub launch_kernel: usize,
    pub launch_kernel_ptsz: usize,
    pub graph_launch: usize,
}

static TABLE: OnceLock<LaunchTable> = OnceLock::new();

unsafe extern "C" {
    // Hidden aliases of the exported trampolines (crate::exports): the addresses of the
    // exports themselves, resolved inside this library (taking the exported names' addresses
    // would go through the GOT and find an interposer's definition first).
    fn cuLaunchKernel_entry();
    fn cuLaunchKernel_ptsz_entry();
    fn cuGraphLaunch_entry();
}

pub extern "C" fn cu_get_export_table(
    out: *mut *const LaunchTable,
    id: *const [u8; 16],
) -> CUresult {
    if out.is_null() || id.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a CUuuid (16 bytes), checked non-NULL above.
    if unsafe { *id } != LAUNCH_TABLE_ID {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let t = TABLE.get_or_init(|| LaunchTable {
        size: size_of::<LaunchTable>(),
        launch_kernel: cuLaunchKernel_entry as *const () as usize,
        launch_kernel_ptsz: cuLaunchKernel_ptsz_entry as *const () as usize,
        graph_launch: cuGraphLaunch_entry as *const () as usize,
    });
    // SAFETY: non-NULL out-pointer (checked above).
    unsafe { *out = t };
    CUDA_SUCCESS
}
