//! The launch gate: admits GPU work by measured GPU time (compute shares). Design and field
//! semantics: docs/compute.md.
//!
//! - Per device, a budget of GPU time in ns: a process-local token bucket refilled at
//!   `FGPU_COMPUTE_SHARE`% of wall time (standalone cap), and/or the ledger's
//!   `launch_budget`, refilled by the agent (shared by the container's processes). A launch
//!   is admitted while the budget is not negative; otherwise the launching thread sleeps
//!   until it is refilled.
//! - Per stream, launches form batches (closed after [`BATCH_HOST_NS`] of host time, once
//!   their estimated GPU time reaches [`BATCH_GPU_NS`], at every graph launch, and after every
//!   launch while the stream's cost per launch is not known yet). A timing event is recorded
//!   after each batch (and before it when the stream was idle); the GPU time between the
//!   batch's start reference and its end event is what the batch cost. Launches are charged
//!   an estimate (the stream's measured average per launch) when they are made; the
//!   difference to the measured time is settled when the batch's end event has completed.
//!   At most [`DEPTH`] closed batches per stream are unmeasured: the next batch waits for the
//!   oldest one (`cuEventSynchronize`), so work queued ahead of the budget stays bounded.
//! - Never an event into a capturing stream: before recording, `cuStreamIsCapturing`; a
//!   launch into a capturing stream is not charged and never waits (the graph is charged
//!   when it is launched). Event queries run in relaxed capture mode
//!   (`cuThreadExchangeStreamCaptureMode`) so that another thread's global-mode capture is
//!   not invalidated by them.
//!
//! Per-stream state lives in a fixed table; its bookkeeping belongs to whichever thread holds
//! the slot's `owner` flag. The flag is only ever *tried*: a thread that does not get it
//! charges its launch's estimate and goes on, so nobody waits for it (it is an ownership
//! token, not a lock, and may be held across the gate's own event calls). No heap, no TLS
//! with destructors.

use crate::account;
use crate::config::MAX_ORDINALS;
use crate::ledger_file;
use crate::log::{error, info, warning};
use crate::real::{self, CUresult, Handle};
use fgpu_common::ledger::{DeviceCompute, Ledger, MAX_DEVICES};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint};
use std::sync::Once;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering::Acquire,
    Ordering::Relaxed, Ordering::Release,
};

/// A batch closes once this much host time has passed since its first launch...
pub const BATCH_HOST_NS: u64 = 1_000_000;
/// ...or once its launches are estimated at this much GPU time.
pub const BATCH_GPU_NS: i64 = 2_000_000;
/// Batch records per stream (events: one start and one end per record).
const RING: usize = 4;
/// Closed, unmeasured batches per stream at most (while the cost per launch is known; 1
/// while it is not).
pub const DEPTH: usize = RING - 1;
/// A local bucket holds at most the share of this window (the burst after idling).
pub const WINDOW_NS: i64 = 100_000_000;
/// Longest single sleep while waiting for budget.
const MAX_SLEEP_NS: u64 = 10_000_000;
/// Shortest one.
const MIN_SLEEP_NS: u64 = 50_000;
/// Longest sleep on the ledger's grant word while waiting for the agent's controller.
const LEDGER_POLL_NS: u64 = 1_000_000;
/// ...while some of this process's batches are still running (their completion is what
/// the controller waits for).
const DRAIN_POLL_NS: u64 = 100_000;
/// A controller whose heartbeat stands still this long is considered gone: the device falls
/// back to a local bucket at the ledger's rate until the ledger changes.
const LEDGER_STALE_NS: u64 = 1_000_000_000;
/// A pause of this much host time between two launches into a stream closes its open
/// batch first: the GPU may have run dry meanwhile, and a batch's events would count the
/// idle time as the stream's.
const GAP_NS: u64 = 100_000;
/// Streams tracked at the same time (per process).
const STREAMS: usize = 256;
/// A stream slot unused for this long may be taken for another stream when the table is full.
const IDLE_EVICT_NS: u64 = 1_000_000_000;

const CUDA_SUCCESS: CUresult = 0;
const CUDA_ERROR_NOT_READY: CUresult = 600;
/// Timing enabled, and `cuEventSynchronize` blocks (sleeps) instead of spinning.
const CU_EVENT_BLOCKING_SYNC: c_uint = 1;
const CU_EVENT_DEFAULT: c_uint = 0;
const CU_STREAM_PER_THREAD: usize = 2;
const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// What a launch is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Kernel = 0,
    Graph = 1,
}

// ---- process-wide state ------------------------------------------------------------------

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// Whether any launch is gated (UNKNOWN until the first launch).
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static INIT: Once = Once::new();
/// FGPU_COMPUTE_SHARE (0: not set).
static ENV_PCT: AtomicU32 = AtomicU32::new(0);
/// Some ledger device has a compute share or cap.
static LEDGER_GATED: AtomicBool = AtomicBool::new(false);
static STALE_WARNED: AtomicBool = AtomicBool::new(false);
static FULL_WARNED: AtomicBool = AtomicBool::new(false);

/// Counters (read by the exit report and by tests through `FGPU_LOG=info`).
pub struct Stats {
    pub events_created: AtomicU64,
    pub events_recorded: AtomicU64,
    pub batches: AtomicU64,
    pub measured_ns: AtomicU64,
    pub capture_skips: AtomicU64,
    pub waits: AtomicU64,
    pub wait_ns: AtomicU64,
    pub sync_ns: AtomicU64,
    pub gated_launches: AtomicU64,
}

pub static STATS: Stats = Stats {
    events_created: AtomicU64::new(0),
    events_recorded: AtomicU64::new(0),
    batches: AtomicU64::new(0),
    measured_ns: AtomicU64::new(0),
    capture_skips: AtomicU64::new(0),
    waits: AtomicU64::new(0),
    wait_ns: AtomicU64::new(0),
    sync_ns: AtomicU64::new(0),
    gated_launches: AtomicU64::new(0),
};

// ---- per-device budgets --------------------------------------------------------------------

const M_UNSET: u8 = 0;
const M_OFF: u8 = 1;
const M_LOCAL: u8 = 2;
const M_LEDGER: u8 = 4;

struct Dev {
    /// M_UNSET, M_OFF, or M_LOCAL | M_LEDGER bits.
    mode: AtomicU8,
    /// Local bucket: refill rate in percent of wall time.
    pct: AtomicU32,
    /// Local bucket: ns of GPU time available (negative: debt).
    tokens: AtomicI64,
    /// Local bucket: host time of the last refill (0: never used).
    last: AtomicU64,
    /// Ledger device record (M_LEDGER).
    ledger_idx: AtomicUsize,
    /// The ledger's rate for this device (cap, else share), for the stale fallback.
    ledger_pct: AtomicU32,
}

impl Dev {
    const fn new() -> Dev {
        Dev {
            mode: AtomicU8::new(M_UNSET),
            pct: AtomicU32::new(0),
            tokens: AtomicI64::new(0),
            last: AtomicU64::new(0),
            ledger_idx: AtomicUsize::new(0),
            ledger_pct: AtomicU32::new(0),
        }
    }
}

static DEVS: [Dev; MAX_ORDINALS] = [const { Dev::new() }; MAX_ORDINALS];

pub fn now_ns() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: relative sleep with a valid timespec; an early wake-up only shortens it.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// The ledger's budget cell for ledger device `idx` (looked up each time: the ledger may be
/// replaced when the agent reconnects).
fn ledger_budget(idx: usize) -> Option<&'static AtomicI64> {
    let (l, _) = ledger_file::get()?;
    Some(&l.usage.devices[idx.min(MAX_DEVICES - 1)].launch_budget)
}

/// The ledger's compute exchange for ledger device `idx`.
fn ledger_compute(idx: usize) -> Option<&'static DeviceCompute> {
    let (l, _) = ledger_file::get()?;
    Some(&l.usage.compute[idx.min(MAX_DEVICES - 1)])
}

/// Sleeps on `word` while it still holds `seen`, at most `ns` (a futex on shared memory: the
/// agent's controller wakes it after a grant).
fn futex_wait(word: &AtomicU32, seen: u32, ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT (shared: the word is in a MAP_SHARED ledger mapping) on a valid,
    // aligned u32 with a relative timeout; it only sleeps.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        )
    };
}

/// The ledger's compute setting for a device record: (gated, rate in percent).
fn ledger_setting(l: &Ledger, idx: usize) -> (bool, u32) {
    let d = &l.limits.devices[idx];
    let (share, cap) = (d.compute_share.load(Relaxed), d.compute_cap.load(Relaxed));
    let gated = |p: u32| (1..100).contains(&p);
    let pct = if gated(cap) { cap } else { share };
    (gated(cap) || gated(share), pct)
}

/// Resolves (once per ledger change) how device `ord` is gated.
fn dev_mode(ord: usize) -> (&'static Dev, u8) {
    let d = &DEVS[ord.min(MAX_ORDINALS - 1)];
    let m = d.mode.load(Acquire);
    if m != M_UNSET {
        return (d, m);
    }
    let mut m = 0;
    let env = ENV_PCT.load(Relaxed);
    if env != 0 {
        d.pct.store(env, Relaxed);
        m |= M_LOCAL;
    }
    if LEDGER_GATED.load(Relaxed)
        && let Some((l, _)) = ledger_file::get()
        && let Some(idx) = account::dev_index(l, ord as i32)
    {
        let (gated, pct) = ledger_setting(l, idx);
        if gated {
            d.ledger_idx.store(idx, Relaxed);
            d.ledger_pct.store(pct, Relaxed);
            m |= M_LEDGER;
        }
    }
    if m == 0 {
        m = M_OFF;
    }
    d.mode.store(m, Release);
    (d, m)
}

/// Adds the local bucket's refill since the last one (capped at a window's share).
fn refill(d: &Dev, now: u64) {
    let last = d.last.load(Relaxed);
    if last == 0 {
        // First use: an empty bucket (no burst at start).
        let _ = d.last.compare_exchange(0, now, Relaxed, Relaxed);
        return;
    }
    if now < last + MIN_SLEEP_NS
        || d.last
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_err()
    {
        return;
    }
    let pct = i64::from(d.pct.load(Relaxed));
    let add = ((now - last) as i64).saturating_mul(pct) / 100;
    let cap = WINDOW_NS * pct / 100;
    let _ = d.tokens.fetch_update(Relaxed, Relaxed, |t| {
        Some(if t >= cap { t } else { (t + add).min(cap) })
    });
}

/// Charges `ns` (negative: a refund) to the local bucket.
fn charge_local(d: &Dev, m: u8, ns: i64) {
    if m & M_LOCAL != 0 && ns != 0 {
        d.tokens.fetch_sub(ns, Relaxed);
    }
}

/// Charges `ns` to the ledger's budget: one atomic. Refunds (negative) are dropped: the
/// budget is a turn granted by the agent, which accounts fairness by measured time
/// (`DeviceCompute::gpu_ns`), and a late refund must not reopen a turn that was taken back.
fn charge_ledger(d: &Dev, m: u8, ns: i64) {
    if m & M_LEDGER != 0
        && ns > 0
        && let Some(b) = ledger_budget(d.ledger_idx.load(Relaxed))
    {
        b.fetch_sub(ns, Relaxed);
    }
}

/// Reports measured GPU time to the agent's controller.
fn report_measured(d: &Dev, m: u8, ns: i64) {
    if m & M_LEDGER != 0
        && ns > 0
        && let Some(c) = ledger_compute(d.ledger_idx.load(Relaxed))
    {
        c.gpu_ns.fetch_add(ns as u64, Relaxed);
    }
}

/// Settles the completed batches of every stream whose bookkeeping is free right now.
/// Returns whether some batch is still outstanding.
fn settle_all() -> bool {
    let mut left = false;
    for s in &SLOTS {
        if s.key.load(Relaxed) == 0 {
            continue;
        }
        let Some(g) = s.try_own() else {
            continue;
        };
        let inner = g.inner();
        if inner.out > 0 {
            let (d, m) = dev_mode(s.ord.load(Relaxed));
            settle_ready(s, inner, d, m);
            left |= inner.out > 0;
        }
    }
    left
}

/// Counts a thread in the container's `waiting` for as long as it lives.
struct Waiting(Option<&'static DeviceCompute>);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.waiting.fetch_sub(1, Relaxed);
        }
    }
}

/// Waits until device `d` has budget, calling `before_wait` once before the first sleep.
/// False (at once, not charged) if `stream` turned out to be capturing: nothing runs now,
/// so nothing waits.
fn admit(d: &Dev, mut m: u8, stream: usize, before_wait: impl FnOnce()) -> bool {
    let mut before_wait = Some(before_wait);
    let mut checked = false;
    let mut started = 0u64;
    let mut beat_seen = u64::MAX;
    let mut beat_since = 0u64;
    let mut waiting = Waiting(None);
    loop {
        let now = now_ns();
        let mut sleep = 0u64;
        if m & M_LOCAL != 0 {
            refill(d, now);
            let t = d.tokens.load(Relaxed);
            if t < 0 {
                let pct = u64::from(d.pct.load(Relaxed).max(1));
                sleep = (t.unsigned_abs() * 100 / pct).max(MIN_SLEEP_NS);
            }
        }
        let mut grant = None;
        if m & M_LEDGER != 0
            && let Some(b) = ledger_budget(d.ledger_idx.load(Relaxed))
            && let Some(c) = ledger_compute(d.ledger_idx.load(Relaxed))
        {
            // Read the grant word before the budget: a grant made after this load wakes
            // the futex wait below at once (its value no longer matches).
            let g = c.grant.load(Acquire);
            if b.load(Acquire) < 0 {
                let beat = c.heartbeat.load(Relaxed);
                if beat != beat_seen {
                    (beat_seen, beat_since) = (beat, now);
                } else if now - beat_since > LEDGER_STALE_NS {
                    m = ledger_abandoned(d, m);
                    continue;
                }
                if waiting.0.is_none() {
                    c.waiting.fetch_add(1, Relaxed);
                    waiting.0 = Some(c);
                }
                grant = Some((c, g));
                // Settle what completed, so the controller sees this container's work
                // drain (and hands the device on) without waiting for the next launch.
                sleep = sleep.max(if settle_all() {
                    DRAIN_POLL_NS
                } else {
                    LEDGER_POLL_NS
                });
            }
        }
        if sleep == 0 {
            if started != 0 {
                STATS.waits.fetch_add(1, Relaxed);
                STATS.wait_ns.fetch_add(now - started, Relaxed);
            }
            return true;
        }
        if !checked {
            checked = true;
            if capturing(stream) {
                return false;
            }
            started = now;
            if let Some(f) = before_wait.take() {
                f();
            }
        }
        match grant {
            Some((c, g)) => futex_wait(&c.grant, g, sleep.min(LEDGER_POLL_NS)),
            None => sleep_ns(sleep.min(MAX_SLEEP_NS)),
        }
    }
}

/// The agent stopped refilling device `d`'s ledger budget: fall back to a local bucket at the
/// ledger's rate (kept until the ledger changes, see [`ledger_changed`]).
fn ledger_abandoned(d: &Dev, m: u8) -> u8 {
    if m & M_LEDGER == 0 {
        return m;
    }
    let pct = d.ledger_pct.load(Relaxed).max(1);
    let env = d.pct.load(Relaxed);
    d.pct
        .store(if m & M_LOCAL != 0 { env.min(pct) } else { pct }, Relaxed);
    let next = (m & !M_LEDGER) | M_LOCAL;
    d.mode.store(next, Release);
    if !STALE_WARNED.swap(true, Relaxed) {
        warning!(
            "the agent's compute controller has been silent for {} ms: capping at {pct}% locally",
            LEDGER_STALE_NS / 1_000_000
        );
    }
    next
}

// ---- driver helpers -------------------------------------------------------------------------

/// Whether `stream` is capturing (or its capture state cannot be read: then it is treated as
/// capturing, the safe side; e.g. the legacy stream while another stream captures).
fn capturing(stream: usize) -> bool {
    let Some(f) = real::CU_STREAM_IS_CAPTURING.get() else {
        return false; // no stream capture in this driver
    };
    let mut st: c_int = 0;
    // SAFETY: cuStreamIsCapturing(CUstream, CUstreamCaptureStatus*) with a valid out-pointer.
    let rc = unsafe { f(stream as Handle, &mut st) };
    let cap = rc != CUDA_SUCCESS || st != 0;
    if cap {
        STATS.capture_skips.fetch_add(1, Relaxed);
    }
    cap
}

/// Relaxed stream-capture mode for the calling thread while it lives: event queries made by
/// the gate must not invalidate another thread's global-mode capture.
struct RelaxedCapture(Option<c_int>);

impl RelaxedCapture {
    fn enter() -> RelaxedCapture {
        let Some(f) = real::CU_THREAD_EXCHANGE_STREAM_CAPTURE_MODE.get() else {
            return RelaxedCapture(None);
        };
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode*), valid pointer.
        let rc = unsafe { f(&mut mode) };
        RelaxedCapture((rc == CUDA_SUCCESS).then_some(mode))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let (Some(mut mode), Some(f)) =
            (self.0, real::CU_THREAD_EXCHANGE_STREAM_CAPTURE_MODE.get())
        {
            // SAFETY: as in `enter`: restores the thread's previous mode.
            unsafe { f(&mut mode) };
        }
    }
}

fn event_create(flags: c_uint) -> usize {
    let Some(f) = real::CU_EVENT_CREATE.get() else {
        return 0;
    };
    let mut ev: Handle = std::ptr::null_mut();
    // SAFETY: cuEventCreate(CUevent*, unsigned) with a valid out-pointer.
    if unsafe { f(&mut ev, flags) } != CUDA_SUCCESS {
        return 0;
    }
    STATS.events_created.fetch_add(1, Relaxed);
    ev as usize
}

fn event_destroy(ev: usize) {
    if ev != 0
        && let Some(f) = real::CU_EVENT_DESTROY.get()
    {
        // SAFETY: an event this module created.
        unsafe { f(ev as Handle) };
    }
}

fn event_record(ev: usize, stream: usize) -> bool {
    let Some(f) = real::CU_EVENT_RECORD.get() else {
        return false;
    };
    // SAFETY: cuEventRecord(CUevent, CUstream): our event, the caller's (non-capturing) stream.
    let ok = unsafe { f(ev as Handle, stream as Handle) } == CUDA_SUCCESS;
    if ok {
        STATS.events_recorded.fetch_add(1, Relaxed);
    }
    ok
}

fn event_query(ev: usize) -> CUresult {
    match real::CU_EVENT_QUERY.get() {
        // SAFETY: cuEventQuery(CUevent) on our event.
        Some(f) => unsafe { f(ev as Handle) },
        None => CUDA_SUCCESS,
    }
}

fn event_sync(ev: usize) -> CUresult {
    match real::CU_EVENT_SYNCHRONIZE.get() {
        // SAFETY: cuEventSynchronize(CUevent) on our event.
        Some(f) => unsafe { f(ev as Handle) },
        None => CUDA_SUCCESS,
    }
}

/// GPU time between two completed events, in ns.
fn elapsed_ns(start: usize, end: usize) -> Option<i64> {
    let f = real::CU_EVENT_ELAPSED_TIME
        .get()
        .or_else(|| real::CU_EVENT_ELAPSED_TIME_V2.get())?;
    let mut ms: f32 = 0.0;
    // SAFETY: cuEventElapsedTime(float*, CUevent, CUevent) with a valid out-pointer.
    let rc = unsafe { f(&mut ms, start as Handle, end as Handle) };
    (rc == CUDA_SUCCESS && ms.is_finite()).then(|| ((f64::from(ms) * 1e6) as i64).max(0))
}

fn current_ctx() -> usize {
    let Some(f) = real::CU_CTX_GET_CURRENT.get() else {
        return 0;
    };
    let mut c: Handle = std::ptr::null_mut();
    // SAFETY: cuCtxGetCurrent(CUcontext*) with a valid out-pointer.
    if unsafe { f(&mut c) } != CUDA_SUCCESS {
        return 0;
    }
    c as usize
}

// ---- per-stream batches ---------------------------------------------------------------------

/// How a batch's GPU time starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// At the end event of the batch before it (the stream was busy: back to back).
    Prev,
    /// At its own start event (the stream was idle).
    Own,
    /// Unknown (no event could be recorded): charged by estimate only.
    None,
}

#[derive(Clone, Copy)]
struct Batch {
    start: Start,
    est: i64,
    n: u32,
    kind: Kind,
    at: u64,
    /// Counted in the ledger's `inflight` / `queued_ns` (ledger record index + 1; 0: not).
    counted: usize,
}

const NO_BATCH: Batch = Batch {
    start: Start::None,
    est: 0,
    n: 0,
    kind: Kind::Kernel,
    at: 0,
    counted: 0,
};

struct Inner {
    /// The context the events belong to.
    ctx: usize,
    ord: usize,
    /// The stream handle events are recorded on (2 for a per-thread stream).
    rec: usize,
    ev_start: [usize; RING],
    ev_end: [usize; RING],
    ring: [Batch; RING],
    head: usize,
    out: usize,
    open: Option<Batch>,
    est: [i64; 2],
    known: [bool; 2],
}

struct Slot {
    key: AtomicU64,
    owner: AtomicBool,
    last_use: AtomicU64,
    ord: AtomicUsize,
    /// Copies of `inner.est` for threads without the owner flag (-1: not known).
    est: [AtomicI64; 2],
    /// Estimates and launches charged by threads without the owner flag, folded into the
    /// owner's next batch.
    stray_est: AtomicI64,
    stray_n: AtomicU32,
    inner: UnsafeCell<Inner>,
}

// SAFETY: `inner` is only read or written by the thread holding `owner` (acquired with a
// compare-exchange, Acquire; released with a Release store); the other fields are atomics.
unsafe impl Sync for Slot {}

impl Slot {
    const fn new() -> Slot {
        Slot {
            key: AtomicU64::new(0),
            owner: AtomicBool::new(false),
            last_use: AtomicU64::new(0),
            ord: AtomicUsize::new(0),
            est: [AtomicI64::new(-1), AtomicI64::new(-1)],
            stray_est: AtomicI64::new(0),
            stray_n: AtomicU32::new(0),
            inner: UnsafeCell::new(Inner {
                ctx: 0,
                ord: 0,
                rec: 0,
                ev_start: [0; RING],
                ev_end: [0; RING],
                ring: [NO_BATCH; RING],
                head: 0,
                out: 0,
                open: None,
                est: [0; 2],
                known: [false; 2],
            }),
        }
    }

    fn try_own(&self) -> Option<Owned<'_>> {
        self.owner
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
            .then_some(Owned(self))
    }
}

static SLOTS: [Slot; STREAMS] = [const { Slot::new() }; STREAMS];

/// The owner flag of a slot, released on drop.
struct Owned<'a>(&'a Slot);

impl Owned<'_> {
    #[allow(clippy::mut_from_ref)]
    fn inner(&self) -> &mut Inner {
        // SAFETY: this thread holds the slot's owner flag, so nobody else touches `inner`;
        // callers never keep two of these references alive at once.
        unsafe { &mut *self.0.inner.get() }
    }
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        self.0.owner.store(false, Release);
    }
}

/// A per-thread address: tells per-thread default streams of different threads apart.
fn thread_tag() -> usize {
    thread_local! {
        static TAG: u8 = const { 0 };
    }
    TAG.with(|t| t as *const u8 as usize)
}

/// The table key of a launch's stream and the handle to record events on.
fn stream_key(stream: usize, ptsz: bool) -> (u64, usize) {
    let per_thread = stream == CU_STREAM_PER_THREAD || (stream == 0 && ptsz);
    let legacy = stream == 1 || (stream == 0 && !ptsz);
    let mix = |a: usize, b: usize| {
        let k = (a as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (b as u64).rotate_left(17);
        k | 1 << 63
    };
    if per_thread {
        (mix(current_ctx(), thread_tag()), CU_STREAM_PER_THREAD)
    } else if legacy {
        (mix(current_ctx(), 1), 0)
    } else {
        (stream as u64, stream)
    }
}

fn hash(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % STREAMS
}

/// The slot of `key`, made on first use (None: the table is full of busy streams).
fn slot(key: u64, rec: usize, now: u64) -> Option<&'static Slot> {
    let h = hash(key);
    for i in 0..STREAMS {
        let s = &SLOTS[(h + i) % STREAMS];
        match s.key.load(Acquire) {
            k if k == key => return Some(s),
            0 => {
                let Some(g) = s.try_own() else { continue };
                if s.key.load(Acquire) != 0 {
                    continue; // taken meanwhile (for another key, or ours: found next time)
                }
                setup(&g, key, rec, now);
                return Some(s);
            }
            _ => {}
        }
    }
    // Full: take a slot idle for a while.
    for s in &SLOTS {
        if now.saturating_sub(s.last_use.load(Relaxed)) < IDLE_EVICT_NS {
            continue;
        }
        let Some(g) = s.try_own() else { continue };
        let inner = g.inner();
        if inner.out == 0 && inner.open.is_none() {
            setup(&g, key, rec, now);
            return Some(s);
        }
    }
    if !FULL_WARNED.swap(true, Relaxed) {
        warning!("more than {STREAMS} streams launch at once: some launches are not measured");
    }
    None
}

/// Makes an owned slot the one of `key` (events are kept if the context is the same).
fn setup(g: &Owned<'_>, key: u64, rec: usize, now: u64) {
    let s = g.0;
    let inner = g.inner();
    let ctx = current_ctx();
    if inner.ctx != ctx {
        for ev in inner.ev_start.iter_mut().chain(inner.ev_end.iter_mut()) {
            event_destroy(*ev);
            *ev = 0;
        }
        inner.ctx = ctx;
    }
    inner.ord = account::current_ordinal()
        .and_then(|o| usize::try_from(o).ok())
        .unwrap_or(0);
    inner.rec = rec;
    inner.ring = [NO_BATCH; RING];
    inner.head = 0;
    inner.out = 0;
    inner.open = None;
    inner.est = [0; 2];
    inner.known = [false; 2];
    s.ord.store(inner.ord, Relaxed);
    for e in &s.est {
        e.store(-1, Relaxed);
    }
    s.stray_est.store(0, Relaxed);
    s.stray_n.store(0, Relaxed);
    s.last_use.store(now, Relaxed);
    s.key.store(key, Release);
}

fn ensure_event(ev: &mut usize, flags: c_uint) -> bool {
    if *ev == 0 {
        *ev = event_create(flags);
    }
    *ev != 0
}

/// Settles the oldest batch (its end event has completed, or failed).
fn settle_oldest(s: &Slot, inner: &mut Inner, d: &Dev, m: u8, done: bool) {
    let p = inner.head;
    let b = inner.ring[p];
    let start = match b.start {
        Start::Own => inner.ev_start[p],
        Start::Prev => inner.ev_end[(p + RING - 1) % RING],
        Start::None => 0,
    };
    let measured = if done && start != 0 {
        elapsed_ns(start, inner.ev_end[p])
    } else {
        None
    };
    if let Some(ns) = measured {
        let k = b.kind as usize;
        let sample = ns / i64::from(b.n.max(1));
        inner.est[k] = if inner.known[k] {
            (3 * inner.est[k] + sample) / 4
        } else {
            sample
        };
        inner.known[k] = true;
        s.est[k].store(inner.est[k], Relaxed);
        let delta = ns - b.est;
        charge_local(d, m, delta);
        charge_ledger(d, m, delta);
        report_measured(d, m, ns);
        STATS.measured_ns.fetch_add(ns as u64, Relaxed);
    }
    pop_oldest(inner);
}

/// Removes the oldest closed batch from the ring (and from the ledger's queued work).
fn pop_oldest(inner: &mut Inner) {
    let p = inner.head;
    let b = inner.ring[p];
    if b.counted != 0
        && let Some(c) = ledger_compute(b.counted - 1)
    {
        c.inflight.fetch_sub(1, Relaxed);
        c.queued_ns.fetch_sub(b.est, Relaxed);
    }
    inner.ring[p] = NO_BATCH;
    inner.head = (p + 1) % RING;
    inner.out -= 1;
}

/// Settles every batch whose end event has completed (never waits).
fn settle_ready(s: &Slot, inner: &mut Inner, d: &Dev, m: u8) {
    if inner.out == 0 {
        return;
    }
    let _relaxed = RelaxedCapture::enter();
    while inner.out > 0 {
        match event_query(inner.ev_end[inner.head]) {
            CUDA_SUCCESS => settle_oldest(s, inner, d, m, true),
            CUDA_ERROR_NOT_READY => break,
            _ => settle_oldest(s, inner, d, m, false),
        }
    }
}

/// Waits for the oldest batch and settles it.
fn wait_oldest(s: &Slot, inner: &mut Inner, d: &Dev, m: u8) {
    let _relaxed = RelaxedCapture::enter();
    let t = now_ns();
    let ok = event_sync(inner.ev_end[inner.head]) == CUDA_SUCCESS;
    STATS.sync_ns.fetch_add(now_ns() - t, Relaxed);
    settle_oldest(s, inner, d, m, ok);
}

/// Opens a batch before a launch. False if the stream is capturing (nothing recorded).
fn open_batch(s: &Slot, inner: &mut Inner, d: &Dev, m: u8, kind: Kind, now: u64) -> bool {
    settle_ready(s, inner, d, m);
    let start = if inner.out > 0 {
        Start::Prev
    } else {
        if capturing(inner.rec) {
            return false;
        }
        let p = (inner.head + inner.out) % RING;
        let ok = ensure_event(&mut inner.ev_start[p], CU_EVENT_DEFAULT)
            && event_record(inner.ev_start[p], inner.rec);
        if ok { Start::Own } else { Start::None }
    };
    inner.open = Some(Batch {
        start,
        est: 0,
        n: 0,
        kind,
        at: now,
        counted: 0,
    });
    true
}

/// Closes the open batch after its last launch: records its end event (unless the stream is
/// capturing: then its estimates are refunded and it is forgotten).
fn close_batch(s: &Slot, inner: &mut Inner, d: &Dev, m: u8) {
    let Some(mut b) = inner.open.take() else {
        return;
    };
    b.est += s.stray_est.swap(0, Relaxed);
    b.n += s.stray_n.swap(0, Relaxed);
    if b.n == 0 {
        return;
    }
    if capturing(inner.rec) {
        charge_local(d, m, -b.est);
        return;
    }
    let max_out = if inner.known[b.kind as usize] {
        DEPTH
    } else {
        1
    };
    settle_ready(s, inner, d, m);
    while inner.out >= max_out {
        wait_oldest(s, inner, d, m);
    }
    // A `Prev` start stays valid even if the batch before was settled just now: an end event
    // is recorded again only when its record is reused, and the wait above keeps at most
    // RING - 1 records in use.
    let p = (inner.head + inner.out) % RING;
    if !(ensure_event(&mut inner.ev_end[p], CU_EVENT_BLOCKING_SYNC)
        && event_record(inner.ev_end[p], inner.rec))
    {
        return; // charged by estimate only
    }
    charge_ledger(d, m, b.est);
    if m & M_LEDGER != 0 {
        let idx = d.ledger_idx.load(Relaxed);
        if let Some(c) = ledger_compute(idx) {
            c.inflight.fetch_add(1, Relaxed);
            c.queued_ns.fetch_add(b.est, Relaxed);
            b.counted = idx + 1;
        }
    }
    inner.ring[p] = b;
    inner.out += 1;
    STATS.batches.fetch_add(1, Relaxed);
}

// ---- the gate -------------------------------------------------------------------------------

/// Whether any launch is gated; decides on the first call.
pub fn enabled() -> bool {
    match STATE.load(Relaxed) {
        UNKNOWN => {
            INIT.call_once(init);
            STATE.load(Relaxed) == ON
        }
        s => s == ON,
    }
}

fn init() {
    crate::config::get(); // FGPU_LOG
    if let Some(v) = std::env::var("FGPU_COMPUTE_SHARE")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        match parse_share(&v) {
            Ok(100) => info!("FGPU_COMPUTE_SHARE=100: no compute cap"),
            Ok(p) => {
                ENV_PCT.store(p, Relaxed);
                info!("compute capped at {p}% of wall time per device (FGPU_COMPUTE_SHARE)");
            }
            Err(e) => error!("FGPU_COMPUTE_SHARE={v} ignored (no compute cap from it): {e}"),
        }
    }
    scan_ledger();
    start_watcher();
    // SAFETY: registering a plain extern "C" function with no preconditions.
    unsafe { libc::atexit(report) };
}

/// How often the watcher looks at the ledger's generation.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Under an agent: a thread that re-reads the compute settings when the agent changes them,
/// so that a share set on a running process that launches without being gated (its launches
/// take the fast path and never look) applies within [`WATCH_EVERY`]. One load per wake-up.
/// Not restarted in forked children (they notice at their next allocation).
fn start_watcher() {
    if !ledger_file::current().2 {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("fgpu-watch".into())
        .spawn(|| {
            loop {
                std::thread::sleep(WATCH_EVERY);
                check_generation();
            }
        });
    if let Err(e) = spawned {
        warning!(
            "no compute-settings watcher ({e}): a share set later applies at the next allocation"
        );
    }
}

/// `PCT` (`30` or `30%`), 1 to 100.
pub fn parse_share(v: &str) -> Result<u32, String> {
    match fgpu_common::quantity::parse_percent(v) {
        Ok(0) => Err("0 is not a share (1-100; unset the variable for none)".into()),
        Ok(p) => Ok(u32::from(p)),
        Err(e) => Err(format!("{e} (expected 1-100, e.g. 30 or 30%)")),
    }
}

/// Reads the ledger's compute settings (only when a ledger is in use anyway) and switches the
/// gate on or off.
fn scan_ledger() {
    let mut gated = false;
    if crate::config::active()
        && let Some((l, _)) = ledger_file::get()
    {
        SEEN_GENERATION.store(l.limits.generation.load(Acquire), Relaxed);
        gated = (0..MAX_DEVICES).any(|i| ledger_setting(l, i).0);
    }
    LEDGER_GATED.store(gated, Relaxed);
    let on = gated || ENV_PCT.load(Relaxed) != 0;
    STATE.store(if on { ON } else { OFF }, Relaxed);
    crate::launch::publish(!on);
}

/// The ledger generation the compute settings were last read at (u64::MAX: never).
static SEEN_GENERATION: AtomicU64 = AtomicU64::new(u64::MAX);

/// Re-reads the compute settings if the ledger's limits changed since they were read (the
/// agent bumps `generation` after every change): one load when nothing changed. Called by
/// the gated launch path and the agent link's periodic check.
pub fn check_generation() {
    if let Some((l, _)) = ledger_file::get() {
        let g = l.limits.generation.load(Acquire);
        let seen = SEEN_GENERATION.load(Relaxed);
        if g != seen && seen != u64::MAX {
            ledger_changed();
        }
    }
}

/// The ledger's limits changed (or a new ledger was installed): re-reads the compute
/// settings; per-device modes are resolved again at the next launch.
pub fn ledger_changed() {
    INIT.call_once(init);
    for d in &DEVS {
        d.mode.store(M_UNSET, Release);
    }
    scan_ledger();
}

/// At exit: batches still outstanding will never be settled by this process; take them out
/// of the ledger's `inflight` so that the controller does not wait for them.
fn forget_outstanding() {
    for s in &SLOTS {
        let Some(g) = s.try_own() else {
            continue;
        };
        let inner = g.inner();
        while inner.out > 0 {
            pop_oldest(inner);
        }
    }
}

extern "C" fn report() {
    if STATE.load(Relaxed) != ON {
        return;
    }
    forget_outstanding();
    let s = &STATS;
    info!(
        "compute gate: launches={} batches={} events_created={} events_recorded={} \
         measured_ms={} capture_skips={} waits={} wait_ms={} sync_ms={}",
        s.gated_launches.load(Relaxed),
        s.batches.load(Relaxed),
        s.events_created.load(Relaxed),
        s.events_recorded.load(Relaxed),
        s.measured_ns.load(Relaxed) / 1_000_000,
        s.capture_skips.load(Relaxed),
        s.waits.load(Relaxed),
        s.wait_ns.load(Relaxed) / 1_000_000,
        s.sync_ns.load(Relaxed) / 1_000_000
    );
}

/// The gated path of a launch into `stream` (`ptsz`: the entry point treats stream 0 as the
/// per-thread stream). `call` makes the real launch.
pub fn launch(kind: Kind, stream: Handle, ptsz: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    if !enabled() {
        return call();
    }
    check_generation();
    let now = now_ns();
    let (key, rec) = stream_key(stream as usize, ptsz);
    let Some(s) = slot(key, rec, now) else {
        return call();
    };
    let prev = s.last_use.swap(now, Relaxed);
    let (d, m) = dev_mode(s.ord.load(Relaxed));
    if m == M_OFF {
        return call();
    }
    STATS.gated_launches.fetch_add(1, Relaxed);
    // Close the open batch before the GPU may idle inside it — a pause in this stream's
    // launches, or (just before the first sleep) a wait for budget — so that its events
    // never count idle time.
    let close_open = || {
        if let Some(g) = s.try_own()
            && s.key.load(Acquire) == key
        {
            close_batch(s, g.inner(), d, m);
        }
    };
    let paused = now.saturating_sub(prev) > GAP_NS;
    if paused {
        close_open();
    }
    if !admit(d, m, rec, || {
        if !paused {
            close_open();
        }
    }) {
        return call(); // capturing: recorded into a graph, charged when the graph runs
    }
    // Admission may have switched the device to its local fallback.
    let m = d.mode.load(Acquire);
    let Some(g) = s.try_own() else {
        // Another thread does this stream's bookkeeping right now: charge the estimate.
        let rc = call();
        if rc == CUDA_SUCCESS {
            let est = s.est[kind as usize].load(Relaxed).max(0);
            charge_local(d, m, est);
            s.stray_est.fetch_add(est, Relaxed);
            s.stray_n.fetch_add(1, Relaxed);
        }
        return rc;
    };
    if s.key.load(Acquire) != key {
        return call(); // the slot was given to another stream meanwhile
    }
    let inner = g.inner();
    if kind == Kind::Graph {
        close_batch(s, inner, d, m); // a graph is a batch of its own
    }
    if inner.open.is_none() && !open_batch(s, inner, d, m, kind, now) {
        return call(); // capturing
    }
    let rc = call();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let k = kind as usize;
    let est = if inner.known[k] { inner.est[k] } else { 0 };
    charge_local(d, m, est);
    let close = {
        let Some(b) = inner.open.as_mut() else {
            return rc;
        };
        b.est += est;
        b.n += 1;
        kind == Kind::Graph
            || !inner.known[k]
            || b.est >= BATCH_GPU_NS
            || now_ns().saturating_sub(b.at) >= BATCH_HOST_NS
    };
    if close {
        close_batch(s, inner, d, m);
    }
    rc
}
