//! Memory answers for HIP (`hipMemGetInfo`, `hipDeviceTotalMem`) and ROCm SMI
//! (`rsmi_dev_memory_total_get`, `rsmi_dev_memory_usage_get`, VRAM), as CUDA's and NVML's:
//! the runtime or library answers first (its errors pass through unchanged), then for a
//! limited device total = min(limit, physical), used = the container's usage (or the
//! kernel's figure from the agent if larger), free = min(physical free, total − used).
//!
//! SMI devices are physical and have no HIP ordinal: an SMI device is matched to the ledger
//! record whose UUID carries its unique id (`rsmi_dev_unique_id_get`): either the 16 ASCII
//! hex digits of it (what ROCm's `hipDeviceGetUuid` returns) or its 8 bytes big-endian in the
//! UUID's second half (the simulator). Until a HIP process of the container has bound the
//! device, used is 0 and the limit is the one of that device's SMI index.

#![allow(non_snake_case)]

use super::{current_ordinal, dev_index, enabled};
use crate::account;
use crate::ledger;
use crate::real::hip::{
    self as real, HipError, RSMI_MEM_TYPE_VRAM, RSMI_STATUS_INIT_ERROR, RsmiStatus,
};
use crate::real::real_or_3;
use fgpu_common::ledger::{Ledger, MAX_DEVICES, NO_LIMIT};
use std::ffi::c_int;

/// (limit, used) of HIP device `ord`, or None if it is not limited.
fn limited(ord: c_int) -> Option<(&'static Ledger, usize, u64)> {
    let (l, _) = ledger::get()?;
    let idx = dev_index(l, ord)?;
    let limit = account::limit(l, ord, idx);
    (limit != NO_LIMIT).then_some((l, idx, limit))
}

/// # Safety
/// The HIP API contract of `hipMemGetInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipError {
    let f = real_or_3!(real::HIP_MEM_GET_INFO);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(free, total) };
    if rc != 0 || free.is_null() || total.is_null() || !enabled() {
        return rc;
    }
    let Some(ord) = current_ordinal() else {
        return rc;
    };
    let Some((l, idx, limit)) = limited(ord) else {
        return rc;
    };
    ledger::sweep_if_due();
    // SAFETY: the caller's out-pointers, just written by the runtime.
    let (pf, pt) = unsafe { (free.read_unaligned() as u64, total.read_unaligned() as u64) };
    account::check_limit_vs_device(limit, pt, ord);
    let t = pt.min(limit);
    let fr = pf.min(t.saturating_sub(account::used(l, idx)));
    // SAFETY: writing the caller's out-pointers.
    unsafe {
        free.write_unaligned(fr as usize);
        total.write_unaligned(t as usize);
    }
    rc
}

/// # Safety
/// The HIP API contract of `hipDeviceTotalMem`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipDeviceTotalMem(bytes: *mut usize, dev: c_int) -> HipError {
    let f = real_or_3!(real::HIP_DEVICE_TOTAL_MEM);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(bytes, dev) };
    if rc != 0 || bytes.is_null() || !enabled() {
        return rc;
    }
    let Some((_, _, limit)) = limited(dev) else {
        return rc;
    };
    // SAFETY: the caller's out-pointer, just written by the runtime.
    let pt = unsafe { bytes.read_unaligned() } as u64;
    account::check_limit_vs_device(limit, pt, dev);
    // SAFETY: writing the caller's out-pointer.
    unsafe { bytes.write_unaligned(pt.min(limit) as usize) };
    rc
}

/// Whether ledger UUID `u` names the SMI device with unique id `id`.
pub fn uuid_matches(u: &[u8; 16], id: u64) -> bool {
    let mut be = [0u8; 8];
    be.copy_from_slice(&u[8..]);
    if u64::from_be_bytes(be) == id && u[..8] != [0; 8] {
        return true;
    }
    std::str::from_utf8(u)
        .ok()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        == Some(id)
}

/// The HIP ordinal of physical (SMI) device `dv` in this process: `ROCR_VISIBLE_DEVICES`
/// then `HIP_VISIBLE_DEVICES` applied as the runtime does (numeric entries; an entry that
/// is not a number ends the list). None: not visible to HIP here (the default limit applies).
pub fn hip_ordinal(dv: u32) -> Option<usize> {
    let mut order: Vec<u32> = (0..MAX_DEVICES as u32).collect();
    for var in ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"] {
        if let Ok(list) = std::env::var(var) {
            order = list
                .split(',')
                .map_while(|e| e.trim().parse::<usize>().ok())
                .map_while(|i| order.get(i).copied())
                .collect();
        }
    }
    order.iter().position(|&p| p == dv)
}

/// (limit, used) that SMI device `dv` answers with; None: not limited.
fn smi_view(dv: u32) -> Option<(u64, u64)> {
    if !enabled() {
        return None;
    }
    let uid = real::RSMI_DEV_UNIQUE_ID_GET.get().and_then(|f| {
        let mut id = 0u64;
        // SAFETY: rsmi_dev_unique_id_get(uint32_t, uint64_t *) with a valid out-pointer.
        (unsafe { f(dv, &mut id) } == 0).then_some(id)
    });
    smi_answer(Some(dv), uid)
}

/// (limit, used) of the physical device with SMI index `dv` (None: unknown, the default
/// limit applies) and unique id `uid` (None: unknown, used 0); None: not limited. Shared by
/// ROCm SMI and AMD SMI (crate::hip::amdsmi).
pub fn smi_answer(dv: Option<u32>, uid: Option<u64>) -> Option<(u64, u64)> {
    let (l, _) = ledger::get()?;
    let ord = dv.and_then(hip_ordinal).map_or(c_int::MAX, |o| o as c_int);
    let idx = uid.and_then(|id| {
        (0..MAX_DEVICES).find(|&i| {
            l.usage.devices[i].uuid[0].load(std::sync::atomic::Ordering::SeqCst) != 0
                && uuid_matches(&l.device_uuid(i), id)
        })
    });
    let (limit, used) = match idx {
        Some(i) => (account::limit(l, ord, i), account::used(l, i)),
        None => (account::limit(l, ord, 0), 0),
    };
    (limit != NO_LIMIT).then_some((limit, used))
}

/// # Safety
/// The ROCm SMI contract of `rsmi_dev_memory_total_get`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_memory_total_get(
    dv: u32,
    ty: c_int,
    total: *mut u64,
) -> RsmiStatus {
    let Some(f) = real::RSMI_DEV_MEMORY_TOTAL_GET.load() else {
        return RSMI_STATUS_INIT_ERROR;
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(dv, ty, total) };
    if rc != 0 || ty != RSMI_MEM_TYPE_VRAM || total.is_null() {
        return rc;
    }
    if let Some((limit, _)) = smi_view(dv) {
        // SAFETY: the caller's out-pointer, just written by the library.
        unsafe { total.write_unaligned(total.read_unaligned().min(limit)) };
    }
    rc
}

/// # Safety
/// The ROCm SMI contract of `rsmi_dev_memory_usage_get`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_dev_memory_usage_get(
    dv: u32,
    ty: c_int,
    used: *mut u64,
) -> RsmiStatus {
    let Some(f) = real::RSMI_DEV_MEMORY_USAGE_GET.load() else {
        return RSMI_STATUS_INIT_ERROR;
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(dv, ty, used) };
    if rc != 0 || ty != RSMI_MEM_TYPE_VRAM || used.is_null() {
        return rc;
    }
    if let Some((_, u)) = smi_view(dv) {
        // SAFETY: writing the caller's out-pointer.
        unsafe { used.write_unaligned(u) };
    }
    rc
}
