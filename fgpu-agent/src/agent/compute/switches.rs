//! Read-only figures of the controller for the metrics: how long a device goes without a
//! holder when the turn passes from one tenant to another (the drain of the previous
//! holder's queued work plus the tick that grants the next turn).
//!
//! [`SwitchStats::observe`] looks at each device's holder after every tick, and nothing else;
//! it never changes a decision. A gap longer than [`MAX_DRAIN_NS`] plus a few ticks is not a
//! switch (nobody was waiting: the device was idle) and is not recorded.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::metrics::histogram::Histogram;

use super::{DeviceState, MAX_DRAIN_NS, TICK, TenantId};

/// Upper bounds of the histogram's buckets, seconds.
pub const BUCKETS: [f64; 9] = [
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.012, 0.016, 0.024, 0.05,
];

/// Devices followed at most (keys come from the ledgers' pages: bounded whatever they say).
const MAX_DEVICES: usize = 64;

#[derive(Debug, Default)]
struct Last {
    holder: Option<TenantId>,
    /// When the last turn ended, and whose it was, while no turn is held.
    ended: Option<(u64, TenantId)>,
}

/// Turn switches per device (by the device's uuid key).
#[derive(Debug, Default)]
pub struct SwitchStats {
    last: Mutex<HashMap<u64, Last>>,
    by_device: Mutex<HashMap<u64, Histogram>>,
}

impl SwitchStats {
    /// After a tick at `now`: records the switches the tick made.
    pub(super) fn observe(&self, now: u64, devices: &HashMap<u64, DeviceState>) {
        let mut last = self.last.lock().expect("switch stats lock");
        last.retain(|k, _| devices.contains_key(k));
        for (key, dev) in devices {
            if !last.contains_key(key) && last.len() >= MAX_DEVICES {
                continue;
            }
            let l = last.entry(*key).or_default();
            match (l.holder, dev.holder) {
                (Some(a), Some(b)) if a != b => self.record(*key, 0),
                (Some(a), None) => l.ended = Some((now, a)),
                (None, Some(b)) => {
                    if let Some((at, from)) = l.ended.take()
                        && from != b
                    {
                        let gap = now.saturating_sub(at);
                        if gap <= MAX_DRAIN_NS + 4 * TICK.as_nanos() as u64 {
                            self.record(*key, gap);
                        }
                    }
                }
                _ => {}
            }
            l.holder = dev.holder;
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

    fn devices(holder: Option<TenantId>) -> HashMap<u64, DeviceState> {
        let mut d = HashMap::new();
        d.insert(
            9,
            DeviceState {
                holder,
                draining: None,
            },
        );
        d
    }

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
        s.observe(1_000_000, &devices(Some(a)));
        s.observe(2_000_000, &devices(None));
        s.observe(5_000_000, &devices(Some(b)));
        let (sum, n) = count(&s);
        assert_eq!(n, 1);
        assert!((sum - 0.003).abs() < 1e-9, "{sum}");
        // The same tenant again is no switch; nor is a gap with nobody waiting.
        s.observe(6_000_000, &devices(None));
        s.observe(7_000_000, &devices(Some(b)));
        s.observe(8_000_000, &devices(None));
        s.observe(2_000_000_000, &devices(Some(a)));
        assert_eq!(count(&s).1, 1);
        // A hand-over within one tick.
        s.observe(2_000_500_000, &devices(Some(b)));
        assert_eq!(count(&s).1, 2);
    }
}
