//! Read-only figures of the controller for the metrics: how long a device goes without a
//! holder when the turn passes from one tenant to another (the drain of the previous
//! holder's queued work plus the tick that grants the next turn).
//!
//! The controller reports each grant with the end of the turn before it
//! ([`SwitchStats::granted`]); this never changes a decision. A gap longer than
//! [`MAX_DRAIN_NS`] plus a few ticks is not a switch (nobody was waiting: the device was idle)
//! and is not recorded.

use std::collections::HashMap;
use std::sync::Mutex;

use super::sched::{MAX_DRAIN_NS, TICK, TenantId};

/// Upper bounds of the histogram's buckets, seconds.
pub const BUCKETS: [f64; 9] = [
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.012, 0.016, 0.024, 0.05,
];

/// Devices followed at most (keys come from the ledgers' pages: bounded whatever they say).
const MAX_DEVICES: usize = 64;

/// A histogram's figures, kept by the controller's side in plain numbers (the metrics write
/// them in either exposition format; prometheus-client keeps a histogram's buckets to itself).
#[derive(Debug, Clone, PartialEq)]
pub struct Gaps {
    /// Upper bounds of the buckets, seconds, ascending (`+Inf` after them).
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative), the last one past every bound.
    per_bucket: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Gaps {
    pub fn new(bounds: &'static [f64]) -> Gaps {
        Gaps {
            bounds,
            per_bucket: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// One observation of `secs` (in the first bucket whose bound is at least it).
    pub fn observe(&mut self, secs: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(self.bounds.len());
        self.per_bucket[i] += 1;
        self.sum += secs;
        self.count += 1;
    }

    /// (upper bound, cumulative count), ascending, the last bound `+Inf`: as the exposition
    /// formats write a histogram's buckets.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        self.bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.per_bucket)
            .map(|(b, n)| {
                acc += n;
                (b, acc)
            })
            .collect()
    }
}

/// Turn switches per device (by the device's uuid key).
#[derive(Debug, Default)]
pub struct SwitchStats {
    by_device: Mutex<HashMap<u64, Gaps>>,
}

impl SwitchStats {
    /// The controller granted device `key`'s turn to `to` at `now`; `ended`: when and whose
    /// the device's previous turn ended. A hand-over to another tenant is a switch; a gap
    /// longer than a drain and a few ticks is not (nobody was waiting: the device was idle).
    pub(super) fn granted(&self, key: u64, ended: Option<(u64, TenantId)>, now: u64, to: TenantId) {
        if let Some((at, from)) = ended
            && from != to
        {
            let gap = now.saturating_sub(at);
            if gap <= MAX_DRAIN_NS + 4 * TICK.as_nanos() as u64 {
                self.record(key, gap);
            }
        }
    }

    fn record(&self, key: u64, gap_ns: u64) {
        let mut by = self.by_device.lock().expect("switch stats lock");
        if !by.contains_key(&key) && by.len() >= MAX_DEVICES {
            return;
        }
        by.entry(key)
            .or_insert_with(|| Gaps::new(&BUCKETS))
            .observe(gap_ns as f64 / 1e9);
    }

    /// The histograms, by device uuid key.
    pub fn all(&self) -> Vec<(u64, Gaps)> {
        let by = self.by_device.lock().expect("switch stats lock");
        by.iter().map(|(k, h)| (*k, h.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (sum, count) of the one device's histogram.
    fn count(s: &SwitchStats) -> (f64, u64) {
        s.all().first().map_or((0.0, 0), |(_, g)| (g.sum, g.count))
    }

    #[test]
    fn buckets_are_cumulative_and_end_at_infinity() {
        let mut g = Gaps::new(&[0.001, 0.01, 0.1]);
        for v in [0.0005, 0.001, 0.004, 0.05, 3.0] {
            g.observe(v);
        }
        assert_eq!(
            g.cumulative(),
            vec![(0.001, 2), (0.01, 3), (0.1, 4), (f64::INFINITY, 5)]
        );
        assert_eq!(g.count, 5);
        assert!((g.sum - 3.0555).abs() < 1e-12, "{}", g.sum);
        assert_eq!(
            Gaps::new(&[0.5]).cumulative(),
            vec![(0.5, 0), (f64::INFINITY, 0)]
        );
    }

    #[test]
    fn a_switch_is_the_gap_between_two_tenants_turns() {
        let s = SwitchStats::default();
        let (a, b) = ((1, 0), (2, 0));
        s.granted(9, None, 1_000_000, a);
        s.granted(9, Some((2_000_000, a)), 5_000_000, b);
        let (sum, n) = count(&s);
        assert_eq!(n, 1);
        assert!((sum - 0.003).abs() < 1e-9, "{sum}");
        // The same tenant again is no switch; nor is a gap with nobody waiting.
        s.granted(9, Some((6_000_000, b)), 7_000_000, b);
        s.granted(9, Some((8_000_000, b)), 2_000_000_000, a);
        assert_eq!(count(&s).1, 1);
        // A hand-over within one tick.
        s.granted(9, Some((2_000_000_000, a)), 2_000_500_000, b);
        assert_eq!(count(&s).1, 2);
    }
}
