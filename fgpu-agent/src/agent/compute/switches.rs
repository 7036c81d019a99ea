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

use prometheus_client::metrics::histogram::Histogram;

use super::sched::{MAX_DRAIN_NS, TICK, TenantId};

/// Upper bounds of the histogram's buckets, seconds.
pub const BUCKETS: [f64; 9] = [
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.012, 0.016, 0.024, 0.05,
];

/// Devices followed at most (keys come from the ledgers' pages: bounded whatever they say).
const MAX_DEVICES: usize = 64;

/// Turn switches per device (by the device's uuid key).
#[derive(Debug, Default)]
pub struct SwitchStats {
    by_device: Mutex<HashMap<u64, Histogram>>,
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
            .or_insert_with(|| Histogram::new(BUCKETS))
            .observe(gap_ns as f64 / 1e9);
    }

    /// The histograms, by device uuid key.
    pub fn all(&self) -> Vec<(u64, Histogram)> {
        let by = self.by_device.lock().expect("switch stats lock");
        by.iter().map(|(k, h)| (*k, h.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (sum, count) of the one device's histogram, as the exposition says them.
    fn count(s: &SwitchStats) -> (f64, u64) {
        let mut registry = prometheus_client::registry::Registry::default();
        for (_, h) in s.all() {
            registry.register("switch", "switches", h);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map_or(0.0, |v| v.trim().parse::<f64>().unwrap())
        };
        (value("switch_sum "), value("switch_count ") as u64)
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
