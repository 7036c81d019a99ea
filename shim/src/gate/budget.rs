//! Per-device admission: a process-local token bucket (`FGPU_COMPUTE_SHARE`, a standalone
//! cap) and/or the agent's turns on the ledger (docs/compute.md, "Agent-driven mode").
//!
//! Under the agent a launch waits while the container's turn on the device is closed. The
//! turn, the controller's heartbeat and the queue bound are in the ledger's read-only limits
//! page; what this process tells the controller — it waits (a stamp of the heartbeat,
//! renewed at every look), it launched, what it has queued — is in its own slot. Nothing is
//! left behind when the process dies or stops: the stamps go stale by the controller's
//! clock, and its slot is reclaimed.

use std::sync::atomic::{
    AtomicI64, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed,
    Ordering::Release,
};

use fgpu_common::ledger::{DeviceTurn, Ledger, MAX_DEVICES, SlotCompute};

use super::driver::{self, DEVICES};
use super::{ENV_PCT, LEDGER_GATED, STALE_WARNED, STATS, now_ns};
use crate::ledger;
use crate::log::warning;

/// A local bucket holds at most the share of this window (the burst after idling).
pub const WINDOW_NS: i64 = 100_000_000;
/// Longest single sleep while waiting for budget.
const MAX_SLEEP_NS: u64 = 10_000_000;
/// Shortest one.
const MIN_SLEEP_NS: u64 = 50_000;
/// Longest sleep on the ledger's grant word while waiting for a turn (the waiting stamp is
/// renewed this often).
const LEDGER_POLL_NS: u64 = 1_000_000;
/// ...while some of this process's batches are still running (their completion is what
/// the controller waits for before the next turn).
const DRAIN_POLL_NS: u64 = 100_000;
/// A controller whose heartbeat stands still this long is considered gone: the device falls
/// back to a local bucket at the ledger's rate until the ledger changes.
const LEDGER_STALE_NS: u64 = 1_000_000_000;

pub const M_UNSET: u8 = 0;
pub const M_OFF: u8 = 1;
pub const M_LOCAL: u8 = 2;
pub const M_LEDGER: u8 = 4;

/// One device's admission state.
pub struct Dev {
    /// M_UNSET, M_OFF, or M_LOCAL | M_LEDGER bits.
    pub mode: AtomicU8,
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

static DEVS: [Dev; DEVICES] = [const { Dev::new() }; DEVICES];
/// Threads of this process waiting for a turn, per ledger device record.
static WAITERS: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];

/// Every device's mode is resolved again at its next launch (the ledger changed).
pub fn reset_modes() {
    for d in &DEVS {
        d.mode.store(M_UNSET, Release);
    }
}

/// In a fork child: no thread of this process waits.
pub fn after_fork_child() {
    for w in &WAITERS {
        w.store(0, Relaxed);
    }
}

pub(super) fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: relative sleep with a valid timespec; an early wake-up only shortens it.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// What the watcher thread needs to know, in one look at this process's ledger-gated devices.
pub struct Watch {
    /// The word to sleep on — the turn word of a device where this process has work queued
    /// (batches counted in its slot), else of the first one — and its value, read before the
    /// turn states below (a change after this wakes the sleep at once).
    pub word: Option<(&'static AtomicU32, u32)>,
    /// More than one device is gated (one futex cannot watch them all).
    pub several: bool,
    /// A turn is closed where this process still has work queued: the controller waits for
    /// that work to drain.
    pub closed_with_work: bool,
}

pub fn watch() -> Watch {
    let mut w = Watch {
        word: None,
        several: false,
        closed_with_work: false,
    };
    let mut gated = 0;
    for d in &DEVS {
        if d.mode.load(Relaxed) & M_LEDGER == 0 {
            continue;
        }
        let Some((_, c, t)) = ledger_parts(d) else {
            continue;
        };
        gated += 1;
        let seen = t.grant.load(Acquire);
        let queued = c.inflight.load(Relaxed) > 0;
        if w.word.is_none() || queued {
            w.word = Some((&t.grant, seen));
        }
        w.closed_with_work |= queued && !t.is_open();
    }
    w.several = gated > 1;
    w
}

/// Sleeps on a turn word while it holds `seen`, at most `ns` (the watcher thread).
pub fn watch_wait(word: &AtomicU32, seen: u32, ns: u64) {
    futex_wait(word, seen, ns);
}

/// Sleeps on `word` while it still holds `seen`, at most `ns` (a futex on the shared,
/// read-only limits page: the agent's controller wakes it at every change of the turn).
fn futex_wait(word: &AtomicU32, seen: u32, ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT (shared: the word is in a MAP_SHARED ledger mapping; waiting only
    // reads it, so a read-only mapping will do) on a valid, aligned u32 with a relative
    // timeout; it only sleeps.
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
pub fn ledger_setting(l: &Ledger, idx: usize) -> (bool, u32) {
    let d = &l.limits.devices[idx];
    let (share, cap) = (d.compute_share.load(Relaxed), d.compute_cap.load(Relaxed));
    let gated = |p: u32| (1..100).contains(&p);
    let pct = if gated(cap) { cap } else { share };
    (gated(cap) || gated(share), pct)
}

/// Resolves (once per ledger change) how gate device `ord` is gated.
pub fn dev_mode(ord: usize) -> (&'static Dev, u8) {
    let d = &DEVS[ord.min(DEVICES - 1)];
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
        && let Some((l, _)) = ledger::get()
        && let Some(idx) = driver::dev_index(l, ord)
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

/// The ledger, this process's compute record and the turn of `d`'s ledger device (looked up
/// each time: the ledger may be replaced when the agent reconnects).
fn ledger_parts(d: &Dev) -> Option<(&'static Ledger, &'static SlotCompute, &'static DeviceTurn)> {
    let (l, slot) = ledger::get()?;
    let idx = d.ledger_idx.load(Relaxed).min(MAX_DEVICES - 1);
    Some((l, l.slot_compute(slot, idx), l.turn(idx)))
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
pub fn charge_local(d: &Dev, m: u8, ns: i64) {
    if m & M_LOCAL != 0 && ns != 0 {
        d.tokens.fetch_sub(ns, Relaxed);
    }
}

/// Reports measured GPU time (0: none measured) and the launches of a completed batch to
/// the agent's controller (the container's totals).
pub fn measured(d: &Dev, m: u8, ns: i64, launches: u32) {
    if m & M_LEDGER != 0
        && (ns > 0 || launches > 0)
        && let Some((l, _)) = ledger::get()
    {
        let idx = d.ledger_idx.load(Relaxed).min(MAX_DEVICES - 1);
        let c = &l.usage.compute[idx];
        if ns > 0 {
            c.gpu_ns.fetch_add(ns as u64, Relaxed);
        }
        if launches > 0 {
            c.launches.fetch_add(u64::from(launches), Relaxed);
        }
    }
}

/// Counts a closed batch as this process's queued work; returns the record to count it
/// out of when it completes.
pub fn queued(d: &Dev, m: u8, est: i64) -> Option<&'static SlotCompute> {
    if m & M_LEDGER == 0 {
        return None;
    }
    let (_, c, _) = ledger_parts(d)?;
    c.queued(est);
    Some(c)
}

/// The most estimated GPU time a stream may have queued (0: only the batch count bounds it).
pub fn queue_bound(d: &Dev, m: u8) -> i64 {
    if m & M_LEDGER == 0 {
        return 0;
    }
    ledger_parts(d).map_or(0, |(_, _, t)| bound_of(t))
}

fn bound_of(t: &DeviceTurn) -> i64 {
    t.queue_ns.load(Relaxed).min(i64::MAX as u64) as i64
}

/// Notes a gated launch for the controller (it is not idle); returns the queue bound
/// ([`queue_bound`]), read from the same record.
pub fn launched(d: &Dev, m: u8) -> i64 {
    if m & M_LEDGER == 0 {
        return 0;
    }
    ledger_parts(d).map_or(0, |(_, c, t)| {
        c.launched(t.beat());
        bound_of(t)
    })
}

/// Counts the calling thread among the process's waiters for as long as it lives; the last
/// one out clears the process's waiting stamp.
struct Waiting(Option<(usize, &'static SlotCompute)>);

impl Waiting {
    fn enter(&mut self, idx: usize, c: &'static SlotCompute) {
        if self.0.is_none() {
            WAITERS[idx].fetch_add(1, Relaxed);
            self.0 = Some((idx, c));
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some((idx, c)) = self.0
            && WAITERS[idx].fetch_sub(1, Relaxed) == 1
        {
            c.wait_clear();
        }
    }
}

/// Waits until device `d` admits a launch into `stream`, calling `before_wait` once before
/// the first sleep; `now` is the caller's reading of the clock (the common case, admitted at
/// once, reads it no more). The time it was admitted at (`now` unless it slept), or None (at
/// once, not charged) if `stream` turned out to be capturing: nothing runs now, so nothing
/// waits. `settle` settles this process's completed batches and says whether some are still
/// outstanding.
pub fn admit(
    d: &Dev,
    mut m: u8,
    now: u64,
    capturing: impl Fn() -> bool,
    settle: impl Fn() -> bool,
    before_wait: impl FnOnce(),
) -> Option<u64> {
    let mut before_wait = Some(before_wait);
    let mut checked = false;
    let mut started = 0u64;
    let mut beat_seen = u64::MAX;
    let mut beat_since = 0u64;
    let mut waiting = Waiting(None);
    let mut first = Some(now);
    loop {
        let now = first.take().unwrap_or_else(now_ns);
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
            && let Some((_, c, t)) = ledger_parts(d)
        {
            // Read the grant word before the state: a grant made after this load wakes the
            // futex wait below at once (its value no longer matches).
            let g = t.grant.load(Acquire);
            if !t.is_open() {
                let beat = t.beat();
                if beat != beat_seen {
                    (beat_seen, beat_since) = (beat, now);
                } else if now - beat_since > LEDGER_STALE_NS {
                    m = ledger_abandoned(d, m);
                    continue;
                }
                waiting.enter(d.ledger_idx.load(Relaxed).min(MAX_DEVICES - 1), c);
                c.wait_stamp(beat);
                grant = Some((t, g));
                // Settle what completed, so the controller sees this container's work
                // drain (and hands the device on) without waiting for the next launch.
                sleep = sleep.max(if settle() {
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
            return Some(now);
        }
        if !checked {
            checked = true;
            if capturing() {
                return None;
            }
            started = now;
            if let Some(f) = before_wait.take() {
                f();
            }
        }
        match grant {
            Some((t, g)) => futex_wait(&t.grant, g, sleep.min(LEDGER_POLL_NS)),
            None => sleep_ns(sleep.min(MAX_SLEEP_NS)),
        }
    }
}

/// The agent stopped deciding turns for device `d`: fall back to a local bucket at the
/// ledger's rate (kept until the ledger changes, see [`super::ledger_changed`]).
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
