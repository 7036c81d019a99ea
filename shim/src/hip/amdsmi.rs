//! AMD SMI (`libamd_smi.so`, what `amd-smi` and its Python package call through ctypes):
//! `amdsmi_get_gpu_memory_total`, `amdsmi_get_gpu_memory_usage` (VRAM) and
//! `amdsmi_get_gpu_vram_usage` answered like ROCm SMI's (crate::hip::info): the library
//! answers first (its errors pass through unchanged), then for a limited device total =
//! min(limit, physical), used = the container's usage.
//!
//! AMD SMI works on opaque processor handles. A handle is mapped to a device as the library
//! itself identifies it: by its UUID (`amdsmi_get_gpu_device_uuid`), which the library
//! generates from the device's unique id (the ASIC serial, the same number as ROCm SMI's
//! `rsmi_dev_unique_id_get`: bits 0-47 in the last group, 48-55 in the two digits after the
//! variant, 56-63 in the first two), matched to the ledger record as ROCm SMI's unique id is;
//! and by its position in the library's own enumeration (sockets, then each socket's
//! processors: the physical index, in BDF order like ROCm SMI's), which gives the HIP ordinal
//! whose limit applies (after `ROCR_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES`).
//!
//! Not wrapped: `amdsmi_get_gpu_vram_info` (`amd-smi static --vram`: the board's VRAM size;
//! its struct differs between library versions), process lists, partitions.

#![allow(non_snake_case)]

use super::enabled;
use super::info::smi_answer;
use crate::real::Handle;
use crate::real::hip::{
    self as real, AMDSMI_MEM_TYPE_VRAM, AMDSMI_STATUS_INIT_ERROR, AmdsmiStatus, VramUsage,
};
use std::ffi::{c_char, c_int, c_uint};

/// Sockets and processors looked at, at most, when a handle's position is searched.
const MAX_HANDLES: usize = 64;

/// The unique id (ASIC serial) in an AMD SMI UUID (`XXXXXXXX-XXXX-1XXX-8XXX-XXXXXXXXXXXX`).
pub fn serial_of_uuid(s: &str) -> Option<u64> {
    let parts: Vec<&str> = s.trim().split('-').collect();
    let [first, _, _, clk, last] = parts[..] else {
        return None;
    };
    if first.len() != 8 || clk.len() != 4 || last.len() != 12 {
        return None;
    }
    let hex = |h: &str| u64::from_str_radix(h, 16).ok();
    let top = hex(&first[..2])?;
    let b6 = hex(&clk[2..])?;
    let low = hex(last)?;
    Some(top << 56 | b6 << 48 | low)
}

/// The unique id of processor `h`, read from its UUID.
fn serial(h: Handle) -> Option<u64> {
    let f = real::AMDSMI_GET_GPU_DEVICE_UUID.get()?;
    let mut buf = [0 as c_char; 64];
    let mut len = buf.len() as c_uint;
    // SAFETY: amdsmi_get_gpu_device_uuid(handle, unsigned *len, char *) with a buffer of
    // `len` bytes.
    if unsafe { f(h, &mut len, buf.as_mut_ptr()) } != 0 {
        return None;
    }
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated (the last byte is forced to NUL above).
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    serial_of_uuid(&s.to_string_lossy())
}

/// The position of processor `h` in the library's enumeration: the physical index.
fn physical_index(h: Handle) -> Option<u32> {
    let sockets_of = real::AMDSMI_GET_SOCKET_HANDLES.get()?;
    let procs_of = real::AMDSMI_GET_PROCESSOR_HANDLES.get()?;
    let mut sockets = [std::ptr::null_mut(); MAX_HANDLES];
    let mut n = MAX_HANDLES as u32;
    // SAFETY: an array of `n` handles and its capacity.
    if unsafe { sockets_of(&mut n, sockets.as_mut_ptr()) } != 0 {
        return None;
    }
    let mut index = 0u32;
    for &s in &sockets[..(n as usize).min(MAX_HANDLES)] {
        let mut procs = [std::ptr::null_mut(); MAX_HANDLES];
        let mut k = MAX_HANDLES as u32;
        // SAFETY: a socket handle the library just gave, an array of `k` handles.
        if unsafe { procs_of(s, &mut k, procs.as_mut_ptr()) } != 0 {
            return None;
        }
        for &p in &procs[..(k as usize).min(MAX_HANDLES)] {
            if p == h {
                return Some(index);
            }
            index += 1;
        }
    }
    None
}

/// (limit, used) that processor `h` answers with; None: not limited.
fn view(h: Handle) -> Option<(u64, u64)> {
    if !enabled() {
        return None;
    }
    smi_answer(physical_index(h), serial(h))
}

/// `amdsmi_get_gpu_memory_total` and `_usage`: the real call, then `pick` of the view.
///
/// # Safety
/// `f` is the real entry point; the caller's arguments as the API documents them.
unsafe fn memory(
    f: Option<unsafe extern "C" fn(Handle, c_int, *mut u64) -> AmdsmiStatus>,
    h: Handle,
    ty: c_int,
    out: *mut u64,
    pick: fn(u64, (u64, u64)) -> u64,
) -> AmdsmiStatus {
    let Some(f) = f else {
        return AMDSMI_STATUS_INIT_ERROR;
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(h, ty, out) };
    if rc != 0 || ty != AMDSMI_MEM_TYPE_VRAM || out.is_null() {
        return rc;
    }
    if let Some(v) = view(h) {
        // SAFETY: the caller's out-pointer, just written by the library.
        unsafe { out.write_unaligned(pick(out.read_unaligned(), v)) };
    }
    rc
}

/// # Safety
/// The AMD SMI contract of `amdsmi_get_gpu_memory_total`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_memory_total(
    h: Handle,
    ty: c_int,
    total: *mut u64,
) -> AmdsmiStatus {
    let f = real::AMDSMI_GET_GPU_MEMORY_TOTAL.load();
    // SAFETY: the real entry point and the caller's arguments.
    unsafe { memory(f, h, ty, total, |t, (limit, _)| t.min(limit)) }
}

/// # Safety
/// The AMD SMI contract of `amdsmi_get_gpu_memory_usage`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_memory_usage(
    h: Handle,
    ty: c_int,
    used: *mut u64,
) -> AmdsmiStatus {
    let f = real::AMDSMI_GET_GPU_MEMORY_USAGE.load();
    // SAFETY: the real entry point and the caller's arguments.
    unsafe { memory(f, h, ty, used, |_, (_, u)| u) }
}

/// # Safety
/// The AMD SMI contract of `amdsmi_get_gpu_vram_usage` (MB).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_vram_usage(h: Handle, out: *mut VramUsage) -> AmdsmiStatus {
    let Some(f) = real::AMDSMI_GET_GPU_VRAM_USAGE.load() else {
        return AMDSMI_STATUS_INIT_ERROR;
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(h, out) };
    if rc != 0 || out.is_null() {
        return rc;
    }
    if let Some((limit, used)) = view(h) {
        // SAFETY: the caller's out-pointer, just written by the library.
        let mut v = unsafe { out.read_unaligned() };
        let mb = |b: u64| (b >> 20).min(u64::from(u32::MAX)) as u32;
        v.vram_total = v.vram_total.min(mb(limit));
        v.vram_used = mb(used);
        // SAFETY: writing the caller's out-pointer.
        unsafe { out.write_unaligned(v) };
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::serial_of_uuid;

    #[test]
    fn the_serial_is_read_back_from_the_libraries_uuid_layout() {
        // did 0x74a1, fcn 0xff, serial 0xAB_CD_1234_89ABCDEF.
        assert_eq!(
            serial_of_uuid("abff74a1-0000-1000-80cd-123489abcdef"),
            Some(0xabcd_1234_89ab_cdef)
        );
        assert_eq!(
            serial_of_uuid("00ff74a1-0000-1000-8000-000000000003"),
            Some(3)
        );
        assert_eq!(serial_of_uuid("GPU-5e1a"), None);
        assert_eq!(serial_of_uuid("abff74a1-0000-1000-80cd-12348"), None);
        assert_eq!(serial_of_uuid("zzff74a1-0000-1000-80cd-123489abcdef"), None);
    }
}
