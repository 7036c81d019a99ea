//! Parking's broker (docs/parking.md): when a process asks for room (the driver refused an
//! allocation or an unpark for want of device memory), pick an idle parkable container on
//! that GPU — least recently used first — and ask its processes to park; answer the asker
//! once they have.
//!
//! The thread owns everything it remembers (the park under way, the containers that just
//! failed to park); what it reads and writes is the ledgers' shared pages
//! (`fgpu_common::ledger::park`). The choice itself is [`pick`], a pure function.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fgpu_common::ledger::park::{PARK_OK, RESIDENT, ROOM_COMING, ROOM_DONE, ROOM_NONE, room_tag};
use fgpu_common::ledger::{Ledger, MAX_DEVICES, uuid_key};

use super::compute::Gaps;
use super::gpus::Gpus;
use super::ledgers::{CgroupLedger, Ledgers};

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
type Seen = HashMap<(String, usize), [u64; 4]>;

/// Adds what the ledgers' slots did since the last look to `figures` (counters of a slot
/// whose generation changed start from zero: a new process).
fn observe(all: &[Arc<CgroupLedger>], seen: &mut Seen, figures: &ParkFigures) {
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

/// How often the broker looks.
const TICK: Duration = Duration::from_millis(50);
/// How long a park may take before the asker is told "none".
const PARK_TIMEOUT_MS: u64 = 60_000;
/// A container that could not be parked is not asked again for this long.
const FAILED_PAUSE_MS: u64 = 10_000;

/// What the broker knows of one parkable container, for [`pick`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub cgroup: String,
    /// Bytes its processes hold on the GPU asked about (context overhead excluded).
    pub movable: u64,
    /// Bytes it would put in host memory (all GPUs).
    pub total: u64,
    /// The latest use of the GPU by any of its processes, CLOCK_MONOTONIC ms.
    pub last_active_ms: u64,
    pub park_after_ms: u64,
    /// Some process of it is not resident, or cannot be parked.
    pub unavailable: bool,
}

/// Whom to park for room: among the candidates idle for their `park_after`, available and
/// holding memory on the GPU, the least recently used whose bytes fit in what host memory is
/// left. None if there is none.
pub fn pick(cands: &[Candidate], now_ms: u64, host_left: u64) -> Option<usize> {
    cands
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            !c.unavailable
                && c.movable > 0
                && c.total <= host_left
                && now_ms.saturating_sub(c.last_active_ms) >= c.park_after_ms
        })
        .min_by_key(|(_, c)| c.last_active_ms)
        .map(|(i, _)| i)
}

/// Live slots of a ledger (holding bytes).
fn live(l: &Ledger) -> impl Iterator<Item = usize> + '_ {
    (0..l.slots_in_range()).filter(|&s| l.slot_in_use(s))
}

/// The ledger's device record bound to `uuid`.
fn record_of(l: &Ledger, uuid: &[u8; 16]) -> Option<usize> {
    let key = uuid_key(uuid);
    (0..MAX_DEVICES).find(|&i| l.usage.devices[i].key.load(SeqCst) == key)
}

/// [`Candidate`] for `c` on the GPU `uuid`; None if it is not parkable.
fn candidate(c: &CgroupLedger, uuid: &[u8; 16]) -> Option<Candidate> {
    let l = c.ledger();
    let park_after_ms = l.park_after_ms()?;
    let rec = record_of(l, uuid)?;
    let mut cand = Candidate {
        cgroup: c.cgroup.clone(),
        movable: 0,
        total: 0,
        last_active_ms: 0,
        park_after_ms,
        unavailable: false,
    };
    for s in live(l) {
        let slot = &l.slots[s];
        let sp = l.slot_park(s);
        let held = |i: usize| {
            slot.used[i]
                .load(SeqCst)
                .saturating_sub(slot.overhead[i].load(SeqCst))
        };
        cand.movable += held(rec);
        cand.total += (0..MAX_DEVICES).map(held).sum::<u64>();
        cand.last_active_ms = cand.last_active_ms.max(sp.last_active_ms.load(SeqCst));
        cand.unavailable |= sp.phase.load(SeqCst) != RESIDENT || sp.pinned.load(SeqCst) != 0;
    }
    Some(cand)
}

/// A park under way: whom, which request, and for whom.
struct Pending {
    target: Arc<CgroupLedger>,
    epoch: u64,
    asker: Arc<CgroupLedger>,
    tag: u64,
    since_ms: u64,
}

/// What the broker remembers between looks.
struct Broker<'f> {
    figures: &'f ParkFigures,
    gpus: &'f Gpus,
    seen: Seen,
    host_budget: u64,
    pending: Option<Pending>,
    /// Containers that failed to park, by cgroup → when.
    failed: HashMap<String, u64>,
}

/// Bytes every container holds in host memory now.
fn parked_now(all: &[Arc<CgroupLedger>], gpus: &Gpus) -> u64 {
    all.iter()
        .map(|c| c.ledger().parked_total(|u| gpus.memory_of(u)))
        .fold(0, u64::saturating_add)
}

/// Tells every ledger how many other containers are parkable, so that a shim whose
/// allocation finds the GPU full asks for room only when someone could be parked.
fn publish_peers(all: &[Arc<CgroupLedger>]) {
    let parkable = all
        .iter()
        .filter(|c| c.ledger().park_after_ms().is_some())
        .count() as u64;
    for c in all {
        let own = u64::from(c.ledger().park_after_ms().is_some());
        let peers = &c.ledger().park().parkable_peers;
        if peers.load(SeqCst) != parkable - own {
            peers.store(parkable - own, SeqCst);
        }
    }
}

fn answer(asker: &CgroupLedger, tag: u64, verdict: u32) {
    let p = asker.ledger().park();
    p.room_verdict.store(verdict, SeqCst);
    p.room_for.store(tag, SeqCst);
}

impl Broker<'_> {
    fn look(&mut self, ledgers: &Ledgers, now_ms: u64) {
        let all = ledgers.all();
        observe(&all, &mut self.seen, self.figures);
        publish_peers(&all);
        if let Some(p) = self.pending.take() {
            self.pending = self.follow(p, now_ms);
        }
        if self.pending.is_some() {
            return;
        }
        for asker in &all {
            let l = asker.ledger();
            for s in 0..l.slots_in_range() {
                let sp = l.slot_park(s);
                let bytes = sp.need_bytes.load(SeqCst);
                if bytes == 0 {
                    continue;
                }
                let tag = room_tag(s, sp.need_seq.load(SeqCst));
                if l.park().room_for.load(SeqCst) == tag {
                    continue; // answered
                }
                let dev = sp.need_dev.load(SeqCst) as usize;
                let uuid = l.device_uuid(dev.min(MAX_DEVICES - 1));
                // A request is the container's word: nobody is parked for it while the GPU
                // has the room asked for (a container cannot make its idle neighbours park
                // by asking for room it does not need).
                if let Some(free) = self.gpus.free_memory(&uuid)
                    && free >= bytes
                {
                    tracing::info!(
                        event = "room_none",
                        cgroup = %asker.cgroup,
                        bytes,
                        free,
                        "asked for room the GPU has: nothing parked"
                    );
                    answer(asker, tag, ROOM_NONE);
                    continue;
                }
                self.failed
                    .retain(|_, at| now_ms.saturating_sub(*at) < FAILED_PAUSE_MS);
                let others: Vec<&Arc<CgroupLedger>> = all
                    .iter()
                    .filter(|c| c.cgroup != asker.cgroup && !self.failed.contains_key(&c.cgroup))
                    .collect();
                let cands: Vec<Candidate> =
                    others.iter().filter_map(|c| candidate(c, &uuid)).collect();
                // What the asker has parked comes back once room is made: it does not count
                // against the host memory the one parked for it may take.
                let asker_parked = l.parked_total(|u| self.gpus.memory_of(u));
                let host_left = self
                    .host_budget
                    .saturating_sub(parked_now(&all, self.gpus).saturating_sub(asker_parked));
                let chosen = pick(&cands, now_ms, host_left).and_then(|i| {
                    others
                        .iter()
                        .find(|c| c.cgroup == cands[i].cgroup)
                        .map(|c| (Arc::clone(c), cands[i].clone()))
                });
                match chosen {
                    None => {
                        tracing::info!(
                            event = "room_none",
                            cgroup = %asker.cgroup,
                            bytes,
                            "asked for room: no idle parkable container to park"
                        );
                        answer(asker, tag, ROOM_NONE);
                    }
                    Some((target, cand)) => {
                        let epoch = target.ledger().park().command.fetch_add(1, SeqCst) + 1;
                        tracing::info!(
                            event = "park_requested",
                            cgroup = %asker.cgroup,
                            bytes,
                            parking = %target.cgroup,
                            movable = cand.movable,
                            idle_ms = now_ms.saturating_sub(cand.last_active_ms),
                            "asked for room: parking the least recently used idle container"
                        );
                        answer(asker, tag, ROOM_COMING);
                        self.pending = Some(Pending {
                            target,
                            epoch,
                            asker: Arc::clone(asker),
                            tag,
                            since_ms: now_ms,
                        });
                        return;
                    }
                }
            }
        }
    }

    /// Follows a park under way: None once it is answered.
    fn follow(&mut self, p: Pending, now_ms: u64) -> Option<Pending> {
        let l = p.target.ledger();
        let slots: Vec<usize> = live(l).collect();
        let done = slots
            .iter()
            .all(|&s| l.slot_park(s).done.load(SeqCst) >= p.epoch);
        if !done && now_ms.saturating_sub(p.since_ms) < PARK_TIMEOUT_MS {
            return Some(p);
        }
        let ok = slots
            .iter()
            .any(|&s| l.slot_park(s).result.load(SeqCst) == PARK_OK);
        if ok {
            let bytes = slots
                .iter()
                .map(|&s| l.parked_bytes(s))
                .fold(0, u64::saturating_add);
            tracing::info!(
                event = "parked",
                cgroup = %p.target.cgroup,
                bytes,
                for_cgroup = %p.asker.cgroup,
                ms = now_ms.saturating_sub(p.since_ms),
                "parked"
            );
            answer(&p.asker, p.tag, ROOM_DONE);
        } else {
            let results: Vec<u32> = slots
                .iter()
                .map(|&s| l.slot_park(s).result.load(SeqCst))
                .collect();
            tracing::warn!(
                event = "park_failed",
                cgroup = %p.target.cgroup,
                ?results,
                timed_out = !done,
                "could not be parked"
            );
            self.failed.insert(p.target.cgroup.clone(), now_ms);
            // Let the asker's next look pick another: no answer yet for this tag.
            p.asker.ledger().park().room_for.store(0, SeqCst);
        }
        None
    }
}

/// The broker's loop (its own thread): `host_budget` bytes of host memory may hold parked
/// memory, all containers together; what parking did goes to `figures`.
pub fn run(ledgers: &Ledgers, figures: &ParkFigures, gpus: &Gpus, host_budget: u64) {
    let mut b = Broker {
        figures,
        gpus,
        seen: HashMap::new(),
        host_budget,
        pending: None,
        failed: HashMap::new(),
    };
    loop {
        b.look(ledgers, fgpu_common::clock::mono_ns() / 1_000_000);
        std::thread::sleep(TICK);
    }
}

/// The default `--park-host-memory`: half of the node's memory (`/proc/meminfo`).
pub fn default_host_budget() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024 / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, movable: u64, last: u64, after: u64) -> Candidate {
        Candidate {
            cgroup: name.into(),
            movable,
            total: movable,
            last_active_ms: last,
            park_after_ms: after,
            unavailable: false,
        }
    }

    #[test]
    fn the_least_recently_used_idle_container_is_parked_first() {
        let cands = [
            c("a", 10, 5_000, 1_000),
            c("b", 10, 2_000, 1_000),
            c("c", 10, 3_000, 1_000),
        ];
        assert_eq!(pick(&cands, 10_000, u64::MAX), Some(1));
    }

    #[test]
    fn a_container_not_idle_for_its_park_after_is_not_parked() {
        // b is the least recently used, but its park-after is longer than its idle time.
        let cands = [c("a", 10, 5_000, 1_000), c("b", 10, 2_000, 30_000)];
        assert_eq!(pick(&cands, 10_000, u64::MAX), Some(0));
        assert_eq!(pick(&cands[1..], 10_000, u64::MAX), None);
    }

    #[test]
    fn nothing_on_the_gpu_pinned_or_too_big_for_host_memory_is_skipped() {
        let mut pinned = c("p", 10, 1_000, 0);
        pinned.unavailable = true;
        let empty = c("e", 0, 1_000, 0);
        let big = c("big", 100, 1_000, 0);
        let ok = c("ok", 10, 9_000, 0);
        let cands = [pinned, empty, big, ok];
        assert_eq!(pick(&cands, 10_000, 50), Some(3));
        assert_eq!(pick(&cands[..3], 10_000, 50), None);
    }

    #[test]
    fn default_host_budget_is_half_the_node() {
        let b = default_host_budget();
        assert!(b > 0, "MemTotal read");
    }
}
