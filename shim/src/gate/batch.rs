//! Batches: a stream's launches measured together with a pair of timing events.
//!
//! A batch is opened before a launch (recording a start event if the stream was idle; on a
//! busy stream it starts where the batch before it ends) and closed after its last launch
//! (recording its end event). When the end event has completed, the GPU time between the two
//! is what the batch cost: the estimate charged at launch time is corrected by the
//! difference and the stream's per-launch estimate moves toward the new sample. At most
//! [`DEPTH`] closed batches per stream are unmeasured, and no more estimated work than the
//! controller's queue bound: closing another waits for the oldest (polling its end event).

use std::ffi::c_uint;
use std::sync::atomic::Ordering::Relaxed;

use fgpu_common::ledger::SlotCompute;

use super::budget::{self, Dev};
use super::driver::{
    Api, CU_EVENT_DEFAULT, CUDA_ERROR_NOT_READY, CUDA_SUCCESS, RelaxedCapture, capturing,
    elapsed_ns, event_create, event_query, event_record, stream_idle,
};
use super::streams::{Inner, Stream};
use super::{Kind, STATS, now_ns};

/// Batch records per stream (events: one start and one end per record).
pub const RING: usize = 8;
/// Closed, unmeasured batches per stream at most (while the cost per launch is known; 1
/// while it is not): what the controller's queue bound allows, since batches close at half
/// of it — a bound scaled for a multi-process container (docs/compute.md) takes more than
/// the 3 records of before. `FGPU_GATE_DEPTH` lowers it ([`super::tuning`]).
pub const DEPTH: usize = RING - 1;

/// How a batch's GPU time starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At the end event of the batch before it (the stream was busy: back to back).
    Prev,
    /// At its own start event (the stream was idle).
    Own,
    /// Unknown (no event could be recorded): charged by estimate only.
    None,
}

#[derive(Clone, Copy)]
pub struct Batch {
    pub start: Start,
    pub est: i64,
    pub n: u32,
    pub kind: Kind,
    pub at: u64,
    /// The process's ledger record it is counted in as queued work (None: not counted).
    /// Ledger mappings are never unmapped, so the reference stays valid.
    pub counted: Option<&'static SlotCompute>,
}

pub const NO_BATCH: Batch = Batch {
    start: Start::None,
    est: 0,
    n: 0,
    kind: Kind::Kernel,
    at: 0,
    counted: None,
};

fn ensure_event(api: Api, ev: &mut usize, flags: c_uint) -> bool {
    if *ev == 0 {
        *ev = event_create(api, flags);
    }
    *ev != 0
}

/// Settles the oldest batch (its end event has completed, or failed).
fn settle_oldest(s: &Stream, inner: &mut Inner, d: &Dev, m: u8, done: bool) {
    let p = inner.head;
    let b = inner.ring[p];
    let start = match b.start {
        Start::Own => inner.ev_start[p],
        Start::Prev => inner.ev_end[(p + RING - 1) % RING],
        Start::None => 0,
    };
    let measured = if done && start != 0 {
        elapsed_ns(inner.api, start, inner.ev_end[p])
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
        budget::charge_local(d, m, ns - b.est);
        budget::measured(d, m, ns, b.n);
        STATS.measured_ns.fetch_add(ns as u64, Relaxed);
    } else {
        budget::measured(d, m, 0, b.n);
    }
    pop_oldest(inner);
}

/// Removes the oldest closed batch from the ring (and from the ledger's queued work).
pub fn pop_oldest(inner: &mut Inner) {
    let p = inner.head;
    let b = inner.ring[p];
    if let Some(c) = b.counted {
        c.done(b.est);
    }
    inner.queued -= b.est;
    inner.ring[p] = NO_BATCH;
    inner.head = (p + 1) % RING;
    inner.out -= 1;
}

/// Settles every batch whose end event has completed (never waits).
pub fn settle_ready(s: &Stream, inner: &mut Inner, d: &Dev, m: u8) {
    if inner.out == 0 {
        return;
    }
    let _relaxed = RelaxedCapture::enter(inner.api);
    while inner.out > 0 {
        match event_query(inner.api, inner.ev_end[inner.head]) {
            CUDA_SUCCESS => settle_oldest(s, inner, d, m, true),
            CUDA_ERROR_NOT_READY => break,
            _ => settle_oldest(s, inner, d, m, false),
        }
    }
}

/// The first and the longest sleep between two looks at the oldest batch's end event while
/// waiting for it (the kernel's default timer slack makes any sleep about 50 us anyway).
const POLL_FIRST_NS: u64 = 20_000;
const POLL_MAX_NS: u64 = 200_000;

/// Waits for the oldest batch and settles it. The end events are plain timing events (no
/// `CU_EVENT_BLOCKING_SYNC`: a blocking-sync event makes the GPU raise an interrupt at its
/// completion and the driver's thread wake up — for every batch, waited for or not; on the
/// H200's VM that cost every gated process ~0.6 wake-ups per batch and 4-20% of a CPU-bound
/// loop's speed), so the wait looks at the event and sleeps in between instead of spinning
/// in `cuEventSynchronize`.
fn wait_oldest(s: &Stream, inner: &mut Inner, d: &Dev, m: u8) {
    let _relaxed = RelaxedCapture::enter(inner.api);
    let t = now_ns();
    let ev = inner.ev_end[inner.head];
    let mut nap = POLL_FIRST_NS;
    let ok = loop {
        match event_query(inner.api, ev) {
            CUDA_SUCCESS => break true,
            CUDA_ERROR_NOT_READY => {
                budget::sleep_ns(nap);
                nap = (nap * 2).min(POLL_MAX_NS);
            }
            _ => break false,
        }
    };
    STATS.sync_ns.fetch_add(now_ns() - t, Relaxed);
    settle_oldest(s, inner, d, m, ok);
}

/// Opens a batch before a launch. False if the stream is capturing (nothing recorded).
pub fn open_batch(s: &Stream, inner: &mut Inner, d: &Dev, m: u8, kind: Kind, now: u64) -> bool {
    settle_ready(s, inner, d, m);
    let start = if inner.out > 0 {
        Start::Prev
    } else {
        if capturing(inner.api, inner.rec) {
            return false;
        }
        let p = (inner.head + inner.out) % RING;
        let ok = ensure_event(inner.api, &mut inner.ev_start[p], CU_EVENT_DEFAULT)
            && event_record(inner.api, inner.ev_start[p], inner.rec);
        if ok { Start::Own } else { Start::None }
    };
    inner.open = Some(Batch {
        start,
        est: 0,
        n: 0,
        kind,
        at: now,
        // Queued work from its first launch on: the controller's drain waits for it.
        counted: budget::queued(d, m, 0),
    });
    true
}

/// Adds a launch's estimate to the open batch (and to the process's queued work).
pub fn add_to_open(inner: &mut Inner, est: i64) -> Option<&mut Batch> {
    let b = inner.open.as_mut()?;
    b.est += est;
    b.n += 1;
    if let Some(c) = b.counted {
        c.add_queued(est);
    }
    Some(b)
}

/// Drops the open batch (the process exits): out of the process's queued work.
pub fn forget_open(inner: &mut Inner) {
    if let Some(b) = inner.open.take() {
        forget(&b);
    }
}

/// A batch that will never be measured: out of the process's queued work.
fn forget(b: &Batch) {
    if let Some(c) = b.counted {
        c.done(b.est);
    }
}

/// Takes the open batch with the launches that threads without the owner flag charged to
/// the stream folded in.
fn take_open(s: &Stream, inner: &mut Inner) -> Option<Batch> {
    let mut b = inner.open.take()?;
    let stray = s.stray_est.swap(0, Relaxed);
    b.est += stray;
    b.n += s.stray_n.swap(0, Relaxed);
    if let Some(c) = b.counted {
        c.add_queued(stray);
    }
    Some(b)
}

/// Closes the open batch when the stream paused (or before a wait): if the stream has run
/// dry meanwhile, an end event recorded now would count the idle time as the batch's, so a
/// batch whose cost per launch is known is accounted by its estimate instead (no event).
/// Otherwise as [`close_batch`].
pub fn close_after_pause(s: &Stream, inner: &mut Inner, d: &Dev, m: u8) {
    let known = inner.open.is_some_and(|b| inner.known[b.kind as usize]);
    settle_ready(s, inner, d, m);
    if known && inner.out == 0 && stream_idle(inner.api, inner.rec) {
        let Some(b) = take_open(s, inner) else {
            return;
        };
        if b.n > 0 {
            budget::measured(d, m, b.est, b.n);
            STATS.estimated_batches.fetch_add(1, Relaxed);
        }
        forget(&b);
        return;
    }
    close_batch(s, inner, d, m);
}

/// Closes the open batch after its last launch: records its end event (unless the stream is
/// capturing: then its estimates are refunded and it is forgotten).
pub fn close_batch(s: &Stream, inner: &mut Inner, d: &Dev, m: u8) {
    let Some(b) = take_open(s, inner) else {
        return;
    };
    if b.n == 0 {
        forget(&b);
        return;
    }
    if capturing(inner.api, inner.rec) {
        budget::charge_local(d, m, -b.est);
        forget(&b);
        return;
    }
    let max_out = if inner.known[b.kind as usize] {
        super::tuning::depth()
    } else {
        1
    };
    let bound = budget::queue_bound(d, m);
    settle_ready(s, inner, d, m);
    while inner.out >= max_out || (inner.out > 0 && bound > 0 && inner.queued + b.est > bound) {
        wait_oldest(s, inner, d, m);
    }
    // A `Prev` start stays valid even if the batch before was settled just now: an end event
    // is recorded again only when its record is reused, and the wait above keeps at most
    // RING - 1 records in use.
    let p = (inner.head + inner.out) % RING;
    if !(ensure_event(inner.api, &mut inner.ev_end[p], CU_EVENT_DEFAULT)
        && event_record(inner.api, inner.ev_end[p], inner.rec))
    {
        forget(&b);
        return; // charged by estimate only
    }
    inner.queued += b.est;
    inner.ring[p] = b;
    inner.out += 1;
    STATS.batches.fetch_add(1, Relaxed);
}
