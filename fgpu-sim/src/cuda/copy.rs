//! Copies and memsets that move real bytes (`crate::data`), and address queries.
//!
//! A device range resolves through the linear allocations and the VMM mappings
//! ([`Local::resolve`]). Rules modelled:
//! - a range that starts at an address neither allocated nor mapped (a freed allocation, a
//!   reserved VMM range with nothing mapped, as a parked tenant's memory is) is an illegal
//!   address: the call fails with CUDA_ERROR_ILLEGAL_ADDRESS and the context is poisoned
//!   (sticky, see [`Local::current_dev`]). That is how a kernel touching such memory fails
//!   on a real GPU; a real driver may instead reject a synchronous copy from an unknown
//!   pointer up front with CUDA_ERROR_INVALID_VALUE; the simulator reports the fault so that
//!   tests catch a tenant touching its memory while it is parked;
//! - a range that starts inside an allocation but runs past its end is
//!   CUDA_ERROR_INVALID_VALUE (not sticky). A range may run from one VMM mapping into the
//!   next one where they are contiguous, as virtual addresses are;
//! - a VMM mapping is touched only by devices given access to it (`cuMemSetAccess`, see
//!   `cuda::vmm`): a copy or memset in a context on another device is an illegal address,
//!   as above; linear allocations are reachable from every device's context (the driver
//!   stages copies between devices without peer access);
//! - zero bytes copy nothing and succeed once the context is valid;
//! - the async variants copy at once (no kernel in the simulator reads or writes data, so
//!   stream order cannot be observed), after checking the stream. A stream in capture is
//!   not given a memcpy node: the copy happens at once.
//!
//! Host pointers are trusted as the real driver trusts them (`crate::ffi`): NULL is
//! rejected, anything else must be valid for the length.

use super::*;
use crate::data::Bytes;
use crate::ffi::put;
use crate::process::{Backing, Local, local};

/// One piece of a device range inside one backing object, and the devices that may read
/// and write it there.
#[derive(Clone, Copy, Debug)]
struct Piece {
    backing: Backing,
    offset: u64,
    len: u64,
    read: u64,
    write: u64,
}

/// What an access does with a range.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Read,
    Write,
}

/// The pieces of `[ptr, ptr + n)`, or the error the access raises.
fn pieces(l: &Local, ptr: u64, n: u64) -> Result<Vec<Piece>, CUresult> {
    let mut out = Vec::new();
    let (mut at, mut left) = (ptr, n);
    let mut r = l.resolve(ptr).ok_or(CUDA_ERROR_ILLEGAL_ADDRESS)?;
    loop {
        let len = left.min(r.left(at));
        out.push(Piece {
            backing: r.backing,
            offset: r.offset,
            len,
            read: r.read,
            write: r.write,
        });
        (at, left) = (at + len, left - len);
        if left == 0 {
            return Ok(out);
        }
        // Past the end: only a contiguous next VMM mapping continues the range.
        r = match (r.backing, l.resolve(at)) {
            (Backing::Physical(_), Some(next)) if matches!(next.backing, Backing::Physical(_)) => {
                next
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
    }
}

/// Resolves a device range for an access by the current context (on device `dev`); an
/// illegal address poisons that context. VMM memory the device was given no access to
/// (`cuMemSetAccess`, see `cuda::vmm`) is an illegal address for it, as memory its page
/// tables do not map.
fn access(l: &mut Local, dev: usize, ptr: u64, n: u64, want: Want) -> Result<Vec<Piece>, CUresult> {
    let bit = 1u64 << dev;
    pieces(l, ptr, n)
        .and_then(|ps| {
            let allowed = |p: &Piece| match want {
                Want::Read => p.read & bit != 0,
                Want::Write => p.write & bit != 0,
            };
            if ps.iter().all(allowed) {
                Ok(ps)
            } else {
                Err(CUDA_ERROR_ILLEGAL_ADDRESS)
            }
        })
        .inspect_err(|&e| {
            if e == CUDA_ERROR_ILLEGAL_ADDRESS {
                l.poisoned[dev] = true;
            }
        })
}

fn store(l: &mut Local, b: Backing) -> Result<&mut Bytes, CUresult> {
    l.bytes_mut(b).ok_or(CUDA_ERROR_ILLEGAL_ADDRESS)
}

/// Writes `src` over the pieces (their lengths sum to `src.len()`).
fn write_pieces(l: &mut Local, pieces: &[Piece], src: &[u8]) -> Result<(), CUresult> {
    let mut pos = 0usize;
    for p in pieces {
        let n = p.len as usize;
        store(l, p.backing)?.write(p.offset, &src[pos..pos + n]);
        pos += n;
    }
    Ok(())
}

/// Reads the pieces into `dst`.
///
/// # Safety
/// `dst` must be valid for writes of the pieces' total length.
unsafe fn read_pieces(l: &Local, pieces: &[Piece], dst: *mut u8) -> Result<(), CUresult> {
    let mut pos = 0usize;
    for p in pieces {
        let b = l.bytes(p.backing).ok_or(CUDA_ERROR_ILLEGAL_ADDRESS)?;
        // SAFETY: `pos + p.len` is within the caller's buffer (contract above); simulated
        // device memory is Rust-owned, never the caller's buffer.
        unsafe { b.read_raw(p.offset, dst.add(pos), p.len as usize) };
        pos += p.len as usize;
    }
    Ok(())
}

/// At most this many bytes go through a temporary buffer at a time (device to device,
/// memsets).
const STEP: u64 = 1 << 20;

/// Host → device.
pub(super) fn htod(
    l: &mut Local,
    dev: usize,
    dst: u64,
    src: *const u8,
    n: usize,
) -> Result<(), CUresult> {
    if n == 0 {
        return Ok(());
    }
    if src.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pieces = access(l, dev, dst, n as u64, Want::Write)?;
    // SAFETY: a non-NULL host pointer valid for `n` bytes per the API contract
    // (`crate::ffi`); it cannot alias simulated device memory, which is Rust-owned.
    let src = unsafe { std::slice::from_raw_parts(src, n) };
    write_pieces(l, &pieces, src)
}

/// Device → host.
pub(super) fn dtoh(
    l: &mut Local,
    dev: usize,
    dst: *mut u8,
    src: u64,
    n: usize,
) -> Result<(), CUresult> {
    if n == 0 {
        return Ok(());
    }
    if dst.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pieces = access(l, dev, src, n as u64, Want::Read)?;
    // SAFETY: a non-NULL host pointer valid for `n` bytes of writes (API contract).
    unsafe { read_pieces(l, &pieces, dst) }
}

/// Device → device, through a bounded buffer. Both ranges are checked before a byte moves.
fn dtod(l: &mut Local, dev: usize, dst: u64, src: u64, n: usize) -> Result<(), CUresult> {
    let n = n as u64;
    if n == 0 {
        return Ok(());
    }
    access(l, dev, src, n, Want::Read)?;
    access(l, dev, dst, n, Want::Write)?;
    let mut buf = vec![0u8; n.min(STEP) as usize];
    let mut done = 0;
    while done < n {
        let k = (n - done).min(STEP);
        let from = pieces(l, src + done, k)?;
        // SAFETY: `buf` holds at least `k` bytes.
        unsafe { read_pieces(l, &from, buf.as_mut_ptr())? };
        let to = pieces(l, dst + done, k)?;
        write_pieces(l, &to, &buf[..k as usize])?;
        done += k;
    }
    Ok(())
}

/// Fills `n` bytes from `dst` with the repeated `pattern` (whose length divides STEP).
fn fill(l: &mut Local, dev: usize, dst: u64, pattern: &[u8], n: u64) -> Result<(), CUresult> {
    if n == 0 {
        return Ok(());
    }
    access(l, dev, dst, n, Want::Write)?;
    let buf: Vec<u8> = pattern
        .iter()
        .copied()
        .cycle()
        .take(n.min(STEP) as usize)
        .collect();
    let mut done = 0;
    while done < n {
        let k = (n - done).min(STEP);
        let to = pieces(l, dst + done, k)?;
        write_pieces(l, &to, &buf[..k as usize])?;
        done += k;
    }
    Ok(())
}

/// Runs `f` on the process state with the current context's device.
fn with_ctx(f: impl FnOnce(&mut Local, usize) -> Result<(), CUresult>) -> CUresult {
    let mut l = local();
    rc(l.current_dev().and_then(|d| f(&mut l, d)))
}

/// As [`with_ctx`], after checking that `stream` is a stream of this context.
pub(super) fn with_stream(
    stream: Handle,
    f: impl FnOnce(&mut Local, usize) -> Result<(), CUresult>,
) -> CUresult {
    let mut l = local();
    let r = l.current_dev().and_then(|d| {
        stream::resolve(&mut l, stream)?;
        f(&mut l, d)
    });
    rc(r)
}

pub extern "C" fn cu_memcpy_htod(dst: CUdeviceptr, src: *const u8, n: usize) -> CUresult {
    with_ctx(|l, d| htod(l, d, dst, src, n))
}

pub extern "C" fn cu_memcpy_dtoh(dst: *mut u8, src: CUdeviceptr, n: usize) -> CUresult {
    with_ctx(|l, d| dtoh(l, d, dst, src, n))
}

pub extern "C" fn cu_memcpy_dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    with_ctx(|l, d| dtod(l, d, dst, src, n))
}

pub extern "C" fn cu_memcpy_htod_async(
    dst: CUdeviceptr,
    src: *const u8,
    n: usize,
    stream: Handle,
) -> CUresult {
    with_stream(stream, |l, d| htod(l, d, dst, src, n))
}

pub extern "C" fn cu_memcpy_dtoh_async(
    dst: *mut u8,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    with_stream(stream, |l, d| dtoh(l, d, dst, src, n))
}

pub extern "C" fn cu_memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    with_stream(stream, |l, d| dtod(l, d, dst, src, n))
}

/// `cuMemcpy(dst, src, n)`: with unified addressing (CUDA Driver API reference, Unified
/// Addressing: "the CUDA driver infers the type of the memory from the pointer"), each side
/// is device memory if it is a device address of this process
/// ([`Local::is_device_address`]: allocated, mapped, reserved or once handed out), else host
/// memory. Host to host is a plain copy.
pub extern "C" fn cu_memcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    with_ctx(|l, d| unified(l, d, dst, src, n))
}

/// A copy whose direction the pointers tell (unified addressing, see [`cu_memcpy`]).
pub(super) fn unified(
    l: &mut Local,
    d: usize,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
) -> Result<(), CUresult> {
    match (l.is_device_address(dst), l.is_device_address(src)) {
        (true, true) => dtod(l, d, dst, src, n),
        (true, false) => htod(l, d, dst, src as *const u8, n),
        (false, true) => dtoh(l, d, dst as *mut u8, src, n),
        (false, false) => {
            if n > 0 && (dst == 0 || src == 0) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: host pointers valid for `n` bytes (API contract); `copy` allows
            // overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
            Ok(())
        }
    }
}

/// `cuMemsetD8_v2(dst, value, n)`: `n` bytes.
pub extern "C" fn cu_memset_d8(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    with_ctx(|l, d| fill(l, d, dst, &[value], n as u64))
}

/// `cuMemsetD32_v2(dst, value, n)`: `n` 32-bit values; the CUDA Driver API reference
/// (Memory Management, cuMemsetD32) requires `dst` to be 4-byte aligned.
pub extern "C" fn cu_memset_d32(dst: CUdeviceptr, value: u32, n: usize) -> CUresult {
    with_ctx(|l, d| {
        if !dst.is_multiple_of(4) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = (n as u64).checked_mul(4).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        fill(l, d, dst, &value.to_le_bytes(), bytes)
    })
}

/// `cuMemGetAddressRange_v2(base, size, ptr)`: the allocation (linear) or mapping (VMM)
/// containing `ptr`, or page-locked host memory from this driver (unified addressing); both
/// outputs optional. An address that is none of these is CUDA_ERROR_NOT_FOUND (a query,
/// not an access: nothing is poisoned).
pub extern "C" fn cu_mem_get_address_range(
    base: *mut CUdeviceptr,
    size: *mut usize,
    ptr: CUdeviceptr,
) -> CUresult {
    let l = local();
    if let Err(e) = l.current_dev() {
        return e;
    }
    let found = match l.resolve(ptr) {
        Some(r) => Some((r.base, r.size)),
        None => l
            .host
            .range(..=ptr as usize)
            .next_back()
            .filter(|&(&p, &len)| (ptr as usize) < p + len)
            .map(|(&p, &len)| (p as u64, len as u64)),
    };
    match found {
        Some((b, s)) => {
            put(base, b);
            put(size, s as usize);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_NOT_FOUND,
    }
}
