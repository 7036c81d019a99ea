//! Context overhead: the memory a CUDA context, its modules and library workspaces take,
//! which no allocation call shows (about 0.6 GiB per PyTorch process on an H200).
//!
//! Charged once per process and device when the first primary context is retained
//! (`cuDevicePrimaryCtxRetain`, which the CUDA runtime uses), measured as the first of:
//! 1. `FGPU_CONTEXT_OVERHEAD` if set;
//! 2. NVML's per-process figure for our pid minus what the shim already charged for this
//!    process (not managed memory) — exact when NVML reports our pid (no PID namespace);
//! 3. NVML's device-wide used memory after minus before the context was created (inside a
//!    PID namespace; other processes allocating at the same instant make it larger, never
//!    smaller than the truth);
//! 4. otherwise 0, with an info line.
//!
//! Afterwards, on allocations and memory-info queries (at most once a second, every 50 ms
//! once the device is within 10% of its limit), the NVML per-process figure is compared again
//! with what the shim charged, and the overhead raised if the driver sees more (lazily loaded
//! modules, library workspaces). It is never lowered this way. Releasing or resetting the primary context gives everything the process had on
//! that device back.

#![allow(non_snake_case)]

use super::nvml;
use crate::account::{self, MANAGED, dev_index, uuid_of_ordinal};
use crate::config::{self, MAX_ORDINALS};
use crate::ledger;
use crate::log::{debug, info};
use crate::real::real_or_3;
use crate::real::{self, CUdevice, CUresult, Handle};
use crate::sys::now_ms;
use fgpu_common::quantity::Size;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

/// Primary-context references this process holds per CUDA ordinal.
static CTX_REFS: [AtomicU32; MAX_ORDINALS] = [const { AtomicU32::new(0) }; MAX_ORDINALS];
static LAST_REFRESH_MS: AtomicU64 = AtomicU64::new(0);

fn ordinal(dev: CUdevice) -> Option<usize> {
    usize::try_from(dev).ok().filter(|&o| o < MAX_ORDINALS)
}

/// Bytes this process charged on `idx` that the driver also counts (not managed memory).
fn driver_visible(idx: usize, slot: usize) -> u64 {
    ledger::get().map_or(0, |(l, _)| {
        l.slots[slot].used[idx]
            .load(SeqCst)
            .saturating_sub(MANAGED[idx].load(SeqCst))
    })
}

fn add_overhead(idx: usize, slot: usize, n: u64) {
    if let Some((l, _)) = ledger::get() {
        l.charge(idx, slot, n);
        l.slots[slot].overhead[idx].fetch_add(n, SeqCst);
    }
}

fn charge_overhead(dev: CUdevice, before: Option<u64>) {
    let Some((l, slot)) = ledger::get() else {
        return;
    };
    let Some(idx) = dev_index(l, dev) else {
        return;
    };
    let uuid = l.device_uuid(idx);
    let (n, how) = if let Some(n) = config::get().context_overhead {
        (n, "FGPU_CONTEXT_OVERHEAD")
    } else if let Some(p) = nvml::process_used(&uuid) {
        (
            p.saturating_sub(driver_visible(idx, slot)),
            "NVML per-process usage",
        )
    } else if let (Some(b), Some(a)) = (before, nvml::device_used(&uuid)) {
        (a.saturating_sub(b), "NVML device usage before/after")
    } else {
        (0, "")
    };
    if how.is_empty() {
        info!(
            "context overhead on device {dev} could not be measured (no NVML view of this process): \
             counting 0; set FGPU_CONTEXT_OVERHEAD to charge it"
        );
    } else {
        info!("context overhead on device {dev}: {} ({how})", Size(n));
    }
    add_overhead(idx, slot, n);
    LAST_REFRESH_MS.store(now_ms(), SeqCst);
}

/// Raises this process's overhead on `idx` if NVML sees more than the shim charged: at most
/// once a second, or every 50 ms when `near_limit` (the device is close to its limit, where a
/// stale overhead matters); only while a context exists and the overhead is measured.
pub fn maybe_refresh_overhead(ord: CUdevice, idx: usize, near_limit: bool) {
    if config::get().context_overhead.is_some()
        || ordinal(ord).is_none_or(|o| CTX_REFS[o].load(SeqCst) == 0)
    {
        return;
    }
    let now = now_ms();
    let last = LAST_REFRESH_MS.load(SeqCst);
    let every = if near_limit { 50 } else { 1000 };
    if now.saturating_sub(last) < every
        || LAST_REFRESH_MS
            .compare_exchange(last, now, SeqCst, SeqCst)
            .is_err()
    {
        return;
    }
    let Some((l, slot)) = ledger::get() else {
        return;
    };
    let Some(p) = nvml::process_used(&l.device_uuid(idx)) else {
        return;
    };
    let seen = driver_visible(idx, slot);
    if p > seen {
        debug!(
            "device {ord}: NVML sees {} for this process, {} charged: overhead +{}",
            Size(p),
            Size(seen),
            Size(p - seen)
        );
        add_overhead(idx, slot, p - seen);
    }
}

/// # Safety
/// The CUDA driver API contract of `cuDevicePrimaryCtxRetain`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    let f = real_or_3!(real::CU_DEVICE_PRIMARY_CTX_RETAIN);
    let Some(o) = ordinal(dev).filter(|_| ledger::active()) else {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(pctx, dev) };
    };
    let before = if CTX_REFS[o].load(SeqCst) == 0 && config::get().context_overhead.is_none() {
        uuid_of_ordinal(dev).and_then(|u| nvml::device_used(&u))
    } else {
        None
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(pctx, dev) };
    if rc == 0 && CTX_REFS[o].fetch_add(1, SeqCst) == 0 {
        charge_overhead(dev, before);
    }
    if rc == 0 {
        // Memory backed for parking is opened to every device the process works on.
        crate::park::peers::note_device(dev);
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuDevicePrimaryCtxRelease_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    let f = real_or_3!(real::CU_DEVICE_PRIMARY_CTX_RELEASE);
    // SAFETY: forwarding the caller's argument unchanged.
    let rc = unsafe { f(dev) };
    if rc == 0
        && ledger::active()
        && let Some(o) = ordinal(dev)
    {
        let prev = CTX_REFS[o].fetch_update(SeqCst, SeqCst, |r| r.checked_sub(1));
        if prev == Ok(1) {
            account::drop_device(dev);
        }
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuDevicePrimaryCtxReset_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    let f = real_or_3!(real::CU_DEVICE_PRIMARY_CTX_RESET);
    // SAFETY: forwarding the caller's argument unchanged.
    let rc = unsafe { f(dev) };
    if rc == 0
        && ledger::active()
        && let Some(o) = ordinal(dev)
        && CTX_REFS[o].swap(0, SeqCst) > 0
    {
        account::drop_device(dev);
    }
    rc
}

/// In a fork child: the child holds no context.
pub fn reset_in_child() {
    for r in &CTX_REFS {
        r.store(0, SeqCst);
    }
    LAST_REFRESH_MS.store(0, SeqCst);
}
