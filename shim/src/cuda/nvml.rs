//! NVML: the memory-info answers (`nvmlDeviceGetMemoryInfo`, `_v2`), and the shim's own
//! queries used to measure context overhead (device usage, this process's usage).
//!
//! The shim initialises NVML itself only when it measures a context's overhead (first
//! context per device); NVML keeps an init count, so the program's own nvmlShutdown does not
//! pull it from under us.

#![allow(non_snake_case)]

use crate::account;
use crate::config;
use crate::ledger;
use crate::real::{
    self, Lib, NVML_ERROR_UNINITIALIZED, NvmlDevice, NvmlMemory, NvmlMemoryV2, NvmlProcessInfo,
    NvmlReturn,
};
use fgpu_common::ledger::NO_LIMIT;
use std::ffi::{c_char, c_uint};
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};

static INIT: AtomicU8 = AtomicU8::new(0);

/// NVML loaded and initialised by the shim (tried once).
pub fn ensure() -> bool {
    match INIT.load(SeqCst) {
        1 => true,
        2 => false,
        _ => {
            let ok = real::resolve(Lib::Nvml, true)
                && real::NVML_INIT_V2
                    .get()
                    // SAFETY: nvmlInit_v2() takes no arguments.
                    .is_some_and(|f| unsafe { f() } == 0);
            INIT.store(if ok { 1 } else { 2 }, SeqCst);
            ok
        }
    }
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx\0" for a 16-byte UUID.
pub fn uuid_string(u: &[u8; 16]) -> [u8; 41] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 41];
    out[..4].copy_from_slice(b"GPU-");
    let mut pos = 4;
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out[pos] = b'-';
            pos += 1;
        }
        out[pos] = HEX[(b >> 4) as usize];
        out[pos + 1] = HEX[(b & 15) as usize];
        pos += 2;
    }
    out
}

/// Parses NVML's UUID text (`GPU-` + 32 hex digits with dashes) into 16 bytes.
pub fn parse_uuid(s: &[u8]) -> Option<[u8; 16]> {
    let s = s.strip_prefix(b"GPU-").unwrap_or(s);
    let mut out = [0u8; 16];
    let mut n = 0;
    for &c in s.iter().take_while(|&&c| c != 0) {
        let v = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            b'-' => continue,
            _ => return None,
        };
        if n >= 32 {
            return None;
        }
        out[n / 2] |= if n % 2 == 0 { v << 4 } else { v };
        n += 1;
    }
    (n == 32).then_some(out)
}

fn handle_for(uuid: &[u8; 16]) -> Option<NvmlDevice> {
    let f = real::NVML_DEVICE_GET_HANDLE_BY_UUID.get()?;
    let s = uuid_string(uuid);
    let mut h: NvmlDevice = std::ptr::null_mut();
    // SAFETY: nvmlDeviceGetHandleByUUID(const char*, nvmlDevice_t*): NUL-terminated string
    // and a valid out-pointer.
    let rc = unsafe { f(s.as_ptr().cast(), &mut h) };
    (rc == 0 && !h.is_null()).then_some(h)
}

/// Device-wide used bytes (real NVML), if NVML is available.
pub fn device_used(uuid: &[u8; 16]) -> Option<u64> {
    if !ensure() {
        return None;
    }
    let h = handle_for(uuid)?;
    let f = real::NVML_DEVICE_GET_MEMORY_INFO.get()?;
    let mut m = NvmlMemory::default();
    // SAFETY: nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t*) with a valid out-pointer.
    let rc = unsafe { f(h, &mut m) };
    (rc == 0).then_some(m.used)
}

/// What NVML says this process uses on the device, if NVML lists it under our pid (it does
/// not when we run in a PID namespace of our own: NVML reports host pids).
pub fn process_used(uuid: &[u8; 16]) -> Option<u64> {
    if !ensure() {
        return None;
    }
    let h = handle_for(uuid)?;
    let f = real::NVML_DEVICE_GET_COMPUTE_RUNNING_PROCESSES_V3.get()?;
    let mut list = [NvmlProcessInfo::default(); 64];
    let mut n: c_uint = list.len() as c_uint;
    // SAFETY: a buffer of `n` entries and a valid count pointer.
    let rc = unsafe { f(h, &mut n, list.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as c_uint;
    list[..(n as usize).min(list.len())]
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.used_gpu_memory)
}

/// (ledger device, limit) for an NVML device handle; None if no limit applies.
fn view(dev: NvmlDevice) -> Option<(usize, u64)> {
    let mut buf = [0 as c_char; 96];
    let f = real::NVML_DEVICE_GET_UUID.get()?;
    // SAFETY: nvmlDeviceGetUUID(nvmlDevice_t, char*, unsigned) with our buffer and its size.
    if unsafe { f(dev, buf.as_mut_ptr(), buf.len() as c_uint) } != 0 {
        return None;
    }
    let bytes = buf.map(|c| c as u8);
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let text = std::str::from_utf8(&bytes[..len]).unwrap_or("");
    let mut index: c_uint = u32::MAX;
    if let Some(gi) = real::NVML_DEVICE_GET_INDEX.get() {
        // SAFETY: nvmlDeviceGetIndex(nvmlDevice_t, unsigned*) with a valid out-pointer.
        unsafe { gi(dev, &mut index) };
    }
    let uuid = parse_uuid(&bytes[..len])?;
    let (l, _) = ledger::get()?;
    let idx = l.device_index(&uuid)?;
    let limit = config::get().limit_for_nvml(index, text).min(l.limit(idx));
    (limit != NO_LIMIT).then_some((idx, limit))
}

fn with_view(dev: NvmlDevice, total: &mut u64) -> Option<u64> {
    let (idx, limit) = view(dev)?;
    account::check_limit_vs_device(limit, *total, "(NVML)");
    *total = (*total).min(limit);
    ledger::sweep_if_due();
    let (l, _) = ledger::get()?;
    Some(account::used(l, idx))
}

/// # Safety
/// The NVML contract of `nvmlDeviceGetMemoryInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: NvmlDevice,
    mem: *mut NvmlMemory,
) -> NvmlReturn {
    let Some(f) = real::NVML_DEVICE_GET_MEMORY_INFO.load() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(dev, mem) };
    if rc != 0 || mem.is_null() || !ledger::active() {
        return rc;
    }
    // SAFETY: the caller's struct, just filled in by NVML.
    let mut m = unsafe { mem.read_unaligned() };
    let mut total = m.total;
    if let Some(used) = with_view(dev, &mut total) {
        m.free = m.free.min(total.saturating_sub(used));
        m.used = used.min(total);
        m.total = total;
        // SAFETY: writing back the caller's struct.
        unsafe { mem.write_unaligned(m) };
    }
    rc
}

/// # Safety
/// The NVML contract of `nvmlDeviceGetMemoryInfo_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: NvmlDevice,
    mem: *mut NvmlMemoryV2,
) -> NvmlReturn {
    let Some(f) = real::NVML_DEVICE_GET_MEMORY_INFO_V2.load() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(dev, mem) };
    if rc != 0 || mem.is_null() || !ledger::active() {
        return rc;
    }
    // SAFETY: the caller's struct, just filled in by NVML.
    let mut m = unsafe { mem.read_unaligned() };
    let mut total = m.total;
    if let Some(used) = with_view(dev, &mut total) {
        m.reserved = m.reserved.min(total);
        m.used = used.min(total - m.reserved);
        m.free = m.free.min(total - m.reserved - m.used);
        m.total = total;
        // SAFETY: writing back the caller's struct.
        unsafe { mem.write_unaligned(m) };
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_round_trip() {
        let mut u = [0u8; 16];
        u[0] = 0x5e;
        u[1] = 0x1a;
        u[15] = 3;
        let s = uuid_string(&u);
        assert_eq!(&s[..40], b"GPU-5e1a0000-0000-0000-0000-000000000003");
        assert_eq!(s[40], 0);
        assert_eq!(parse_uuid(&s), Some(u));
        assert_eq!(parse_uuid(b"GPU-12"), None);
    }
}
