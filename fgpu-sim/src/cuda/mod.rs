//! The CUDA driver API (implementations; the exported symbols are trampolines in
//! `crate::exports`).

pub mod array;
pub mod batch;
pub mod context;
pub mod copy;
pub mod device;
pub mod export_table;
pub mod gpa;
pub mod host;
pub mod launch;
pub mod memory;
pub mod pool;
pub mod stream;
pub mod vmm;

use std::ffi::c_char;

pub type CUresult = i32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;
/// Opaque handles (CUcontext, CUstream, CUevent, CUmodule, ...) travel as pointer-sized values.
pub type Handle = usize;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;

pub const DRIVER_VERSION: i32 = 13000;

/// Converts an internal `Result` into a CUresult.
pub fn rc(r: Result<(), CUresult>) -> CUresult {
    match r {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => e,
    }
}

const ERRORS: &[(CUresult, &str, &str)] = &[
    (0, "CUDA_SUCCESS\0", "no error\0"),
    (1, "CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
    (3, "CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
    (4, "CUDA_ERROR_DEINITIALIZED\0", "driver shutting down\0"),
    (
        100,
        "CUDA_ERROR_NO_DEVICE\0",
        "no CUDA-capable device is detected\0",
    ),
    (
        101,
        "CUDA_ERROR_INVALID_DEVICE\0",
        "invalid device ordinal\0",
    ),
    (
        200,
        "CUDA_ERROR_INVALID_IMAGE\0",
        "device kernel image is invalid\0",
    ),
    (
        201,
        "CUDA_ERROR_INVALID_CONTEXT\0",
        "invalid device context\0",
    ),
    (
        400,
        "CUDA_ERROR_INVALID_HANDLE\0",
        "invalid resource handle\0",
    ),
    (
        401,
        "CUDA_ERROR_ILLEGAL_STATE\0",
        "the operation cannot be performed in the present state\0",
    ),
    (500, "CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
    (600, "CUDA_ERROR_NOT_READY\0", "device not ready\0"),
    (
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS\0",
        "an illegal memory access was encountered\0",
    ),
    (
        801,
        "CUDA_ERROR_NOT_SUPPORTED\0",
        "operation not supported\0",
    ),
    (
        903,
        "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED\0",
        "capture was not initiated in this stream\0",
    ),
    (999, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

fn error_text(code: CUresult, name: bool, out: *mut *const c_char) -> CUresult {
    match ERRORS.iter().find(|e| e.0 == code) {
        Some(e) => {
            let s = if name { e.1 } else { e.2 };
            crate::ffi::put(out, s.as_ptr().cast::<c_char>());
            CUDA_SUCCESS
        }
        None => {
            crate::ffi::put(out, std::ptr::null());
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

pub extern "C" fn get_error_string(code: CUresult, out: *mut *const c_char) -> CUresult {
    error_text(code, false, out)
}

pub extern "C" fn get_error_name(code: CUresult, out: *mut *const c_char) -> CUresult {
    error_text(code, true, out)
}
