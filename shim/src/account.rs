//! The accounting core shared by every allocation path: which device, which limit, reserve
//! before the driver call, release after a failed call or a free, and the denial.
//!
//! Per-process bookkeeping lives in the [`crate::table`] tables (what each pointer or handle
//! was charged) and a few fixed arrays of atomics here. Nothing here allocates or holds a lock
//! across a driver call.

use crate::config::{self, MAX_ORDINALS};
use crate::ledger;
use crate::log::{debug, warning};
use crate::real::{self, CUdevice};
use crate::registered::Registered;
use crate::table::{Entry, Table};
use fgpu_common::ledger::{Denied, Ledger, MAX_DEVICES};
use fgpu_common::quantity::Size;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};

/// What a table entry is (low 8 bits of `Entry::meta`; then ledger device << 8, CUDA ordinal
/// << 16).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Kind {
    /// cuMemAlloc / pitch: `size` charged.
    Device = 1,
    /// cuMemAllocManaged: `size` charged.
    Managed = 2,
    /// Stream-ordered allocation: `size` handed out of pool `aux` (the pool holds the charge).
    Pool = 3,
    /// Array or mipmapped array: `size` charged.
    Array = 4,
    /// cuMemCreate handle: `size` charged, `aux` references (handle + mappings).
    Vmm = 5,
    /// A cuMemMap mapping: `size` bytes of handle `aux`.
    Mapping = 6,
    /// A memory pool: `size` charged (reserved), `aux` of it spare.
    MemPool = 7,
}

pub fn meta(kind: Kind, idx: usize, ord: CUdevice) -> u64 {
    kind as u64 | (idx as u64) << 8 | ((ord as u64) & 0xffff) << 16
}

pub fn kind_of(e: &Entry) -> u8 {
    (e.meta & 0xff) as u8
}

pub fn idx_of(e: &Entry) -> usize {
    ((e.meta >> 8) & 0xff) as usize
}

pub fn ord_of(e: &Entry) -> CUdevice {
    ((e.meta >> 16) & 0xffff) as CUdevice
}

/// Linear allocations (cuMemAlloc, pitch, managed, stream-ordered) by device pointer.
pub static PTRS: Table = Table::new(13);
/// Arrays and mipmapped arrays by handle.
pub static ARRAYS: Table = Table::new(8);
/// cuMemCreate handles.
pub static VMM: Table = Table::new(10);
/// cuMemMap mappings by start address.
pub static MAPS: Table = Table::new(12);
/// Memory pools by handle.
pub static POOLS: Table = Table::new(4);

/// CUDA ordinal → ledger device index + 1 (0: not known yet).
static ORD_IDX: [AtomicU32; MAX_ORDINALS] = [const { AtomicU32::new(0) }; MAX_ORDINALS];
/// Managed bytes this process holds per ledger device (not visible to the driver's counters).
pub static MANAGED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static DENIAL_LOGGED: AtomicBool = AtomicBool::new(false);
static BIG_LIMIT_WARNED: AtomicBool = AtomicBool::new(false);
static TABLE_FULL_WARNED: AtomicBool = AtomicBool::new(false);

/// What the accounting calls back up into, registered by lib.rs at load time.
pub struct AccountHooks {
    /// Before a CUDA reservation on device `ord` (ledger record `idx`), whether it comes near
    /// the limit: crate::cuda::context refreshes the measured context overhead.
    pub before_reserve: fn(CUdevice, usize, bool),
    /// A pool allocation's bytes came back to its pool (`pool`, `bytes`; crate::cuda::pool).
    pub pool_returned: fn(u64, u64),
}

/// The hooks (none until registered).
static HOOKS: Registered<AccountHooks> = Registered::new();

/// Registers the hooks; called once, by the library's constructor.
pub fn register_hooks(hooks: &'static AccountHooks) {
    HOOKS.set(hooks);
}

fn hooks() -> Option<&'static AccountHooks> {
    HOOKS.get()
}

/// What one reservation charged.
#[derive(Clone, Copy, Debug)]
pub struct Charge {
    pub idx: usize,
    pub ord: CUdevice,
    pub bytes: u64,
}

/// The device of the calling thread's current context (None if there is none).
pub fn current_ordinal() -> Option<CUdevice> {
    let f = real::CU_CTX_GET_DEVICE.get()?;
    let mut d: CUdevice = -1;
    // SAFETY: cuCtxGetDevice(CUdevice*) with a valid out-pointer.
    let rc = unsafe { f(&mut d) };
    (rc == 0 && d >= 0).then_some(d)
}

/// The UUID of CUDA device `ord`.
pub fn uuid_of_ordinal(ord: CUdevice) -> Option<[u8; 16]> {
    let mut u = [0u8; 16];
    let f = real::CU_DEVICE_GET_UUID_V2
        .get()
        .or_else(|| real::CU_DEVICE_GET_UUID.get())?;
    // SAFETY: cuDeviceGetUuid(_v2)(CUuuid*, CUdevice): a 16-byte out-buffer.
    let rc = unsafe { f(&mut u, ord) };
    (rc == 0).then_some(u)
}

/// The ledger device record of CUDA device `ord` (bound by UUID on first use).
pub fn dev_index(l: &Ledger, ord: CUdevice) -> Option<usize> {
    let o = usize::try_from(ord).ok().filter(|&o| o < MAX_ORDINALS)?;
    match ORD_IDX[o].load(SeqCst) {
        0 => {
            let uuid = uuid_of_ordinal(ord).unwrap_or_else(|| {
                // No UUID query: identify the device by its ordinal (single-view fallback).
                let mut u = [0xffu8; 16];
                u[0] = o as u8;
                u
            });
            let idx = l.device_index(&uuid);
            match idx {
                Some(i) => ORD_IDX[o].store(i as u32 + 1, SeqCst),
                None => crate::log::error!(
                    "more than {MAX_DEVICES} devices: device {ord} is not accounted"
                ),
            }
            idx
        }
        n => Some(n as usize - 1),
    }
}

/// The limit that applies to CUDA device `ord` (ledger record `idx`): the ledger's (the
/// agent's, read from the shared page on every call) lowered by the environment's, never
/// raised.
pub fn limit(l: &Ledger, ord: CUdevice, idx: usize) -> u64 {
    let env = config::get().limit_for_ordinal(ord.max(0) as usize);
    env.min(l.limit(idx))
}

/// What is in use on ledger device `idx`: the larger of the shims' count and what the kernel
/// saw (written by the agent; 0 without one).
pub fn used(l: &Ledger, idx: usize) -> u64 {
    l.used(idx)
        .max(l.usage.devices[idx].kernel_used.load(SeqCst))
}

/// How long a reservation that only the kernel's figure refuses waits for that figure to
/// catch up with recent frees (the agent publishes it every 50 ms).
const KERNEL_LAG_MS: u64 = 120;

/// Reserves `bytes` if both views stay within `lim`: max(used, kernel_used) + bytes <= lim.
fn try_reserve(l: &Ledger, idx: usize, slot: usize, bytes: u64, lim: u64) -> Result<u64, Denied> {
    let over = |v: u64| v.checked_add(bytes).is_none_or(|k| k > lim);
    let kernel_used = &l.usage.devices[idx].kernel_used;
    let mut kernel = kernel_used.load(SeqCst);
    if over(kernel) && !over(l.used(idx)) {
        // Only the kernel's view refuses: it may predate frees made just now (a framework
        // that frees its cache and retries at once). Give it one publication to catch up;
        // this is the denial path, never the fast path, and no lock is held.
        let deadline = crate::sys::now_ms() + KERNEL_LAG_MS;
        while over(kernel) && crate::sys::now_ms() < deadline {
            // SAFETY: plain sleep.
            unsafe { libc::usleep(2000) };
            kernel = kernel_used.load(SeqCst);
        }
    }
    if over(kernel) {
        return Err(Denied {
            used: kernel.max(l.used(idx)),
            limit: lim,
        });
    }
    l.try_reserve(idx, slot, bytes, lim)
}

/// Warns once if a limit is larger than the device it applies to.
pub fn check_limit_vs_device(limit: u64, physical: u64, dev: impl std::fmt::Display) {
    if limit != fgpu_common::ledger::NO_LIMIT
        && limit > physical
        && !BIG_LIMIT_WARNED.swap(true, SeqCst)
    {
        warning!(
            "memory limit {} is larger than device {dev} ({}): the device's memory is the limit",
            Size(limit),
            Size(physical)
        );
    }
}

/// Reserves `bytes` on device `ord` for an allocation through `api`.
/// Ok(None): nothing to account (no limit, no context, no ledger); Err: denied, with what was
/// in use and the limit (logged and counted; the caller returns CUDA_ERROR_OUT_OF_MEMORY).
pub fn reserve(api: &str, ord: Option<CUdevice>, bytes: u64) -> Result<Option<Charge>, Denied> {
    let Some(ord) = ord else {
        return Ok(None);
    };
    crate::ledger::tick();
    let Some((l, slot)) = ledger::get() else {
        return Ok(None);
    };
    let Some(idx) = dev_index(l, ord) else {
        return Ok(None);
    };
    reserve_at(api, (l, slot), ord, idx, bytes, |near| {
        if let Some(h) = hooks() {
            (h.before_reserve)(ord, idx, near);
        }
    })
}

/// [`reserve`] on ledger record `idx` (ordinal `ord` as the process sees it, for the
/// environment's per-device limits and the log), `refresh` called with whether the request
/// comes near the limit. Also used by the HIP paths (crate::hip), whose devices are bound to
/// ledger records by HIP UUID.
pub fn reserve_at(
    api: &str,
    (l, slot): (&Ledger, usize),
    ord: CUdevice,
    idx: usize,
    bytes: u64,
    refresh: impl FnOnce(bool),
) -> Result<Option<Charge>, Denied> {
    let charge = Charge { idx, ord, bytes };
    if bytes == 0 {
        return Ok(Some(charge));
    }
    let lim = limit(l, ord, idx);
    let near = used(l, idx).saturating_add(bytes) >= lim - lim / 10;
    refresh(near);
    let mut r = try_reserve(l, idx, slot, bytes, lim);
    if r.is_err() && ledger::sweep() > 0 {
        r = try_reserve(l, idx, slot, bytes, lim);
    }
    match r {
        Ok(_) => Ok(Some(charge)),
        Err(d) => {
            l.count_denied(idx, Some(slot));
            let own = l.slots[slot].used[idx].load(SeqCst);
            let first = !DENIAL_LOGGED.swap(true, SeqCst);
            let level = if first {
                crate::log::Level::Warn
            } else {
                crate::log::Level::Debug
            };
            crate::log::line(
                level,
                format_args!(
                    "{api} of {} denied on device {ord}: limit {}, in use {} (this process {})",
                    Size(bytes),
                    Size(d.limit),
                    Size(d.used),
                    Size(own)
                ),
            );
            Err(d)
        }
    }
}

/// Reserves more for an existing charge (e.g. the real pitch turned out larger).
pub fn reserve_more(api: &str, c: &mut Charge, extra: u64) -> bool {
    match reserve(api, Some(c.ord), extra) {
        Ok(Some(_)) => {
            c.bytes += extra;
            true
        }
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Gives back `bytes` on ledger device `idx`.
pub fn release(idx: usize, bytes: u64) {
    if bytes == 0 {
        return;
    }
    if let Some((l, slot)) = ledger::get() {
        l.release(idx, slot, bytes);
    }
}

/// Records a tracked object; if its table is full the charge stays (conservative) and a
/// warning is printed once.
pub fn track(t: &Table, key: u64, size: u64, meta: u64, aux: u64) {
    if !t.insert(Entry {
        key,
        size,
        meta,
        aux,
    }) && !TABLE_FULL_WARNED.swap(true, SeqCst)
    {
        warning!("tracking table full: some GPU memory stays charged after it is freed");
    }
}

/// Gives back what a removed entry charged (per its kind).
pub fn release_entry(e: &Entry) {
    match kind_of(e) {
        k if k == Kind::Pool as u8 => {
            if let Some(h) = hooks() {
                (h.pool_returned)(e.aux, e.size);
            }
        }
        k if k == Kind::Managed as u8 => {
            let idx = idx_of(e);
            let _ = MANAGED[idx].fetch_update(SeqCst, SeqCst, |m| Some(m.saturating_sub(e.size)));
            release(idx, e.size);
        }
        _ => release(idx_of(e), e.size),
    }
}

/// The context on `ord` was destroyed: everything this process had there is gone.
pub fn drop_device(ord: CUdevice) {
    let Some((l, slot)) = ledger::get() else {
        return;
    };
    let Some(idx) = dev_index(l, ord) else {
        return;
    };
    let n = l.release_device(idx, slot);
    MANAGED[idx].store(0, SeqCst);
    let on_dev = |e: &Entry| idx_of(e) == idx;
    for t in [&PTRS, &ARRAYS, &VMM, &MAPS, &POOLS] {
        t.remove_where(on_dev);
    }
    debug!("context on device {ord} destroyed: released {}", Size(n));
}

/// In a fork child: forget all per-process state.
pub fn reset_in_child() {
    for t in [&PTRS, &ARRAYS, &VMM, &MAPS, &POOLS] {
        t.reset_in_child();
    }
    for m in &MANAGED {
        m.store(0, SeqCst);
    }
    DENIAL_LOGGED.store(false, SeqCst);
}
