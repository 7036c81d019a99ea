//! A subset of ROCm SMI (`librocm_smi64.so`): init, device count, name, unique id, VRAM total
//! and usage, from the shared state. Device indices are physical (SMI ignores
//! `HIP_VISIBLE_DEVICES`, as the real library does). The unique id is the last 8 bytes of the
//! device's UUID read big-endian, so a tool can match an SMI device to the HIP/CUDA UUID.

use crate::cuda::device::uuid_bytes;
use crate::ffi::{put, put_str};
use crate::state::shared;
use std::ffi::c_char;

pub type RsmiStatus = i32;
pub const RSMI_STATUS_SUCCESS: RsmiStatus = 0;
pub const RSMI_STATUS_INVALID_ARGS: RsmiStatus = 1;
pub const RSMI_STATUS_NOT_SUPPORTED: RsmiStatus = 2;
pub const RSMI_STATUS_INIT_ERROR: RsmiStatus = 8;
/// `RSMI_MEM_TYPE_VRAM`.
pub const RSMI_MEM_TYPE_VRAM: i32 = 0;

fn device(dv: u32) -> Result<usize, RsmiStatus> {
    let s = shared().ok_or(RSMI_STATUS_INIT_ERROR)?;
    let d = dv as usize;
    if d < s.devices() {
        Ok(d)
    } else {
        Err(RSMI_STATUS_INVALID_ARGS)
    }
}

fn status(r: Result<(), RsmiStatus>) -> RsmiStatus {
    r.err().unwrap_or(RSMI_STATUS_SUCCESS)
}

pub fn unique_id(d: usize) -> u64 {
    let u = uuid_bytes(d);
    let mut b = [0u8; 8];
    b.copy_from_slice(&u[8..]);
    u64::from_be_bytes(b)
}

pub extern "C" fn rsmi_init(_flags: u64) -> RsmiStatus {
    if crate::process::init().is_some() {
        RSMI_STATUS_SUCCESS
    } else {
        RSMI_STATUS_INIT_ERROR
    }
}

pub extern "C" fn rsmi_shut_down() -> RsmiStatus {
    RSMI_STATUS_SUCCESS
}

pub extern "C" fn rsmi_num_monitor_devices(out: *mut u32) -> RsmiStatus {
    let Some(s) = shared() else {
        return RSMI_STATUS_INIT_ERROR;
    };
    if put(out, s.devices() as u32) {
        RSMI_STATUS_SUCCESS
    } else {
        RSMI_STATUS_INVALID_ARGS
    }
}

pub extern "C" fn rsmi_dev_name_get(dv: u32, name: *mut c_char, len: usize) -> RsmiStatus {
    status(device(dv).and_then(|_| {
        put_str(name, len, "fgpu-sim AMD GPU")
            .then_some(())
            .ok_or(RSMI_STATUS_INVALID_ARGS)
    }))
}

pub extern "C" fn rsmi_dev_unique_id_get(dv: u32, id: *mut u64) -> RsmiStatus {
    status(device(dv).and_then(|d| {
        put(id, unique_id(d))
            .then_some(())
            .ok_or(RSMI_STATUS_INVALID_ARGS)
    }))
}

fn memory(dv: u32, ty: i32, out: *mut u64, pick: fn(u64, u64) -> u64) -> RsmiStatus {
    status(device(dv).and_then(|d| {
        if ty != RSMI_MEM_TYPE_VRAM {
            return Err(RSMI_STATUS_NOT_SUPPORTED);
        }
        let s = shared().ok_or(RSMI_STATUS_INIT_ERROR)?;
        let (free, total) = s.mem_info(d);
        put(out, pick(free, total))
            .then_some(())
            .ok_or(RSMI_STATUS_INVALID_ARGS)
    }))
}

/// `rsmi_dev_memory_total_get(dv_ind, mem_type, *total)`.
pub extern "C" fn rsmi_dev_memory_total_get(dv: u32, ty: i32, total: *mut u64) -> RsmiStatus {
    memory(dv, ty, total, |_, t| t)
}

/// `rsmi_dev_memory_usage_get(dv_ind, mem_type, *used)`.
pub extern "C" fn rsmi_dev_memory_usage_get(dv: u32, ty: i32, used: *mut u64) -> RsmiStatus {
    memory(dv, ty, used, |f, t| t - f)
}
