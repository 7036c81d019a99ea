//! Linear device memory: cuMemAlloc, pitch, managed, free, info. (Copies: `copy`.)

use super::*;
use crate::ffi::put;
use crate::process::{Alloc, AllocKind, local};
use crate::state::shared;

/// `FGPU_SIM_FREE_DELAY_MS` (docs in [`crate::config`]): a free that takes that long, for
/// tests that kill a process inside one.
fn free_delay() {
    static MS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ms = *MS.get_or_init(|| {
        std::env::var("FGPU_SIM_FREE_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Allocates `size` bytes of `kind` on the current device and returns the pointer.
pub fn allocate(size: u64, kind: AllocKind, charge: bool) -> Result<(u64, usize), CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut l = local();
    let dev = l.current_dev()?;
    if charge {
        l.charge(dev, size)?;
    }
    let ptr = l.linear_va(size);
    l.allocs.insert(ptr, Alloc::new(dev, size, kind));
    Ok((ptr, dev))
}

fn alloc_out(dptr: *mut CUdeviceptr, size: usize, kind: AllocKind, charge: bool) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match allocate(size as u64, kind, charge) {
        Ok((p, _)) => {
            put(dptr, p);
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

pub extern "C" fn cu_mem_alloc(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    alloc_out(dptr, size, AllocKind::Device, true)
}

/// Charges pitch × height, the pitch being the width rounded up to 512 bytes.
pub extern "C" fn cu_mem_alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem_size: u32,
) -> CUresult {
    if pitch.is_null() || width == 0 || height == 0 || !matches!(elem_size, 4 | 8 | 16) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let p = width.div_ceil(512) * 512;
    let Some(bytes) = p.checked_mul(height) else {
        return CUDA_ERROR_OUT_OF_MEMORY;
    };
    let r = alloc_out(dptr, bytes, AllocKind::Device, true);
    if r == CUDA_SUCCESS {
        put(pitch, p);
    }
    r
}

/// Managed memory does not lower free device memory until its pages are touched on the
/// device; the simulator never touches pages, so it charges nothing.
pub extern "C" fn cu_mem_alloc_managed(
    dptr: *mut CUdeviceptr,
    size: usize,
    _flags: u32,
) -> CUresult {
    alloc_out(dptr, size, AllocKind::Managed, false)
}

pub extern "C" fn cu_mem_free(ptr: CUdeviceptr) -> CUresult {
    free_delay();
    let mut l = local();
    if let Err(e) = l.current_dev() {
        return e;
    }
    if ptr == 0 {
        return CUDA_SUCCESS;
    }
    match l.allocs.get(&ptr).map(|a| a.kind) {
        Some(AllocKind::Device) => {
            let a = l.allocs.remove(&ptr).unwrap_or_else(|| unreachable!());
            l.uncharge(a.dev, a.size);
            l.release_va(ptr, a.size);
            CUDA_SUCCESS
        }
        Some(AllocKind::Managed) => {
            if let Some(a) = l.allocs.remove(&ptr) {
                l.release_va(ptr, a.size);
            }
            CUDA_SUCCESS
        }
        Some(AllocKind::Pool(_)) => {
            drop(l);
            super::pool::free_to_pool(ptr)
        }
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

pub extern "C" fn cu_mem_get_info(free: *mut usize, total: *mut usize) -> CUresult {
    let l = local();
    let dev = match l.current_dev() {
        Ok(d) => d,
        Err(e) => return e,
    };
    let Some(s) = shared() else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    let (f, t) = s.mem_info(dev);
    if put(free, f as usize) && put(total, t as usize) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}
