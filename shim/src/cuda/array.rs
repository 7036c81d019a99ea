//! CUDA arrays: cuArrayCreate_v2, cuArray3DCreate_v2, cuMipmappedArrayCreate and their
//! destroys.
//!
//! The driver does not say how much an array really takes, so the shim charges an estimate
//! made before the call: width × max(height,1) × max(depth,1) × element size × channels,
//! rounded up to the 2 MiB large-page size arrays are laid out in; a mipmapped array with more
//! than one level charges 4/3 of its first level (the geometric sum of 2D levels), rounded
//! the same way. Unknown formats count 8 bytes per channel. The context-overhead correction
//! from NVML's per-process figure (see [`super::context`]) picks up any difference on real
//! drivers.

#![allow(non_snake_case)]

use crate::account::{self, ARRAYS, Kind, current_ordinal, meta, reserve};
use crate::ledger;
use crate::real::{
    self, Array3dDescriptor, ArrayDescriptor, CUDA_ERROR_OUT_OF_MEMORY, CUresult, Handle,
};
use crate::real::{read, real_or_3};
use std::ffi::{c_int, c_uint};

const ROUND: u64 = 2 << 20;

fn element_size(format: c_int) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // (UN)SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // (UN)SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // (UN)SIGNED_INT32, FLOAT
        _ => 8,
    }
}

/// The estimated footprint of an array (see the module docs).
pub fn footprint(
    w: usize,
    h: usize,
    d: usize,
    format: c_int,
    channels: c_uint,
    levels: u32,
) -> u64 {
    let base = (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(element_size(format))
        .saturating_mul(u64::from(channels.max(1)));
    let base = base.div_ceil(ROUND).saturating_mul(ROUND);
    if levels <= 1 {
        base
    } else {
        (base / 3)
            .saturating_mul(4)
            .div_ceil(ROUND)
            .saturating_mul(ROUND)
    }
}

fn create(api: &str, out: *mut Handle, bytes: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    if !ledger::active() || out.is_null() {
        return call();
    }
    let charge = match reserve(api, current_ordinal(), bytes) {
        Ok(c) => c,
        Err(_) => return CUDA_ERROR_OUT_OF_MEMORY,
    };
    let rc = call();
    if let Some(c) = charge {
        if rc == 0 {
            let h = read(out.cast_const()) as u64;
            account::track(&ARRAYS, h, c.bytes, meta(Kind::Array, c.idx, c.ord), 0);
            crate::park::note_pin(fgpu_common::ledger::park::pin::ARRAY);
        } else {
            account::release(c.idx, c.bytes);
        }
    }
    rc
}

fn destroy(h: Handle, call: impl FnOnce() -> CUresult) -> CUresult {
    if !ledger::active() {
        return call();
    }
    let e = ARRAYS.remove(h as u64);
    let rc = call();
    if let Some(e) = e {
        if rc == 0 {
            account::release_entry(&e);
        } else {
            ARRAYS.insert(e);
        }
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuArrayCreate_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CUresult {
    let f = real_or_3!(real::CU_ARRAY_CREATE);
    // SAFETY: forwarding the caller's arguments unchanged.
    let call = || unsafe { f(out, desc) };
    if desc.is_null() {
        return call();
    }
    // SAFETY: the caller's descriptor (non-NULL).
    let d = unsafe { desc.read_unaligned() };
    let bytes = footprint(d.width, d.height, 1, d.format, d.channels, 1);
    create("cuArrayCreate_v2", out, bytes, call)
}

/// # Safety
/// The CUDA driver API contract of `cuArray3DCreate_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut Handle,
    desc: *const Array3dDescriptor,
) -> CUresult {
    let f = real_or_3!(real::CU_ARRAY3D_CREATE);
    // SAFETY: forwarding the caller's arguments unchanged.
    let call = || unsafe { f(out, desc) };
    if desc.is_null() {
        return call();
    }
    // SAFETY: the caller's descriptor (non-NULL).
    let d = unsafe { desc.read_unaligned() };
    let bytes = footprint(d.width, d.height, d.depth, d.format, d.channels, 1);
    create("cuArray3DCreate_v2", out, bytes, call)
}

/// # Safety
/// The CUDA driver API contract of `cuMipmappedArrayCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut Handle,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    let f = real_or_3!(real::CU_MIPMAPPED_ARRAY_CREATE);
    // SAFETY: forwarding the caller's arguments unchanged.
    let call = || unsafe { f(out, desc, levels) };
    if desc.is_null() {
        return call();
    }
    // SAFETY: the caller's descriptor (non-NULL).
    let d = unsafe { desc.read_unaligned() };
    let bytes = footprint(d.width, d.height, d.depth, d.format, d.channels, levels);
    create("cuMipmappedArrayCreate", out, bytes, call)
}

/// # Safety
/// The CUDA driver API contract of `cuArrayDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(h: Handle) -> CUresult {
    let f = real_or_3!(real::CU_ARRAY_DESTROY);
    // SAFETY: forwarding the caller's argument unchanged.
    destroy(h, || unsafe { f(h) })
}

/// # Safety
/// The CUDA driver API contract of `cuMipmappedArrayDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(h: Handle) -> CUresult {
    let f = real_or_3!(real::CU_MIPMAPPED_ARRAY_DESTROY);
    // SAFETY: forwarding the caller's argument unchanged.
    destroy(h, || unsafe { f(h) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footprints() {
        assert_eq!(footprint(1 << 20, 1, 0, 0x20, 1, 1), 4 << 20);
        assert_eq!(footprint(10, 10, 0, 0x01, 1, 1), 2 << 20);
        assert_eq!(footprint(1024, 1024, 0, 0x20, 4, 3), 16 << 20 | 6 << 20);
    }
}
