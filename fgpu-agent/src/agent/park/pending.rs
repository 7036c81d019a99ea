//! Parks under way, and the containers that failed to park.
//!
//! The broker never waits on one park: each is followed at every look ([`follow`]) while
//! other askers are served. A park must start within [`START_MS`] (every process of the
//! container has answered or is parking: the shim's watcher takes a request up within 50 ms)
//! and end within [`deadline_ms`] (10 s and 1 s per GiB it moves, at most
//! [`PARK_TIMEOUT_MS`]). One that does not is abandoned; the container is then skipped for a
//! while ([`Backoffs`]: 10 s, doubling at each failure in a row up to 5 min), and the asker
//! is served by another.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use fgpu_common::ledger::park::{PARK_OK, PARKED, PARKING};

use super::super::ledgers::CgroupLedger;
use super::candidates::live;

/// How long a container has to start a park, ms.
pub const START_MS: u64 = 3_000;
/// How long a park may take at most, ms, whatever its size.
pub const PARK_TIMEOUT_MS: u64 = 60_000;
/// A container that failed to park is first skipped for this long, ms...
pub const BACKOFF_FIRST_MS: u64 = 10_000;
/// ...and at most this long after failures in a row.
pub const BACKOFF_MAX_MS: u64 = 300_000;

/// How long a park of `movable` bytes may take, ms: 10 s and 1 s per GiB (a park of 48 GiB
/// took 3.7–5.6 s on an H200), at most [`PARK_TIMEOUT_MS`].
pub fn deadline_ms(movable: u64) -> u64 {
    (10_000 + movable.div_ceil(1 << 30).saturating_mul(1_000)).min(PARK_TIMEOUT_MS)
}

/// A park under way: whom, which request, and for whom.
pub struct Pending {
    pub target: Arc<CgroupLedger>,
    pub epoch: u64,
    pub asker: Arc<CgroupLedger>,
    pub tag: u64,
    pub since_ms: u64,
    /// What the target was credited with on the GPU, and in all (what it would put in
    /// host memory).
    pub movable: u64,
    pub total: u64,
    /// The GPU, and what the kernel saw the target hold there when it was asked.
    pub uuid: [u8; 16],
    pub seen: u64,
}

/// Where a park stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Waiting,
    /// Parked: the bytes its processes say they moved.
    Parked(u64),
    /// Answered, not parked: each process's result.
    Refused(Vec<u32>),
    /// Not started within [`START_MS`].
    NotStarted,
    /// Started, not done within [`deadline_ms`].
    TimedOut,
}

/// Where `p` stands at `now_ms`.
pub fn follow(p: &Pending, now_ms: u64) -> Outcome {
    let l = p.target.ledger();
    let slots: Vec<usize> = live(l).collect();
    let answered = |s: usize| l.slot_park(s).done.load(SeqCst) >= p.epoch;
    if slots.iter().all(|&s| answered(s)) {
        return if slots
            .iter()
            .any(|&s| l.slot_park(s).result.load(SeqCst) == PARK_OK)
        {
            Outcome::Parked(
                slots
                    .iter()
                    .map(|&s| l.parked_bytes(s))
                    .fold(0, u64::saturating_add),
            )
        } else {
            Outcome::Refused(
                slots
                    .iter()
                    .map(|&s| l.slot_park(s).result.load(SeqCst))
                    .collect(),
            )
        };
    }
    let took = now_ms.saturating_sub(p.since_ms);
    let started = slots
        .iter()
        .all(|&s| answered(s) || matches!(l.slot_park(s).phase.load(SeqCst), PARKING | PARKED));
    if !started && took >= START_MS {
        Outcome::NotStarted
    } else if took >= deadline_ms(p.movable) {
        Outcome::TimedOut
    } else {
        Outcome::Waiting
    }
}

/// One container's pause after failing to park.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    until_ms: u64,
    pause_ms: u64,
}

/// Containers that failed to park, by cgroup.
#[derive(Debug, Default)]
pub struct Backoffs(HashMap<String, Backoff>);

impl Backoffs {
    /// `cgroup` failed to park at `now_ms`: it is skipped for 10 s, or twice as long as
    /// last time if it failed again within a pause of the last one's end. Returns the pause.
    pub fn failed(&mut self, cgroup: &str, now_ms: u64) -> u64 {
        let pause_ms = match self.0.get(cgroup) {
            Some(b) if now_ms < b.until_ms.saturating_add(b.pause_ms) => {
                b.pause_ms.saturating_mul(2).min(BACKOFF_MAX_MS)
            }
            _ => BACKOFF_FIRST_MS,
        };
        self.0.insert(
            cgroup.to_string(),
            Backoff {
                until_ms: now_ms + pause_ms,
                pause_ms,
            },
        );
        pause_ms
    }

    /// `cgroup` parked: its failures are forgotten.
    pub fn parked(&mut self, cgroup: &str) {
        self.0.remove(cgroup);
    }

    /// Whether `cgroup` is skipped at `now_ms`.
    pub fn skips(&self, cgroup: &str, now_ms: u64) -> bool {
        self.0.get(cgroup).is_some_and(|b| now_ms < b.until_ms)
    }

    /// Forgets containers quiet for a pause after their last one, and those gone.
    pub fn prune(&mut self, now_ms: u64, alive: impl Fn(&str) -> bool) {
        self.0
            .retain(|cg, b| alive(cg) && now_ms < b.until_ms.saturating_add(b.pause_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_park_may_take_longer_the_more_it_moves_up_to_a_minute() {
        assert_eq!(deadline_ms(0), 10_000);
        assert_eq!(deadline_ms(512 << 20), 11_000);
        assert_eq!(deadline_ms(48 << 30), 58_000);
        assert_eq!(deadline_ms(1 << 50), PARK_TIMEOUT_MS);
        assert_eq!(deadline_ms(u64::MAX), PARK_TIMEOUT_MS);
    }

    #[test]
    fn a_container_failing_again_is_skipped_longer_and_forgotten_once_it_parks() {
        let mut b = Backoffs::default();
        assert_eq!(b.failed("s", 0), 10_000);
        assert!(b.skips("s", 9_999));
        assert!(!b.skips("s", 10_000));
        assert!(!b.skips("other", 0));
        // Failing again soon after its pause: twice as long, and so on up to 5 min.
        assert_eq!(b.failed("s", 13_000), 20_000);
        assert_eq!(b.failed("s", 36_000), 40_000);
        let mut t = 36_000;
        for _ in 0..10 {
            t += 1_000;
            b.failed("s", t);
        }
        assert_eq!(b.failed("s", t), BACKOFF_MAX_MS);
        b.parked("s");
        assert_eq!(b.failed("s", t), 10_000);
        // Quiet for a pause after its end: forgotten, back to 10 s.
        b.prune(t + 20_000, |_| true);
        assert_eq!(b.failed("s", t + 20_000), 10_000);
        b.prune(t + 20_000, |_| false);
        assert!(!b.skips("s", t + 20_000));
    }
}
