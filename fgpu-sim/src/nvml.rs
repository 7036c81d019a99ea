//! NVML, answered from the shared state.
//!
//! Processes are those holding a context on the device; their pid is as the caller's PID
//! namespace sees them (host pids in the host namespace, like real NVML; see
//! [`crate::state`]). Utilisation is the share of the last full second the device timeline was busy.

use crate::cuda::device::{DEVICE_NAME, uuid_bytes};
use crate::ffi::{get, put, put_str, str_arg};
use crate::state::{MAX_DEVICES, Shared, shared};
use crate::timeline::now_ns;
use std::ffi::c_char;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

pub type NvmlReturn = i32;
pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

pub const DRIVER_VERSION: &str = "580.0.0";
const NOT_AVAILABLE: u32 = 0xFFFF_FFFF;

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
/// nvmlDevice_t handles are addresses inside this array.
static HANDLES: [u8; MAX_DEVICES] = [0; MAX_DEVICES];

fn ready() -> Result<&'static Shared, NvmlReturn> {
    if INIT_COUNT.load(SeqCst) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    shared().ok_or(NVML_ERROR_UNINITIALIZED)
}

fn device(h: *const u8) -> Result<(&'static Shared, usize), NvmlReturn> {
    let s = ready()?;
    let base = HANDLES.as_ptr() as usize;
    let idx = (h as usize).wrapping_sub(base);
    if idx < s.devices() {
        Ok((s, idx))
    } else {
        Err(NVML_ERROR_INVALID_ARGUMENT)
    }
}

fn ret(r: Result<(), NvmlReturn>) -> NvmlReturn {
    r.err().unwrap_or(NVML_SUCCESS)
}

fn arg(ok: bool) -> Result<(), NvmlReturn> {
    ok.then_some(()).ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

pub fn uuid_string(idx: usize) -> String {
    let b = uuid_bytes(idx);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

pub extern "C" fn init() -> NvmlReturn {
    if shared().is_none() {
        return NVML_ERROR_UNKNOWN;
    }
    INIT_COUNT.fetch_add(1, SeqCst);
    NVML_SUCCESS
}

pub extern "C" fn shutdown() -> NvmlReturn {
    match INIT_COUNT.fetch_update(SeqCst, SeqCst, |c| c.checked_sub(1)) {
        Ok(_) => NVML_SUCCESS,
        Err(_) => NVML_ERROR_UNINITIALIZED,
    }
}

pub extern "C" fn error_string(code: NvmlReturn) -> *const c_char {
    let s: &'static str = match code {
        0 => "Success\0",
        1 => "Uninitialized\0",
        2 => "Invalid Argument\0",
        3 => "Not Supported\0",
        4 => "Insufficient Permissions\0",
        5 => "Already Initialized\0",
        6 => "Not Found\0",
        7 => "Insufficient Size\0",
        25 => "Argument version mismatch\0",
        _ => "Unknown Error\0",
    };
    s.as_ptr().cast()
}

pub extern "C" fn system_get_driver_version(buf: *mut c_char, len: u32) -> NvmlReturn {
    if INIT_COUNT.load(SeqCst) == 0 {
        return NVML_ERROR_UNINITIALIZED;
    }
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if put_str(buf, len as usize, DRIVER_VERSION) {
        NVML_SUCCESS
    } else {
        NVML_ERROR_INSUFFICIENT_SIZE
    }
}

pub extern "C" fn device_get_count(count: *mut u32) -> NvmlReturn {
    ret(ready().and_then(|s| arg(put(count, s.devices() as u32))))
}

pub extern "C" fn device_get_handle_by_index(idx: u32, out: *mut *const u8) -> NvmlReturn {
    ret(ready().and_then(|s| {
        arg((idx as usize) < s.devices())?;
        arg(put(out, &HANDLES[idx as usize] as *const u8))
    }))
}

pub extern "C" fn device_get_handle_by_uuid(
    uuid: *const c_char,
    out: *mut *const u8,
) -> NvmlReturn {
    ret(ready().and_then(|s| {
        let u = str_arg(uuid).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let idx = (0..s.devices())
            .find(|&i| uuid_string(i).eq_ignore_ascii_case(u))
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        arg(put(out, &HANDLES[idx] as *const u8))
    }))
}

pub extern "C" fn device_get_index(h: *const u8, out: *mut u32) -> NvmlReturn {
    ret(device(h).and_then(|(_, i)| arg(put(out, i as u32))))
}

fn put_text(buf: *mut c_char, len: u32, s: &str) -> Result<(), NvmlReturn> {
    arg(!buf.is_null())?;
    put_str(buf, len as usize, s)
        .then_some(())
        .ok_or(NVML_ERROR_INSUFFICIENT_SIZE)
}

pub extern "C" fn device_get_name(h: *const u8, buf: *mut c_char, len: u32) -> NvmlReturn {
    ret(device(h).and_then(|_| put_text(buf, len, DEVICE_NAME)))
}

pub extern "C" fn device_get_uuid(h: *const u8, buf: *mut c_char, len: u32) -> NvmlReturn {
    ret(device(h).and_then(|(_, i)| put_text(buf, len, &uuid_string(i))))
}

#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlMemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

pub const NVML_MEMORY_V2: u32 = std::mem::size_of::<NvmlMemoryV2>() as u32 | (2 << 24);

pub extern "C" fn device_get_memory_info(h: *const u8, out: *mut NvmlMemory) -> NvmlReturn {
    ret(device(h).and_then(|(s, d)| {
        let (free, total) = s.mem_info(d);
        let used = total - free;
        arg(put(out, NvmlMemory { total, free, used }))
    }))
}

/// `reserved` is reported as 0: the simulator keeps no driver-reserved memory.
pub extern "C" fn device_get_memory_info_v2(h: *const u8, out: *mut NvmlMemoryV2) -> NvmlReturn {
    ret(device(h).and_then(|(s, d)| {
        let m = get(out).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        if m.version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (free, total) = s.mem_info(d);
        let v = NvmlMemoryV2 {
            version: m.version,
            total,
            reserved: 0,
            free,
            used: total - free,
        };
        arg(put(out, v))
    }))
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessInfo {
    pub pid: u32,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// Live processes with a context on `dev`: (slot, pid).
fn processes(s: &Shared, dev: usize) -> Vec<(usize, u32)> {
    s.live_slots()
        .into_iter()
        .filter(|&i| s.slot(i).ctx_mask.load(SeqCst) & (1 << dev) != 0)
        .map(|i| (i, s.pid_of(i)))
        .collect()
}

/// Copies `items` into a caller array of capacity `*count`, with NVML's size protocol.
fn fill<T>(count: *mut u32, buf: *mut T, items: Vec<T>) -> Result<(), NvmlReturn> {
    let cap = get(count).ok_or(NVML_ERROR_INVALID_ARGUMENT)? as usize;
    put(count, items.len() as u32);
    if items.is_empty() {
        return Ok(());
    }
    if buf.is_null() || cap < items.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, item) in items.into_iter().enumerate() {
        // SAFETY: `buf` is non-NULL and the caller promised `cap` >= items.len() entries.
        put(unsafe { buf.add(i) }, item);
    }
    Ok(())
}

pub extern "C" fn device_get_compute_running_processes(
    h: *const u8,
    count: *mut u32,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    ret(device(h).and_then(|(s, d)| {
        let items = processes(s, d)
            .into_iter()
            .map(|(slot, pid)| NvmlProcessInfo {
                pid,
                used_gpu_memory: s.slot(slot).used[d].load(SeqCst),
                gpu_instance_id: NOT_AVAILABLE,
                compute_instance_id: NOT_AVAILABLE,
            })
            .collect();
        fill(count, infos, items)
    }))
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessUtilizationSample {
    pub pid: u32,
    pub time_stamp: u64,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
}

fn realtime_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One sample per process with a context, `smUtil` = its busy share of the last second.
pub extern "C" fn device_get_process_utilization(
    h: *const u8,
    buf: *mut NvmlProcessUtilizationSample,
    count: *mut u32,
    last_seen: u64,
) -> NvmlReturn {
    ret(device(h).and_then(|(s, d)| {
        let now = now_ns();
        let ts = realtime_us();
        let items: Vec<_> = processes(s, d)
            .into_iter()
            .filter(|_| ts > last_seen)
            .map(|(slot, pid)| NvmlProcessUtilizationSample {
                pid,
                time_stamp: ts,
                sm_util: s.slot(slot).busy[d].percent_last_second(now),
                mem_util: 0,
                enc_util: 0,
                dec_util: 0,
            })
            .collect();
        if buf.is_null() {
            put(count, items.len() as u32);
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        if items.is_empty() {
            put(count, 0);
            return Err(NVML_ERROR_NOT_FOUND);
        }
        fill(count, buf, items)
    }))
}

#[repr(C)]
pub struct NvmlUtilization {
    pub gpu: u32,
    pub memory: u32,
}

/// `gpu` = % of the last second the device timeline was busy; `memory` is reported as 0.
pub extern "C" fn device_get_utilization_rates(
    h: *const u8,
    out: *mut NvmlUtilization,
) -> NvmlReturn {
    ret(device(h).and_then(|(s, d)| {
        let gpu = s.device(d).busy.percent_last_second(now_ns());
        arg(put(out, NvmlUtilization { gpu, memory: 0 }))
    }))
}
