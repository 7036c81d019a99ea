//! The gate's per-stream table: a fixed array of [`Stream`] records (no heap), found by a
//! key made of the stream handle (or, for the default streams, the context and thread).
//!
//! Each record's bookkeeping ([`Inner`]) belongs to whichever thread holds its `owner`
//! flag. The flag is only ever *tried*: a thread that does not get it charges its launch's
//! estimate and goes on, so nobody waits for it (an ownership token, not a lock, and it may
//! be held across the gate's own event calls).

use std::cell::UnsafeCell;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed,
    Ordering::Release,
};

use super::FULL_WARNED;
use super::batch::{Batch, NO_BATCH, RING};
use super::driver::{self, Api, current_ctx, event_destroy};
use crate::log::warning;

/// Streams tracked at the same time (per process).
pub const STREAMS: usize = 256;
/// A stream record unused for this long may be taken for another stream when the table is
/// full.
const IDLE_EVICT_NS: u64 = 1_000_000_000;
pub const CU_STREAM_PER_THREAD: usize = 2;

pub struct Inner {
    /// The device API of the stream (and of its events).
    pub api: Api,
    /// The context the events belong to.
    pub ctx: usize,
    pub ord: usize,
    /// The stream handle events are recorded on (2 for a per-thread stream).
    pub rec: usize,
    pub ev_start: [usize; RING],
    pub ev_end: [usize; RING],
    pub ring: [Batch; RING],
    pub head: usize,
    pub out: usize,
    pub open: Option<Batch>,
    pub est: [i64; 2],
    pub known: [bool; 2],
    /// Estimated GPU time of the closed, unmeasured batches in `ring`, ns.
    pub queued: i64,
}

pub struct Stream {
    pub key: AtomicU64,
    owner: AtomicBool,
    pub last_use: AtomicU64,
    pub ord: AtomicUsize,
    /// Copies of `inner.est` for threads without the owner flag (-1: not known).
    pub est: [AtomicI64; 2],
    /// Estimates and launches charged by threads without the owner flag, folded into the
    /// owner's next batch.
    pub stray_est: AtomicI64,
    pub stray_n: AtomicU32,
    inner: UnsafeCell<Inner>,
}

// SAFETY: `inner` is only read or written by the thread holding `owner` (acquired with a
// compare-exchange, Acquire; released with a Release store); the other fields are atomics.
unsafe impl Sync for Stream {}

impl Stream {
    const fn new() -> Stream {
        Stream {
            key: AtomicU64::new(0),
            owner: AtomicBool::new(false),
            last_use: AtomicU64::new(0),
            ord: AtomicUsize::new(0),
            est: [AtomicI64::new(-1), AtomicI64::new(-1)],
            stray_est: AtomicI64::new(0),
            stray_n: AtomicU32::new(0),
            inner: UnsafeCell::new(Inner {
                api: Api::Cuda,
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
                queued: 0,
            }),
        }
    }

    /// The owner flag, if nobody holds it. (The guard is made only on success: a guard made
    /// and dropped on failure would release the holder's flag.)
    pub fn try_own(&self) -> Option<Owned<'_>> {
        self.owner
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
            .then(|| Owned(self))
    }
}

pub static TABLE: [Stream; STREAMS] = [const { Stream::new() }; STREAMS];

/// The owner flag of a slot, released on drop.
pub struct Owned<'a>(&'a Stream);

impl Owned<'_> {
    #[allow(clippy::mut_from_ref)]
    pub fn inner(&self) -> &mut Inner {
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
pub fn stream_key(api: Api, stream: usize, ptsz: bool) -> (u64, usize) {
    let per_thread = stream == CU_STREAM_PER_THREAD || (stream == 0 && ptsz);
    let legacy = stream == 1 || (stream == 0 && !ptsz);
    let mix = |a: usize, b: usize| {
        let k = (a as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (b as u64).rotate_left(17);
        k | 1 << 63
    };
    if per_thread {
        (mix(current_ctx(api), thread_tag()), CU_STREAM_PER_THREAD)
    } else if legacy {
        (mix(current_ctx(api), 1), 0)
    } else {
        (stream as u64, stream)
    }
}

fn hash(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % STREAMS
}

/// The slot of `key`, made on first use (None: the table is full of busy streams).
pub fn find(api: Api, key: u64, rec: usize, now: u64) -> Option<&'static Stream> {
    let h = hash(key);
    for i in 0..STREAMS {
        let s = &TABLE[(h + i) % STREAMS];
        match s.key.load(Acquire) {
            k if k == key => return Some(s),
            0 => {
                let Some(g) = s.try_own() else { continue };
                if s.key.load(Acquire) != 0 {
                    continue; // taken meanwhile (for another key, or ours: found next time)
                }
                setup(&g, api, key, rec, now);
                return Some(s);
            }
            _ => {}
        }
    }
    // Full: take a slot idle for a while.
    for s in &TABLE {
        if now.saturating_sub(s.last_use.load(Relaxed)) < IDLE_EVICT_NS {
            continue;
        }
        let Some(g) = s.try_own() else { continue };
        let inner = g.inner();
        if inner.out == 0 && inner.open.is_none() {
            setup(&g, api, key, rec, now);
            return Some(s);
        }
    }
    if !FULL_WARNED.swap(true, Relaxed) {
        warning!("more than {STREAMS} streams launch at once: some launches are not measured");
    }
    None
}

/// Makes an owned slot the one of `key` (events are kept if the context is the same).
fn setup(g: &Owned<'_>, api: Api, key: u64, rec: usize, now: u64) {
    let s = g.0;
    let inner = g.inner();
    let ctx = current_ctx(api);
    if inner.ctx != ctx || inner.api != api {
        for ev in inner.ev_start.iter_mut().chain(inner.ev_end.iter_mut()) {
            event_destroy(inner.api, *ev);
            *ev = 0;
        }
        inner.ctx = ctx;
        inner.api = api;
    }
    inner.ord = driver::device(api);
    inner.rec = rec;
    inner.ring = [NO_BATCH; RING];
    inner.head = 0;
    inner.out = 0;
    inner.open = None;
    inner.est = [0; 2];
    inner.known = [false; 2];
    inner.queued = 0;
    s.ord.store(inner.ord, Relaxed);
    for e in &s.est {
        e.store(-1, Relaxed);
    }
    s.stray_est.store(0, Relaxed);
    s.stray_n.store(0, Relaxed);
    s.last_use.store(now, Relaxed);
    s.key.store(key, Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_try_leaves_the_holder_its_flag() {
        let s = Stream::new();
        let held = s.try_own().expect("free");
        assert!(s.try_own().is_none(), "held by the first guard");
        assert!(
            s.try_own().is_none(),
            "a failed try must not have released the holder's flag"
        );
        drop(held);
        assert!(s.try_own().is_some());
    }
}
