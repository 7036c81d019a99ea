//! A subset of AMD SMI (`libamd_smi.so`, what `amd-smi` and its Python package use): init,
//! socket and processor handles, the device UUID, VRAM total and usage, from the shared
//! state. One socket per physical device with one processor each (no partitions); handles
//! are opaque small numbers. Devices are physical, in the order of ROCm SMI's indices. The
//! UUID has the layout the real library generates from the device's unique id (the ASIC
//! serial: its low 48 bits in the last group, bits 48-55 after the variant, bits 56-63 first)
//! and device id, so a tool can match it to the SMI unique id and the HIP/CUDA UUID.

use super::smi::unique_id;
use crate::ffi::put;
use crate::state::shared;
use std::ffi::c_char;

pub type AmdsmiStatus = u32;
pub const AMDSMI_STATUS_SUCCESS: AmdsmiStatus = 0;
pub const AMDSMI_STATUS_INVAL: AmdsmiStatus = 1;
pub const AMDSMI_STATUS_NOT_SUPPORTED: AmdsmiStatus = 2;
pub const AMDSMI_STATUS_INIT_ERROR: AmdsmiStatus = 18;
/// `AMDSMI_MEM_TYPE_VRAM`.
pub const AMDSMI_MEM_TYPE_VRAM: i32 = 0;
/// `AMDSMI_GPU_UUID_SIZE`: the UUID's 36 characters, its NUL and one spare.
pub const AMDSMI_GPU_UUID_SIZE: u32 = 38;
/// The PCI device id the simulated GPUs report.
const DEVICE_ID: u16 = 0x74a1;

const SOCKET_BASE: usize = 0x50c0_0000;
const PROCESSOR_BASE: usize = 0x9c00_0000;

/// `amdsmi_vram_usage_t` (MB).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct VramUsage {
    pub vram_total: u32,
    pub vram_used: u32,
    pub reserved: [u32; 2],
}

fn devices() -> Result<usize, AmdsmiStatus> {
    shared()
        .map(crate::state::Shared::devices)
        .ok_or(AMDSMI_STATUS_INIT_ERROR)
}

fn device_of(h: usize, base: usize) -> Result<usize, AmdsmiStatus> {
    let d = h.checked_sub(base).ok_or(AMDSMI_STATUS_INVAL)?;
    if d < devices()? {
        Ok(d)
    } else {
        Err(AMDSMI_STATUS_INVAL)
    }
}

fn status(r: Result<(), AmdsmiStatus>) -> AmdsmiStatus {
    r.err().unwrap_or(AMDSMI_STATUS_SUCCESS)
}

/// The UUID string of physical device `d` (36 characters).
pub fn uuid_string(d: usize) -> String {
    let serial = unique_id(d);
    let time_low = ((serial >> 56) as u32) << 24 | 0xff << 16 | u32::from(DEVICE_ID);
    format!(
        "{time_low:08x}-0000-1000-80{:02x}-{:04x}{:08x}",
        (serial >> 48) as u8,
        (serial >> 32) as u16,
        serial as u32
    )
}

pub extern "C" fn amdsmi_init(_flags: u64) -> AmdsmiStatus {
    if crate::process::init().is_some() {
        AMDSMI_STATUS_SUCCESS
    } else {
        AMDSMI_STATUS_INIT_ERROR
    }
}

pub extern "C" fn amdsmi_shut_down() -> AmdsmiStatus {
    AMDSMI_STATUS_SUCCESS
}

/// Writes `n` handles `base + i` into `out` (capacity `*count`), or only the count if `out`
/// is NULL, as the real library does.
fn handles(n: usize, base: usize, count: *mut u32, out: *mut usize) -> AmdsmiStatus {
    if count.is_null() {
        return AMDSMI_STATUS_INVAL;
    }
    if out.is_null() {
        put(count, n as u32);
        return AMDSMI_STATUS_SUCCESS;
    }
    // SAFETY: a non-NULL in/out pointer from the caller (API contract).
    let cap = unsafe { count.read_unaligned() } as usize;
    let k = n.min(cap);
    for i in 0..k {
        // SAFETY: `out` holds `*count` handles (API contract); i < that.
        unsafe { out.add(i).write_unaligned(base + i) };
    }
    put(count, k as u32);
    AMDSMI_STATUS_SUCCESS
}

/// `amdsmi_get_socket_handles(uint32_t *socket_count, amdsmi_socket_handle *)`.
pub extern "C" fn amdsmi_get_socket_handles(count: *mut u32, out: *mut usize) -> AmdsmiStatus {
    match devices() {
        Ok(n) => handles(n, SOCKET_BASE, count, out),
        Err(e) => e,
    }
}

/// `amdsmi_get_processor_handles(socket, uint32_t *count, amdsmi_processor_handle *)`.
pub extern "C" fn amdsmi_get_processor_handles(
    socket: usize,
    count: *mut u32,
    out: *mut usize,
) -> AmdsmiStatus {
    match device_of(socket, SOCKET_BASE) {
        Ok(d) => handles(1, PROCESSOR_BASE + d, count, out),
        Err(e) => e,
    }
}

/// `amdsmi_get_gpu_device_uuid(handle, unsigned int *uuid_length, char *uuid)`.
pub extern "C" fn amdsmi_get_gpu_device_uuid(
    h: usize,
    len: *mut u32,
    uuid: *mut c_char,
) -> AmdsmiStatus {
    status(device_of(h, PROCESSOR_BASE).and_then(|d| {
        if len.is_null() || uuid.is_null() {
            return Err(AMDSMI_STATUS_INVAL);
        }
        // SAFETY: a non-NULL in/out pointer from the caller (API contract).
        if unsafe { len.read_unaligned() } < AMDSMI_GPU_UUID_SIZE {
            return Err(AMDSMI_STATUS_INVAL);
        }
        let s = uuid_string(d);
        crate::ffi::put_str(uuid, AMDSMI_GPU_UUID_SIZE as usize, &s);
        put(len, s.len() as u32);
        Ok(())
    }))
}

fn memory(h: usize, ty: i32, out: *mut u64, pick: fn(u64, u64) -> u64) -> AmdsmiStatus {
    status(device_of(h, PROCESSOR_BASE).and_then(|d| {
        if ty != AMDSMI_MEM_TYPE_VRAM {
            return Err(AMDSMI_STATUS_NOT_SUPPORTED);
        }
        let s = shared().ok_or(AMDSMI_STATUS_INIT_ERROR)?;
        let (free, total) = s.mem_info(d);
        put(out, pick(free, total))
            .then_some(())
            .ok_or(AMDSMI_STATUS_INVAL)
    }))
}

/// `amdsmi_get_gpu_memory_total(handle, amdsmi_memory_type_t, uint64_t *)`.
pub extern "C" fn amdsmi_get_gpu_memory_total(h: usize, ty: i32, total: *mut u64) -> AmdsmiStatus {
    memory(h, ty, total, |_, t| t)
}

/// `amdsmi_get_gpu_memory_usage(handle, amdsmi_memory_type_t, uint64_t *)`.
pub extern "C" fn amdsmi_get_gpu_memory_usage(h: usize, ty: i32, used: *mut u64) -> AmdsmiStatus {
    memory(h, ty, used, |f, t| t - f)
}

/// `amdsmi_get_gpu_vram_usage(handle, amdsmi_vram_usage_t *)`: MB.
pub extern "C" fn amdsmi_get_gpu_vram_usage(h: usize, out: *mut VramUsage) -> AmdsmiStatus {
    status(device_of(h, PROCESSOR_BASE).and_then(|d| {
        let s = shared().ok_or(AMDSMI_STATUS_INIT_ERROR)?;
        let (free, total) = s.mem_info(d);
        let mb = |b: u64| (b >> 20).min(u64::from(u32::MAX)) as u32;
        let v = VramUsage {
            vram_total: mb(total),
            vram_used: mb(total - free),
            reserved: [0; 2],
        };
        put(out, v).then_some(()).ok_or(AMDSMI_STATUS_INVAL)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uuid_carries_the_unique_id_where_the_real_library_puts_it() {
        let s = uuid_string(3);
        assert_eq!(s.len(), 36);
        // unique_id(3): the UUID's second half, big-endian = 0x0000_0000_0000_0003.
        assert_eq!(unique_id(3), 3);
        assert_eq!(s, "00ff74a1-0000-1000-8000-000000000003");
    }
}
