//! What parking did, for the metrics: per cgroup, and the durations of every park and
//! unpark, read from the slots' counters (each process's own word about itself: it only
//! ever reports on that process).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};

use super::super::compute::Gaps;
use super::super::ledgers::CgroupLedger;

/// Upper bounds of the park and unpark duration histograms, seconds.
pub const DURATION_BUCKETS: [f64; 11] =
    [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// What parking did, per cgroup (its ledger) since the agent started, for the metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CgroupFigures {
    pub parks: u64,
    pub unparks: u64,
    /// Bytes moved to host memory by its parks.
    pub parked_bytes: u64,
    /// Time its launches, copies and allocations waited for an unpark, seconds.
    pub wait_s: f64,
}

/// The broker's figures: per cgroup, and the durations of every park and unpark.
#[derive(Debug, Clone)]
pub struct Figures {
    pub per_cgroup: BTreeMap<String, CgroupFigures>,
    pub park: Gaps,
    pub unpark: Gaps,
}

impl Default for Figures {
    fn default() -> Self {
        Figures {
            per_cgroup: BTreeMap::new(),
            park: Gaps::new(&DURATION_BUCKETS),
            unpark: Gaps::new(&DURATION_BUCKETS),
        }
    }
}

/// [`Figures`] shared with the metrics listener: the broker writes, scrapes copy.
#[derive(Debug, Default)]
pub struct ParkFigures(Mutex<Figures>);

impl ParkFigures {
    pub fn snapshot(&self) -> Figures {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Per (cgroup, slot): the slot's generation and the counters last seen there.
pub(super) type Seen = HashMap<(String, usize), [u64; 4]>;

/// Adds what the ledgers' slots did since the last look to `figures` (counters of a slot
/// whose generation changed start from zero: a new process).
pub(super) fn observe(all: &[Arc<CgroupLedger>], seen: &mut Seen, figures: &ParkFigures) {
    let mut f = figures.0.lock().unwrap_or_else(|e| e.into_inner());
    let mut alive = std::collections::HashSet::new();
    for c in all {
        let l = c.ledger();
        for s in 0..l.slots_in_range() {
            let sp = l.slot_park(s);
            let now = [
                l.slots[s].generation.load(SeqCst),
                sp.parks.load(SeqCst),
                sp.unparks.load(SeqCst),
                sp.wait_ns.load(SeqCst),
            ];
            let key = (c.cgroup.clone(), s);
            let before = match seen.get(&key) {
                Some(b) if b[0] == now[0] => *b,
                _ => [now[0], 0, 0, 0],
            };
            if now[1..] != before[1..] {
                let cf = f.per_cgroup.entry(c.cgroup.clone()).or_default();
                if now[1] > before[1] {
                    cf.parks += now[1] - before[1];
                    cf.parked_bytes = cf.parked_bytes.saturating_add(l.parked_bytes(s));
                    let secs = sp.last_park_ns.load(SeqCst) as f64 / 1e9;
                    f.park.observe(secs);
                }
                let cf = f.per_cgroup.entry(c.cgroup.clone()).or_default();
                if now[2] > before[2] {
                    cf.unparks += now[2] - before[2];
                    let secs = sp.last_unpark_ns.load(SeqCst) as f64 / 1e9;
                    f.unpark.observe(secs);
                }
                let cf = f.per_cgroup.entry(c.cgroup.clone()).or_default();
                cf.wait_s += now[3].saturating_sub(before[3]) as f64 / 1e9;
            }
            seen.insert(key, now);
        }
        alive.insert(c.cgroup.clone());
    }
    seen.retain(|(cg, _), _| alive.contains(cg));
    f.per_cgroup.retain(|cg, _| alive.contains(cg));
}
