//! CUDA arrays. Footprint = width × height × depth × element size × channels, rounded up to
//! 2 MiB; a mipmapped array charges about 4/3 of its level-0 footprint.

use super::*;
use crate::ffi::{get, put};
use crate::process::local;

const ROUND: u64 = 2 << 20;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: i32,
    pub channels: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: i32,
    pub channels: u32,
    pub flags: u32,
}

fn element_size(format: i32) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // (UN)SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // (UN)SIGNED_INT16, HALF
        _ => 4,                  // 32-bit formats and anything else
    }
}

fn footprint(w: usize, h: usize, d: usize, format: i32, channels: u32) -> u64 {
    let bytes = (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(element_size(format))
        .saturating_mul(channels.max(1) as u64);
    bytes.div_ceil(ROUND).saturating_mul(ROUND)
}

fn create(out: *mut Handle, bytes: u64, width: usize) -> CUresult {
    if out.is_null() || width == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut l = local();
    let dev = match l.current_dev() {
        Ok(d) => d,
        Err(e) => return e,
    };
    if let Err(e) = l.charge(dev, bytes) {
        return e;
    }
    let h = l.handle();
    l.arrays.insert(h, (dev, bytes));
    put(out, h);
    CUDA_SUCCESS
}

fn destroy(h: Handle) -> CUresult {
    let mut l = local();
    match l.arrays.remove(&h) {
        Some((dev, bytes)) => {
            l.uncharge(dev, bytes);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

pub extern "C" fn cu_array_create(out: *mut Handle, desc: *const ArrayDescriptor) -> CUresult {
    let Some(d) = get(desc) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    create(
        out,
        footprint(d.width, d.height, 1, d.format, d.channels),
        d.width,
    )
}

pub extern "C" fn cu_array3d_create(out: *mut Handle, desc: *const Array3dDescriptor) -> CUresult {
    let Some(d) = get(desc) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let bytes = footprint(d.width, d.height, d.depth, d.format, d.channels);
    create(out, bytes, d.width)
}

pub extern "C" fn cu_array_destroy(h: Handle) -> CUresult {
    destroy(h)
}

pub extern "C" fn cu_mipmapped_array_create(
    out: *mut Handle,
    desc: *const Array3dDescriptor,
    levels: u32,
) -> CUresult {
    let Some(d) = get(desc) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    if levels == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let base = footprint(d.width, d.height, d.depth, d.format, d.channels);
    let bytes = if levels == 1 {
        base
    } else {
        (base / 3 * 4).div_ceil(ROUND) * ROUND
    };
    create(out, bytes, d.width)
}

pub extern "C" fn cu_mipmapped_array_destroy(h: Handle) -> CUresult {
    destroy(h)
}
