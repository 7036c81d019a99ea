//! Devices: hipInit, counts, the current device, UUIDs, total memory, hipGetProcAddress.

use super::*;
use crate::cuda::device as cu;
use crate::ffi::{put, str_arg};
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

/// HIP_VERSION of the simulated runtime (7.0).
pub const HIP_VERSION: i32 = 70_000_000;

/// The simulated UUID of physical device `p` as lowercase hex (32 digits).
pub fn uuid_hex(p: usize) -> String {
    cu::uuid_bytes(p)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub extern "C" fn hip_init(flags: u32) -> HipError {
    if flags != 0 {
        return HIP_ERROR_INVALID_VALUE;
    }
    match initialize() {
        Ok(()) => HIP_SUCCESS,
        Err(e) => e,
    }
}

pub extern "C" fn hip_get_device_count(out: *mut i32) -> HipError {
    if let Err(e) = initialize() {
        put(out, 0);
        return e;
    }
    if put(out, visible().len() as i32) {
        HIP_SUCCESS
    } else {
        HIP_ERROR_INVALID_VALUE
    }
}

pub extern "C" fn hip_set_device(ord: i32) -> HipError {
    if let Err(e) = initialize() {
        return e;
    }
    match physical(ord) {
        Ok(_) => {
            set_current_ordinal(ord);
            HIP_SUCCESS
        }
        Err(e) => e,
    }
}

pub extern "C" fn hip_get_device(out: *mut i32) -> HipError {
    if let Err(e) = initialize() {
        return e;
    }
    if put(out, current_ordinal()) {
        HIP_SUCCESS
    } else {
        HIP_ERROR_INVALID_VALUE
    }
}

/// The 16 bytes `hipDeviceGetUuid` reports for physical device `p`: the same bytes the CUDA
/// personality and NVML report, so a device has one identity everywhere; or, with
/// `FGPU_SIM_HIP_UUID=rocm`, ROCm's form — the 16 lowercase hex digits of the SMI unique id
/// as ASCII — as on an AMD node, where no CUDA or NVML names the device.
pub fn hip_uuid(p: usize) -> [u8; 16] {
    static ROCM: OnceLock<bool> = OnceLock::new();
    if *ROCM.get_or_init(|| std::env::var("FGPU_SIM_HIP_UUID").is_ok_and(|v| v == "rocm")) {
        let mut b = [0u8; 16];
        b.copy_from_slice(format!("{:016x}", super::smi::unique_id(p)).as_bytes());
        return b;
    }
    cu::uuid_bytes(p)
}

/// `hipDeviceGetUuid(hipUUID *, hipDevice_t)`: [`hip_uuid`].
pub extern "C" fn hip_device_get_uuid(out: *mut [u8; 16], ord: i32) -> HipError {
    if let Err(e) = initialize() {
        return e;
    }
    match physical(ord) {
        Ok(p) if put(out, hip_uuid(p)) => HIP_SUCCESS,
        Ok(_) => HIP_ERROR_INVALID_VALUE,
        Err(e) => e,
    }
}

pub extern "C" fn hip_device_total_mem(out: *mut usize, ord: i32) -> HipError {
    if let Err(e) = initialize() {
        return e;
    }
    match physical(ord) {
        Ok(p) => match cuda_ord(p) {
            Ok(o) => cu::cu_device_total_mem(out, o),
            Err(e) => e,
        },
        Err(e) => e,
    }
}

pub extern "C" fn hip_device_get_name(name: *mut c_char, len: i32, ord: i32) -> HipError {
    if let Err(e) = initialize() {
        return e;
    }
    match physical(ord) {
        Ok(p) => match cuda_ord(p) {
            Ok(o) => cu::cu_device_get_name(name, len, o),
            Err(e) => e,
        },
        Err(e) => e,
    }
}

pub extern "C" fn hip_version(out: *mut i32) -> HipError {
    if put(out, HIP_VERSION) {
        HIP_SUCCESS
    } else {
        HIP_ERROR_INVALID_VALUE
    }
}

/// `hipGetProcAddress(symbol, pfn, hipVersion, flags, symbolStatus)` (ROCm 6.2+): the
/// address of our own exported entry point of that name (never dlsym), status 0 found / 1
/// not found (`hipDriverProcAddressQueryResult`).
pub extern "C" fn hip_get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _version: i32,
    _flags: u64,
    status: *mut i32,
) -> HipError {
    let Some(name) = str_arg(symbol) else {
        return HIP_ERROR_INVALID_VALUE;
    };
    if pfn.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    match crate::exports_hip::entry(name) {
        Some(f) => {
            put(pfn, f as *mut c_void);
            put(status, 0);
            HIP_SUCCESS
        }
        None => {
            put(pfn, std::ptr::null_mut());
            put(status, 1);
            HIP_ERROR_NOT_FOUND
        }
    }
}
