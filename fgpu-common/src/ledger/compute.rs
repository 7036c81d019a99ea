//! The compute-share exchange on the ledger (docs/compute.md, "Agent-driven mode"): typed
//! access to the turn records the agent's controller writes and the per-process records the
//! shims write, and the controller's view of a container's processes on one device.
//!
//! Every per-process stamp is a value of the device's heartbeat (the controller's tick
//! counter), never a clock of the tenant's: a stamp that stops moving goes stale by the
//! controller's clock, whatever the tenant's time namespace says. Values a container writes
//! are not trusted: the controller's view clamps counts and durations, ignores stamps from the
//! future and never reads a slot past [`MAX_SLOTS`].

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use super::{DeviceTurn, Ledger, MAX_SLOTS, SlotCompute};

/// Launches wait for a turn.
pub const TURN_CLOSED: i64 = -1;
/// The container holds the device: its launches run.
pub const TURN_OPEN: i64 = 1;
/// The container runs beside the holder (a latency-bound tenant below its share).
pub const TURN_CORUN: i64 = 2;

/// Per-process counts are clamped to this when read (a container may write anything).
const MAX_INFLIGHT: i64 = 1 << 16;
/// Queued estimates are clamped to this (1 s).
const MAX_QUEUED_NS: i64 = 1_000_000_000;

impl DeviceTurn {
    /// Whether launches may run now (the turn is open, alone or beside the holder).
    pub fn is_open(&self) -> bool {
        self.state.load(Acquire) > 0
    }

    /// The controller's heartbeat (0 until the device was first gated).
    pub fn beat(&self) -> u64 {
        self.heartbeat.load(Relaxed)
    }

    /// Sets the turn state, bumping `grant` at every change (waiting threads sleep on it
    /// until the turn opens, each process's watcher until it opens or closes). Returns whether
    /// it changed. The caller wakes the futex.
    pub fn set(&self, state: i64) -> bool {
        let prev = self.state.swap(state, Release);
        if prev != state {
            self.grant.fetch_add(1, Release);
        }
        prev != state
    }
}

impl SlotCompute {
    /// A thread of this process waits for a turn (re-stamped at every look).
    pub fn wait_stamp(&self, beat: u64) {
        self.wait_beat.store(beat.max(1), Relaxed);
    }

    /// Nobody of this process waits any more.
    pub fn wait_clear(&self) {
        self.wait_beat.store(0, Relaxed);
    }

    /// The process launched gated work.
    pub fn launched(&self, beat: u64) {
        if self.launch_beat.load(Relaxed) != beat {
            self.launch_beat.store(beat.max(1), Relaxed);
        }
    }

    /// A batch of estimated `est_ns` was queued on the device (counted from its first launch:
    /// whatever is launched runs, closed into a batch or not).
    pub fn queued(&self, est_ns: i64) {
        self.inflight.fetch_add(1, Relaxed);
        self.queued_ns.fetch_add(est_ns, Relaxed);
    }

    /// More estimated work went into a batch counted with [`queued`](Self::queued).
    pub fn add_queued(&self, est_ns: i64) {
        if est_ns != 0 {
            self.queued_ns.fetch_add(est_ns, Relaxed);
        }
    }

    /// A batch queued with [`queued`](Self::queued) completed (or will never be seen to).
    pub fn done(&self, est_ns: i64) {
        self.inflight.fetch_sub(1, Relaxed);
        self.queued_ns.fetch_sub(est_ns, Relaxed);
    }

    /// Forgets everything (the process is gone, or a new one claims the slot).
    pub fn clear(&self) {
        self.wait_beat.store(0, SeqCst);
        self.launch_beat.store(0, SeqCst);
        self.inflight.store(0, SeqCst);
        self.queued_ns.store(0, SeqCst);
    }
}

/// What a container's processes are doing on one device, as the controller sees it at
/// heartbeat `now` (stamps older than `fresh` beats are stale).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Processes with a thread waiting for a turn (fresh stamps only).
    pub waiting: u32,
    /// The newest launch stamp of any process (0: none), at most `now`.
    pub last_launch: u64,
    /// Batches queued and not yet seen complete, over all processes.
    pub inflight: i64,
    /// Their estimated GPU time, ns.
    pub queued_ns: i64,
    /// Processes using the device: a fresh launch or waiting stamp, or batches in flight.
    pub active: u32,
}

impl Ledger {
    /// Device `dev`'s turn record.
    pub fn turn(&self, dev: usize) -> &DeviceTurn {
        &self.limits.turns[dev]
    }

    /// Process `slot`'s compute record on device `dev`.
    pub fn slot_compute(&self, slot: usize, dev: usize) -> &SlotCompute {
        &self.slots[slot].compute[dev]
    }

    /// Whether process `slot` left compute state behind (a waiting stamp or queued work).
    pub fn slot_compute_in_use(&self, slot: usize) -> bool {
        self.slots[slot]
            .compute
            .iter()
            .any(|c| c.wait_beat.load(Relaxed) != 0 || c.inflight.load(Relaxed) != 0)
    }

    /// The container's activity on `dev` at heartbeat `now` (see [`Activity`]).
    pub fn activity(&self, dev: usize, now: u64, fresh: u64) -> Activity {
        let mut a = Activity::default();
        let is_fresh = |b: u64| b != 0 && b <= now && now - b <= fresh;
        for slot in &self.slots[..self.slots_in_range().min(MAX_SLOTS)] {
            let c = &slot.compute[dev];
            let wait = c.wait_beat.load(Relaxed);
            let launch = c.launch_beat.load(Relaxed);
            let inflight = c.inflight.load(Relaxed).clamp(0, MAX_INFLIGHT);
            if is_fresh(wait) {
                a.waiting += 1;
            }
            if launch <= now {
                a.last_launch = a.last_launch.max(launch);
            }
            if is_fresh(launch) || is_fresh(wait) || inflight > 0 {
                a.active += 1;
            }
            if inflight > 0 {
                a.inflight += inflight;
                a.queued_ns += c.queued_ns.load(Relaxed).clamp(0, MAX_QUEUED_NS);
            }
        }
        a.queued_ns = a.queued_ns.min(MAX_QUEUED_NS);
        a
    }
}
