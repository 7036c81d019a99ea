//! Initialisation and device queries.

use super::*;
use crate::ffi::{put, put_str};
use crate::process::{init, local};
use crate::state::{Shared, shared};
use crate::visible;

pub const DEVICE_NAME: &str = "fgpu-sim H200";

/// The 16 UUID bytes of device `idx` (NVML prints them as `GPU-5e1a0000-...-0000000000NN`).
pub fn uuid_bytes(idx: usize) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = 0x5e;
    b[1] = 0x1a;
    b[15] = idx as u8;
    b
}

/// The shared state, if cuInit has been called.
pub fn initialized() -> Result<&'static Shared, CUresult> {
    if !local().initialized {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    shared().ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

/// The physical device that CUDA ordinal `dev` names under this process's
/// `CUDA_VISIBLE_DEVICES` ([`crate::visible`]). Everything behind the API (contexts, charges,
/// timelines, NVML) works on physical indices.
pub fn device_index(dev: CUdevice) -> Result<usize, CUresult> {
    let s = initialized()?;
    usize::try_from(dev)
        .ok()
        .and_then(|o| visible::map(s.devices()).get(o).copied())
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// The CUDA ordinal of physical device `phys` in this process (it is visible: the caller
/// holds a context on it).
pub fn ordinal_of(phys: usize) -> Option<CUdevice> {
    let s = shared()?;
    let o = visible::map(s.devices()).iter().position(|&p| p == phys)?;
    CUdevice::try_from(o).ok()
}

pub extern "C" fn cu_init(flags: u32) -> CUresult {
    if flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match init() {
        Some(s) if visible::map(s.devices()).is_empty() => CUDA_ERROR_NO_DEVICE,
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_NOT_INITIALIZED,
    }
}

pub extern "C" fn cu_driver_get_version(v: *mut i32) -> CUresult {
    if put(v, DRIVER_VERSION) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

pub extern "C" fn cu_device_get(out: *mut CUdevice, ordinal: i32) -> CUresult {
    rc(device_index(ordinal).and_then(|_| {
        put(out, ordinal)
            .then_some(())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }))
}

pub extern "C" fn cu_device_get_count(out: *mut i32) -> CUresult {
    rc(initialized().and_then(|s| {
        put(out, visible::map(s.devices()).len() as i32)
            .then_some(())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }))
}

pub extern "C" fn cu_device_get_name(name: *mut c_char, len: i32, dev: CUdevice) -> CUresult {
    rc(device_index(dev).and_then(|_| {
        let len = usize::try_from(len).unwrap_or(0);
        // The real driver truncates; we need at least room for the NUL.
        let text = &DEVICE_NAME[..DEVICE_NAME.len().min(len.saturating_sub(1))];
        put_str(name, len, text)
            .then_some(())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }))
}

pub extern "C" fn cu_device_get_uuid(out: *mut [u8; 16], dev: CUdevice) -> CUresult {
    rc(device_index(dev).and_then(|d| {
        put(out, uuid_bytes(d))
            .then_some(())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }))
}

/// `cuDeviceCanAccessPeer(out, dev, peer)`: 1 for two different devices (the simulated
/// GPUs are all linked to each other), 0 for a device and itself, as the CUDA Driver API
/// reference (Peer Context Memory Access) says: a device is not its own peer.
pub extern "C" fn cu_device_can_access_peer(
    out: *mut i32,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    match (device_index(dev), device_index(peer)) {
        (Ok(a), Ok(b)) => {
            if put(out, i32::from(a != b)) {
                CUDA_SUCCESS
            } else {
                CUDA_ERROR_INVALID_VALUE
            }
        }
        (Err(e), _) | (_, Err(e)) => e,
    }
}

pub extern "C" fn cu_device_total_mem(out: *mut usize, dev: CUdevice) -> CUresult {
    rc(device_index(dev).and_then(|_| {
        let total = shared().map_or(0, Shared::memory) as usize;
        put(out, total)
            .then_some(())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }))
}

fn attribute(attr: i32, dev: usize) -> i32 {
    match attr {
        1 => 1024,            // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,        // MAX_BLOCK_DIM_X/Y
        4 => 64,              // MAX_BLOCK_DIM_Z
        5 => i32::MAX,        // MAX_GRID_DIM_X
        6 | 7 => 65535,       // MAX_GRID_DIM_Y/Z
        8 => 49152,           // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,           // TOTAL_CONSTANT_MEMORY
        10 => 32,             // WARP_SIZE
        11 => i32::MAX,       // MAX_PITCH
        12 => 65536,          // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,      // CLOCK_RATE (kHz)
        14 => 512,            // TEXTURE_ALIGNMENT
        16 => 132,            // MULTIPROCESSOR_COUNT
        19 => 1,              // CAN_MAP_HOST_MEMORY
        31 => 1,              // CONCURRENT_KERNELS
        33 => dev as i32 + 1, // PCI_BUS_ID
        36 => 2_619_000,      // MEMORY_CLOCK_RATE (kHz)
        37 => 6144,           // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,       // L2_CACHE_SIZE
        39 => 2048,           // MAX_THREADS_PER_MULTIPROCESSOR
        41 => 1,              // UNIFIED_ADDRESSING
        75 => 9,              // COMPUTE_CAPABILITY_MAJOR
        76 => 0,              // COMPUTE_CAPABILITY_MINOR
        83 => 1,              // MANAGED_MEMORY
        89 => 1,              // CONCURRENT_MANAGED_ACCESS
        95 => 1,              // COOPERATIVE_LAUNCH
        97 => 232_448,        // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        102 => 1,             // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        115 => 1,             // MEMORY_POOLS_SUPPORTED
        _ => 0,
    }
}

pub extern "C" fn cu_device_get_attribute(out: *mut i32, attr: i32, dev: CUdevice) -> CUresult {
    rc(device_index(dev).and_then(|d| {
        put(out, attribute(attr, d))
            .then_some(())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }))
}
