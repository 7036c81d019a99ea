//! Parking (docs/parking.md): under an agent, a parkable container's device memory is backed
//! so that it can be moved to host memory while the program is idle and brought back, at the
//! same addresses, before its next launch, copy or allocation.
//!
//! - [`backing`]: `cuMemAlloc_v2` made of a reserved range with physical memory mapped into
//!   it; the records of what this process has backed; the driver calls park and unpark make.
//! - [`room`]: asking the agent to park someone else when the driver is out of memory.
//! - `crate::cuda::copies`: the copy and set entry points, which pass the door.
//! - [`unpark`]: bringing the memory back, at the first call through the door after a park
//!   (and giving up when the driver fails for good).
//! - here: the door every launch, copy, allocation and free passes while the container is
//!   parkable (a count of calls inside, and a wait while parked) and park (the watcher
//!   thread, when the agent asks).
//!
//! Costs: a process that is not parkable pays one relaxed load per door. A parkable one pays
//! two atomic adds and a coarse clock read per launch and copy, and its launches take the
//! gate's path instead of the fast path (docs/parking.md, "Costs").

pub mod backing;
pub mod peers;
pub mod room;
mod unpark;

use std::sync::Mutex;
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst,
};

use fgpu_common::ledger::Ledger;
use fgpu_common::ledger::park::{
    PARK_BUSY, PARK_DRIVER_ERROR, PARK_NO_HOST_MEMORY, PARK_NOTHING, PARK_OK, PARK_PINNED, PARKED,
    PARKING, RESIDENT, UNPARKING, pin,
};

use crate::account;
use crate::ledger;
use crate::log::{info, warning};
use crate::real::{CUDA_ERROR_OUT_OF_MEMORY, CUdeviceptr, CUresult};
use crate::registered::Registered;
use backing::{HostRegion, RECORDS, Rec};
use unpark::unpark;

/// Whether this process's calls pass the door: its container is parkable, or it is not
/// resident (a container made unparkable while parked still unparks at its next call).
static PARKABLE: AtomicBool = AtomicBool::new(false);
/// An unpark failed for good (a broken context, a device fault: [`unpark`]): this process is
/// never parkable again.
static BROKEN: AtomicBool = AtomicBool::new(false);
/// Calls inside the door.
static INFLIGHT: AtomicU64 = AtomicU64::new(0);
/// [`RESIDENT`], [`PARKING`], [`PARKED`], [`UNPARKING`].
static PHASE: AtomicU32 = AtomicU32::new(RESIDENT);
/// Serialises park and unpark.
static LOCK: Mutex<()> = Mutex::new(());
/// Why this process's memory cannot be parked, as seen at its allocations ([`pin`]).
static PINS: AtomicU32 = AtomicU32::new(0);
/// Records in [`RECORDS`] (read without the lock).
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// The host region of the park in effect (None while resident), with the context it was
/// registered in.
static REGION: Mutex<Option<(HostRegion, usize)>> = Mutex::new(None);
/// Host regions an unpark left for the watcher to free, with their contexts and when
/// (CLOCK_MONOTONIC ms).
static TO_FREE: Mutex<Vec<(HostRegion, usize, u64)>> = Mutex::new(Vec::new());
/// A region is freed once the process has left the GPU alone this long (unregistering tens
/// of GiB takes the driver a second, during which the process's own work stalls: measured
/// on the H200, docs/parking.md)...
const FREE_WHEN_IDLE_MS: u64 = 200;
/// ...or this long after its unpark, whatever the process does.
const FREE_AT_LATEST_MS: u64 = 10_000;
/// Regions in [`TO_FREE`] (read without the lock).
static PENDING_FREES: AtomicUsize = AtomicUsize::new(0);

/// Frees a host region in its context.
fn free_region_in(ctx: crate::real::Handle, r: HostRegion) {
    let mut r = Some(r);
    let _ = backing::in_ctx(ctx, || {
        if let Some(r) = r.take() {
            backing::host_region_free(r);
        }
    });
    if let Some(r) = r {
        backing::host_region_free(r);
    }
}

/// Closes the launch entry points' fast paths (registered by lib.rs), so that launches pass
/// the door.
static CLOSE_FAST_PATHS: Registered<fn()> = Registered::new();

/// Registers what closes the launch fast paths; once, by the library's constructor.
pub fn on_close_fast_paths(f: &'static fn()) {
    CLOSE_FAST_PATHS.set(f);
}

fn close_fast_paths() {
    if let Some(f) = CLOSE_FAST_PATHS.get() {
        f();
    }
}

/// Whether launches must pass the door (the gate then keeps the fast paths closed).
pub fn parkable() -> bool {
    PARKABLE.load(Relaxed)
}

/// Reads whether the container is parkable (the ledger's limits changed, or were read for
/// the first time).
pub fn refresh(l: &Ledger) {
    let on = !BROKEN.load(SeqCst)
        && (l.park_after_ms().is_some()
            || PHASE.load(SeqCst) != RESIDENT
            || PENDING_FREES.load(Relaxed) > 0);
    if on && !PARKABLE.swap(true, SeqCst) {
        info!("this container is parkable: new device memory is backed for parking");
        close_fast_paths();
    } else if !on {
        PARKABLE.store(false, SeqCst);
    }
}

/// Records a reason this process cannot be parked: an allocation of a kind that cannot move
/// (whether or not its container is parkable yet: it may become parkable later). Only read
/// when memory that no parkable record explains is found.
pub fn note_pin(bit: u32) {
    if PINS.load(Relaxed) & bit == 0 {
        PINS.fetch_or(bit, Relaxed);
    }
}

/// A call inside the door; leaving drops it.
pub struct Door(bool);

impl Drop for Door {
    fn drop(&mut self) {
        if self.0 {
            INFLIGHT.fetch_sub(1, SeqCst);
        }
    }
}

/// Passes the door: while the process is parked (or being parked), brings its memory back
/// first. Every launch, copy, set, allocation and free of a parkable process holds a door
/// until the driver call returned.
pub fn enter() -> Door {
    if !PARKABLE.load(Relaxed) {
        return Door(false);
    }
    loop {
        INFLIGHT.fetch_add(1, SeqCst);
        if PHASE.load(SeqCst) == RESIDENT {
            touch();
            return Door(true);
        }
        INFLIGHT.fetch_sub(1, SeqCst);
        if !PARKABLE.load(SeqCst) {
            return Door(false); // an unpark gave up (unpark::give_up)
        }
        let t0 = fgpu_common::clock::mono_ns();
        unpark();
        if let Some((l, slot)) = ledger::get() {
            let waited = fgpu_common::clock::mono_ns().saturating_sub(t0);
            l.slot_park(slot).wait_ns.fetch_add(waited, Relaxed);
        }
    }
}

/// Stamps this process's latest use of the GPU.
fn touch() {
    if let Some((l, slot)) = ledger::get() {
        let now = crate::sys::now_ms();
        let a = &l.slot_park(slot).last_active_ms;
        if a.load(Relaxed) != now {
            a.store(now, Relaxed);
        }
    }
}

/// `cuMemAlloc_v2` for a parkable process (the caller holds a door): Some(the result) if the
/// allocation was backed for parking (or refused), None if it is made the ordinary way.
pub fn alloc(dptr: *mut CUdeviceptr, bytes: usize) -> Option<CUresult> {
    if dptr.is_null() || bytes == 0 {
        return None;
    }
    let (l, _) = ledger::get()?;
    l.park_after_ms()?;
    if !PARKABLE.load(Relaxed) {
        refresh(l);
        if !PARKABLE.load(Relaxed) {
            return None;
        }
    }
    if COUNT.load(Relaxed) >= backing::MAX_RECORDS {
        PINS.fetch_or(pin::FULL, Relaxed);
        return None;
    }
    let ord = account::current_ordinal()?;
    // A context made without the primary context's door (cuCtxCreate) is known from here.
    peers::note_device(ord);
    let size = backing::rounded(ord, bytes)? as u64;
    let charge = match account::reserve("cuMemAlloc_v2", Some(ord), size) {
        Ok(Some(c)) => c,
        Ok(None) => return None,
        Err(_) => return Some(CUDA_ERROR_OUT_OF_MEMORY),
    };
    let fail = |rc: CUresult| {
        account::release(charge.idx, charge.bytes);
        Some(rc)
    };
    let va = match backing::reserve_range(ord, size) {
        Ok(va) => va,
        Err(e) => return fail(e.rc),
    };
    let h = loop {
        match backing::create(ord, size) {
            Ok(h) => break h,
            Err(e) if e.rc == CUDA_ERROR_OUT_OF_MEMORY && room::ask(charge.idx, size) => continue,
            Err(e) => {
                backing::free_range(va, size);
                return fail(e.rc);
            }
        }
    };
    let opened = match backing::map(va, size, h, ord) {
        Ok(d) => d,
        Err(e) => {
            backing::release(h);
            backing::free_range(va, size);
            return fail(e.rc);
        }
    };
    let rec = Rec {
        va,
        size,
        handle: h,
        ord,
        idx: charge.idx,
        ctx: backing::current_ctx(),
        host: std::ptr::null_mut(),
    };
    RECORDS.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
    COUNT.fetch_add(1, Relaxed);
    // A context taken on another device while this was mapped walked the records before
    // this one was in: open it to that device here.
    let later = peers::devices() & !opened;
    if later != 0 {
        peers::open(va, size, ord, later);
    }
    // SAFETY: the caller's out-pointer (checked non-null).
    unsafe { dptr.write_unaligned(va) };
    Some(0)
}

/// `cuMemFree_v2` of an allocation backed for parking (the caller holds a door, so it is
/// resident): Some(the result), or None if `ptr` is not one of ours.
pub fn free(ptr: CUdeviceptr) -> Option<CUresult> {
    if COUNT.load(Relaxed) == 0 {
        return None;
    }
    let rec = {
        let mut recs = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
        let i = recs.iter().position(|r| r.va == ptr)?;
        COUNT.fetch_sub(1, Relaxed);
        recs.swap_remove(i)
    };
    // cuMemFree waits for the work that may still use the memory; so do we.
    let _ = backing::in_ctx(rec.ctx, backing::sync);
    if rec.handle != 0 {
        backing::unmap(rec.va, rec.size);
        backing::release(rec.handle);
        account::release(rec.idx, rec.size);
    }
    backing::free_range(rec.va, rec.size);
    Some(0)
}

/// Whether `ptr` lies in an allocation backed for parking.
pub fn is_backed(ptr: CUdeviceptr) -> bool {
    COUNT.load(Relaxed) > 0
        && RECORDS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|r| ptr >= r.va && ptr - r.va < r.size)
}

/// The watcher thread's look (crate::gate): the agent link's check (reconnects after an agent
/// restart), a new park request of the agent answered, host copies an unpark left behind
/// freed.
pub fn poll() {
    let Some((l, slot)) = ledger::get() else {
        return;
    };
    if !PARKABLE.load(Relaxed) {
        // The common case, every wake-up of the watcher: one load of the ledger's page.
        if l.park_after_ms().is_none() && PENDING_FREES.load(Relaxed) == 0 {
            return;
        }
        refresh(l);
    }
    // An idle parkable process makes no call that would notice an agent restart: look here,
    // so that a new agent knows it (it can be parked, its parked memory is shown).
    ledger::tick();
    free_due(l, slot);
    let sp = l.slot_park(slot);
    if PHASE.load(SeqCst) == PARKED && sp.phase.load(SeqCst) != PARKED {
        republish(l, slot);
    }
    let cmd = l.park().command.load(SeqCst);
    if cmd == 0 || cmd <= sp.done.load(SeqCst) {
        return;
    }
    let r = park(l, slot);
    sp.result.store(r, SeqCst);
    sp.done.store(cmd, SeqCst);
}

/// Frees the host regions that are due ([`FREE_WHEN_IDLE_MS`], [`FREE_AT_LATEST_MS`]).
fn free_due(l: &Ledger, slot: usize) {
    if PENDING_FREES.load(Relaxed) == 0 {
        return;
    }
    let now = crate::sys::now_ms();
    let idle = now.saturating_sub(l.slot_park(slot).last_active_ms.load(Relaxed));
    let due: Vec<(HostRegion, usize, u64)> = {
        let mut q = TO_FREE.lock().unwrap_or_else(|e| e.into_inner());
        let all = std::mem::take(&mut *q);
        let (due, keep): (Vec<_>, Vec<_>) = all.into_iter().partition(|&(_, _, at)| {
            (idle >= FREE_WHEN_IDLE_MS && INFLIGHT.load(SeqCst) == 0)
                || now.saturating_sub(at) >= FREE_AT_LATEST_MS
        });
        PENDING_FREES.store(keep.len(), Relaxed);
        *q = keep;
        due
    };
    for (r, ctx, _) in due {
        free_region_in(ctx as crate::real::Handle, r);
    }
}

/// Writes this process's parked state into its slot again: after an agent restart the
/// process moved to a new ledger (a new slot), whose page must say that its memory is in host
/// memory (status, the broker, the host budget).
fn republish(l: &Ledger, slot: usize) {
    let Ok(_g) = LOCK.try_lock() else {
        return; // a park or unpark is under way; the next look will do
    };
    if PHASE.load(SeqCst) != PARKED {
        return;
    }
    let sp = l.slot_park(slot);
    let recs = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    let mut per = [0u64; fgpu_common::ledger::MAX_DEVICES];
    for r in recs.iter().filter(|r| !r.host.is_null()) {
        per[r.idx] += r.size;
    }
    for (b, v) in sp.parked.iter().zip(per) {
        b.store(v, SeqCst);
    }
    sp.phase.store(PARKED, SeqCst);
}

/// Bytes of this process that no parkable record explains, per ledger device: memory that
/// cannot move (context overhead aside).
fn unexplained(l: &Ledger, slot: usize, recs: &[Rec]) -> u64 {
    let s = &l.slots[slot];
    let mut out = 0;
    for idx in 0..fgpu_common::ledger::MAX_DEVICES {
        let used = s.used[idx].load(SeqCst);
        let overhead = s.overhead[idx].load(SeqCst);
        let backed: u64 = recs.iter().filter(|r| r.idx == idx).map(|r| r.size).sum();
        out += used.saturating_sub(overhead).saturating_sub(backed);
    }
    out
}

/// Room a park leaves in the memory cgroup beyond its host copy: at least this, or 1/64 of
/// the copy (page tables, the process's own growth meanwhile).
const MEMCG_MARGIN: u64 = 64 << 20;

/// The room this process's memory cgroup leaves it, and which controller charges it; None
/// where no limit applies or none can be read (`fgpu_common::cgroup::memory`).
fn memcg_room() -> Option<(u64, fgpu_common::cgroup::memory::Version)> {
    use fgpu_common::cgroup::memory;
    let pc = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let d = memory::dirs(&pc, &mi)?;
    let room = memory::room(&d, |dir, f| std::fs::read_to_string(dir.join(f)).ok())?;
    Some((room, d.version))
}

/// Milliseconds since `t0` (ns).
fn ms_since(t0: u64) -> u64 {
    fgpu_common::clock::mono_ns().saturating_sub(t0) / 1_000_000
}

/// The distinct contexts of `recs`, in order of first appearance.
fn contexts(recs: &[Rec]) -> Vec<crate::real::Handle> {
    let mut out: Vec<crate::real::Handle> = Vec::new();
    for r in recs {
        if !out.contains(&r.ctx) {
            out.push(r.ctx);
        }
    }
    out
}

/// Parks this process: returns a [`fgpu_common::ledger::park`] result.
fn park(l: &Ledger, slot: usize) -> u32 {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let sp = l.slot_park(slot);
    if BROKEN.load(SeqCst) {
        return PARK_DRIVER_ERROR;
    }
    if PHASE.load(SeqCst) != RESIDENT {
        return PARK_OK;
    }
    let after = l.park_after_ms().unwrap_or(0);
    let idle = crate::sys::now_ms().saturating_sub(sp.last_active_ms.load(SeqCst));
    if idle < after {
        return PARK_BUSY;
    }
    {
        let recs = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
        // Memory no record explains cannot move: the process is pinned, whatever it is.
        if unexplained(l, slot, &recs) > 0 {
            let bits = match PINS.load(Relaxed) {
                0 => pin::EARLY,
                b => b,
            };
            sp.pinned.store(bits, SeqCst);
            return PARK_PINNED;
        }
        if recs.is_empty() {
            return PARK_NOTHING;
        }
    }
    sp.pinned.store(0, SeqCst);
    let t0 = fgpu_common::clock::mono_ns();
    PHASE.store(PARKING, SeqCst);
    sp.phase.store(PARKING, SeqCst);
    let give_up = |r: u32| {
        PHASE.store(RESIDENT, SeqCst);
        sp.phase.store(RESIDENT, SeqCst);
        r
    };
    // Calls that passed the door before it closed finish first.
    let deadline = crate::sys::now_ms() + 2000;
    while INFLIGHT.load(SeqCst) > 0 {
        if crate::sys::now_ms() > deadline {
            return give_up(PARK_BUSY);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut recs = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    let ctxs = contexts(&recs);
    let total: u64 = recs.iter().map(|r| r.size).sum();
    // The host copy is charged to this process's memory cgroup: faulting it in past the
    // cgroup's limit would have the kernel's OOM killer end the container. Refused first.
    if let Some((room, version)) = memcg_room() {
        let need = total + (total / 64).max(MEMCG_MARGIN);
        if room < need {
            warning!(
                "parking: the memory cgroup has room for {} ({version}), the host copy needs {} and a margin; not parked",
                fgpu_common::quantity::Size(room),
                fgpu_common::quantity::Size(total)
            );
            return give_up(PARK_NO_HOST_MEMORY);
        }
    }
    // Host memory first (registered in the first context; portable).
    let region = match backing::in_ctx(ctxs[0], || backing::host_region(total)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) | Err(e) => {
            warning!(
                "parking: no host memory for {} ({} failed: {}; the container's memory cgroup?); not parked",
                fgpu_common::quantity::Size(total),
                e.call,
                e.rc
            );
            return give_up(PARK_NO_HOST_MEMORY);
        }
    };
    let host_ms = ms_since(t0);
    let (fault_ms, register_ms) = (region.fault_ms, region.register_ms);
    let t1 = fgpu_common::clock::mono_ns();
    // Copy everything out (per context: its work done first, then its copies on a stream
    // of its own); only then give physical memory back, so that a failure leaves the
    // process as it was.
    let mut off = 0usize;
    let mut hosts = Vec::with_capacity(recs.len());
    for r in recs.iter() {
        hosts.push(region.base.wrapping_byte_add(off));
        off += r.size as usize;
    }
    for &c in &ctxs {
        let copied = backing::in_ctx(c, || -> Result<(), backing::Failed> {
            backing::sync()?;
            let s = backing::stream()?;
            let queued = recs
                .iter()
                .zip(&hosts)
                .filter(|(r, _)| r.ctx == c)
                .try_for_each(|(r, &h)| backing::copy_out(h, r.va, r.size, s));
            let done = backing::finish(s);
            queued.and(done)
        });
        if let Err(e) = copied.and_then(|r| r) {
            warning!("parking: {} failed ({}); not parked", e.call, e.rc);
            free_region_in(ctxs[0], region);
            return give_up(PARK_DRIVER_ERROR);
        }
    }
    let copy_ms = ms_since(t1);
    for (r, h) in recs.iter_mut().zip(hosts) {
        backing::unmap(r.va, r.size);
        backing::release(r.handle);
        account::release(r.idx, r.size);
        sp.parked[r.idx].fetch_add(r.size, SeqCst);
        r.handle = 0;
        r.host = h;
    }
    drop(recs);
    *REGION.lock().unwrap_or_else(|e| e.into_inner()) = Some((region, ctxs[0] as usize));
    PHASE.store(PARKED, SeqCst);
    sp.phase.store(PARKED, SeqCst);
    let ns = fgpu_common::clock::mono_ns().saturating_sub(t0);
    sp.last_park_ns.store(ns, SeqCst);
    sp.parks.fetch_add(1, SeqCst);
    info!(
        "parked {} ({total} bytes) in host memory in {} ms (host memory {host_ms} ms: faulting in {fault_ms} ms, registering {register_ms} ms; copies {copy_ms} ms)",
        fgpu_common::quantity::Size(total),
        ns / 1_000_000
    );
    PARK_OK
}

/// In a fork child: no device memory is inherited.
pub fn after_fork_child() {
    // The child's records are the parent's addresses; drop them without touching the driver.
    if let Ok(mut r) = RECORDS.try_lock() {
        r.clear();
    }
    COUNT.store(0, Relaxed);
    PHASE.store(RESIDENT, Relaxed);
    INFLIGHT.store(0, Relaxed);
    peers::reset_in_child();
}
