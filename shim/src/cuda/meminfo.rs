//! CUDA memory info: `cuMemGetInfo_v2` and `cuDeviceTotalMem_v2` report the limit.
//!
//! total = min(limit, physical); used = the container's usage in the ledger (all its
//! processes, context overhead included); free = min(physical free, max(0, total − used)).
//! The driver's own answer comes first: its errors pass through unchanged, and nothing here
//! ever fails because usage is over the limit. (NVML's answers are in [`super::nvml`].)

#![allow(non_snake_case)]

use crate::account::{self, current_ordinal, dev_index};
use crate::ledger;
use crate::real::real_or_3;
use crate::real::{self, CUdevice, CUresult};
use fgpu_common::ledger::NO_LIMIT;

/// # Safety
/// The CUDA driver API contract of `cuMemGetInfo_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let f = real_or_3!(real::CU_MEM_GET_INFO);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(free, total) };
    if rc != 0 || free.is_null() || total.is_null() || !ledger::active() {
        return rc;
    }
    let Some(ord) = current_ordinal() else {
        return rc;
    };
    let Some((l, _)) = ledger::get() else {
        return rc;
    };
    let Some(idx) = dev_index(l, ord) else {
        return rc;
    };
    let limit = account::limit(l, ord, idx);
    if limit == NO_LIMIT {
        return rc;
    }
    ledger::sweep_if_due();
    super::context::maybe_refresh_overhead(ord, idx, false);
    // SAFETY: the caller's out-pointers, just written by the driver.
    let (pf, pt) = unsafe { (free.read_unaligned() as u64, total.read_unaligned() as u64) };
    account::check_limit_vs_device(limit, pt, ord);
    let t = pt.min(limit);
    let f = pf.min(t.saturating_sub(account::used(l, idx)));
    // SAFETY: writing the caller's out-pointers.
    unsafe {
        free.write_unaligned(f as usize);
        total.write_unaligned(t as usize);
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuDeviceTotalMem_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let f = real_or_3!(real::CU_DEVICE_TOTAL_MEM);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(bytes, dev) };
    if rc != 0 || bytes.is_null() || !ledger::active() {
        return rc;
    }
    let Some((l, _)) = ledger::get() else {
        return rc;
    };
    let Some(idx) = dev_index(l, dev) else {
        return rc;
    };
    let limit = account::limit(l, dev, idx);
    // SAFETY: the caller's out-pointer, just written by the driver.
    let pt = unsafe { bytes.read_unaligned() } as u64;
    account::check_limit_vs_device(limit, pt, dev);
    // SAFETY: writing the caller's out-pointer.
    unsafe { bytes.write_unaligned(pt.min(limit) as usize) };
    rc
}
