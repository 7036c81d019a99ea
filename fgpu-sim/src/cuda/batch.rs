//! The batched copies (`cuMemcpyBatchAsync` of CUDA 12.8, with `failIdx`, and its CUDA 13.0
//! `_v2`, without) and the stream memory operations `cuStreamWriteValue32/64` and
//! `cuStreamWaitValue32/64` (first and `_v2` forms, which share a C signature): the entry
//! points through which a program has the GPU touch device memory outside copies and
//! kernels, and which a parked tenant's shim must therefore hold at its door.
//!
//! Rules modelled (CUDA Driver API reference: Memory Management, cuMemcpyBatchAsync; Stream
//! Memory Operations):
//! - a batch has `count` > 0 copies; `dsts`, `srcs` and `sizes` are arrays of `count`;
//!   `numAttrs` is 1..=count with `attrsIdxs[0]` = 0 and the indices strictly increasing
//!   and below `count`; each attribute's `srcAccessOrder` (the first field of the 24-byte
//!   `CUmemcpyAttributes`) is STREAM (1), DURING_API_CALL (2) or ANY (3). Anything else is
//!   CUDA_ERROR_INVALID_VALUE, and in the 12.8 form `*failIdx` = SIZE_MAX (an error that is
//!   no one copy's);
//! - each copy's direction is inferred from its pointers, as `cuMemcpy` does; copies run
//!   at once, in order (the driver guarantees no order within a batch; the simulator runs no
//!   kernel, so none can be observed); the first copy that fails stops the batch, and the
//!   12.8 form writes its index to `*failIdx`. A copy that touches unmapped memory poisons
//!   the context, as every access does (`super::copy`);
//! - a write stores the value, little-endian, at the address; a wait reads the value at the
//!   address, as the GPU's polling does, and returns: its condition is not waited for (no
//!   kernel runs concurrently in the simulator that could ever change the value).
//!
//! - `cuStreamBatchMemOp(_v2)` takes `count` (1..=256) operations of 48 bytes each
//!   (`CUstreamBatchMemOpParams`: the operation at offset 0; for a wait or a write the address
//!   at 8, the value at 16, the flags at 24): WAIT_VALUE_32 (1), WRITE_VALUE_32 (2),
//!   FLUSH_REMOTE_WRITES (3), WAIT_VALUE_64 (4), WRITE_VALUE_64 (5), BARRIER (6). An unknown
//!   operation, a NULL array or a count out of range is CUDA_ERROR_INVALID_VALUE before any
//!   operation runs; the operations then run in order as the single calls above do (a flush
//!   or a barrier touches no memory), the first failure ending the batch.
//!
//! Not modelled: the 3D batched copies, and which streams a batch may be submitted to.

use super::copy::{dtoh, htod, unified, with_stream};
use super::*;
use crate::ffi::put;

/// `CUmemcpyAttributes`: srcAccessOrder, srcLocHint, dstLocHint (`CUmemLocation`s), flags.
const ATTRS_SIZE: usize = 24;

/// Reads `p[i]`.
///
/// # Safety
/// `p` must be valid for reads of `i + 1` elements (the API's array contract).
unsafe fn at<T: Copy>(p: *const T, i: usize) -> T {
    // SAFETY: the caller's contract.
    unsafe { p.add(i).read_unaligned() }
}

/// Checks the batch's arrays and attributes; `Err` is an error of no one copy.
fn check_batch(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const u8,
    idxs: *const usize,
    num_attrs: usize,
) -> Result<(), CUresult> {
    if count == 0 || dsts.is_null() || srcs.is_null() || sizes.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if num_attrs == 0 || num_attrs > count || attrs.is_null() || idxs.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut prev = None;
    for k in 0..num_attrs {
        // SAFETY: `attrsIdxs` holds `numAttrs` entries (API contract).
        let idx = unsafe { at(idxs, k) };
        let ordered = match prev {
            None => idx == 0,
            Some(p) => idx > p && idx < count,
        };
        // SAFETY: `attrs` holds `numAttrs` 24-byte entries, srcAccessOrder (a 32-bit enum)
        // first (API contract).
        let order = unsafe { attrs.add(k * ATTRS_SIZE).cast::<u32>().read_unaligned() };
        if !ordered || !(1..=3).contains(&order) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        prev = Some(idx);
    }
    Ok(())
}

/// Runs a batch on `stream`; `fail` receives the failing copy's index (SIZE_MAX if none).
#[allow(clippy::too_many_arguments)]
fn batch(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const u8,
    idxs: *const usize,
    num_attrs: usize,
    fail: *mut usize,
    stream: Handle,
) -> CUresult {
    put(fail, usize::MAX);
    with_stream(stream, |l, d| {
        check_batch(dsts, srcs, sizes, count, attrs, idxs, num_attrs)?;
        for i in 0..count {
            // SAFETY: the three arrays hold `count` entries (API contract; checked non-NULL).
            let (dst, src, n) = unsafe { (at(dsts, i), at(srcs, i), at(sizes, i)) };
            unified(l, d, dst, src, n).inspect_err(|_| {
                put(fail, i);
            })?;
        }
        Ok(())
    })
}

/// `cuMemcpyBatchAsync` (CUDA 12.8) and its `_ptsz`.
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cu_memcpy_batch_async(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const u8,
    idxs: *const usize,
    num_attrs: usize,
    fail: *mut usize,
    stream: Handle,
) -> CUresult {
    batch(
        dsts, srcs, sizes, count, attrs, idxs, num_attrs, fail, stream,
    )
}

/// `cuMemcpyBatchAsync_v2` (CUDA 13.0: no `failIdx`) and its `_ptsz`.
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cu_memcpy_batch_async_v2(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const u8,
    idxs: *const usize,
    num_attrs: usize,
    stream: Handle,
) -> CUresult {
    let none = std::ptr::null_mut();
    batch(
        dsts, srcs, sizes, count, attrs, idxs, num_attrs, none, stream,
    )
}

/// Writes `bytes` at `addr` in stream order (at once, see the module's rules).
fn write_value(s: Handle, addr: CUdeviceptr, bytes: &[u8]) -> CUresult {
    with_stream(s, |l, d| htod(l, d, addr, bytes.as_ptr(), bytes.len()))
}

/// Reads `n` (at most 8) bytes at `addr`, as a wait's polling does.
fn read_value(s: Handle, addr: CUdeviceptr, n: usize) -> CUresult {
    let mut bytes = [0u8; 8];
    with_stream(s, |l, d| dtoh(l, d, bytes.as_mut_ptr(), addr, n.min(8)))
}

/// `cuStreamWriteValue32(_v2)(stream, addr, value, flags)`.
pub extern "C" fn cu_stream_write_value32(
    s: Handle,
    addr: CUdeviceptr,
    v: u32,
    _f: u32,
) -> CUresult {
    write_value(s, addr, &v.to_le_bytes())
}

/// `cuStreamWriteValue64(_v2)(stream, addr, value, flags)`.
pub extern "C" fn cu_stream_write_value64(
    s: Handle,
    addr: CUdeviceptr,
    v: u64,
    _f: u32,
) -> CUresult {
    write_value(s, addr, &v.to_le_bytes())
}

/// `cuStreamWaitValue32(_v2)(stream, addr, value, flags)`: reads the value (see the module's
/// rules).
pub extern "C" fn cu_stream_wait_value32(
    s: Handle,
    addr: CUdeviceptr,
    _v: u32,
    _f: u32,
) -> CUresult {
    read_value(s, addr, 4)
}

/// `cuStreamWaitValue64(_v2)(stream, addr, value, flags)`.
pub extern "C" fn cu_stream_wait_value64(
    s: Handle,
    addr: CUdeviceptr,
    _v: u64,
    _f: u32,
) -> CUresult {
    read_value(s, addr, 8)
}

/// `CUstreamBatchMemOpParams` (a union of 48 bytes): a wait's or a write's fields.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemOp {
    pub operation: u32,
    pub address: CUdeviceptr,
    pub value: u64,
    pub flags: u32,
    pub alias: CUdeviceptr,
    pub pad: u64,
}

const OP_WAIT_32: u32 = 1;
const OP_WRITE_32: u32 = 2;
const OP_FLUSH: u32 = 3;
const OP_WAIT_64: u32 = 4;
const OP_WRITE_64: u32 = 5;
const OP_BARRIER: u32 = 6;
/// The most operations one call takes (the reference's limit for the batch).
const MAX_MEM_OPS: u32 = 256;

/// `cuStreamBatchMemOp(_v2)(stream, count, params, flags)` and their `_ptsz`.
pub extern "C" fn cu_stream_batch_mem_op(
    s: Handle,
    count: u32,
    params: *const MemOp,
    _flags: u32,
) -> CUresult {
    if params.is_null() || count == 0 || count > MAX_MEM_OPS {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes `count` operations (the API's array contract).
    let ops: Vec<MemOp> = (0..count as usize)
        .map(|i| unsafe { at(params, i) })
        .collect();
    if ops
        .iter()
        .any(|o| !(OP_WAIT_32..=OP_BARRIER).contains(&o.operation))
    {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for o in ops {
        let rc = match o.operation {
            OP_WAIT_32 => read_value(s, o.address, 4),
            OP_WAIT_64 => read_value(s, o.address, 8),
            OP_WRITE_32 => write_value(s, o.address, &(o.value as u32).to_le_bytes()),
            OP_WRITE_64 => write_value(s, o.address, &o.value.to_le_bytes()),
            OP_FLUSH | OP_BARRIER => with_stream(s, |_, _| Ok(())),
            _ => CUDA_ERROR_INVALID_VALUE,
        };
        if rc != CUDA_SUCCESS {
            return rc;
        }
    }
    CUDA_SUCCESS
}
