//! Parking's broker (docs/parking.md): when a process asks for room (the driver refused an
//! allocation or an unpark for want of device memory), pick an idle parkable container on
//! that GPU — least recently used first — and ask its processes to park; answer the asker
//! once they have.
//!
//! Everything a container writes is its own word: a request for room is bounded by what the
//! asker could use and spaced per asker ([`asks`]); a candidate's claims are checked against
//! the kernel's count ([`candidates`]); a park that does not start or end in time is
//! abandoned and its container skipped for a while, and the broker never waits on one park
//! to serve other askers ([`pending`]).
//!
//! The thread owns everything it remembers (the parks under way, the askers, the containers
//! that just failed to park); what it reads and writes is the ledgers' shared pages
//! (`fgpu_common::ledger::park`), the kernel's counts and NVML's free memory.

mod asks;
mod candidates;
mod figures;
mod pending;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use fgpu_common::event::CgroupKey;
use fgpu_common::ledger::park::{ROOM_COMING, ROOM_DONE, ROOM_NONE, room_tag};
use fgpu_common::ledger::{MAX_DEVICES, NO_LIMIT};

use super::gpus::Gpus;
use super::ledgers::{CgroupLedger, Ledgers};
use asks::{Asker, PARK_EVERY_MS, could_use};
use candidates::{Candidate, KernelCounts, candidate, pick};
pub use figures::{CgroupFigures, Figures, ParkFigures};
use figures::{Seen, observe};
use pending::{Backoffs, Outcome, Pending, follow};

/// How often the broker looks.
const TICK: Duration = Duration::from_millis(50);

/// The kernel's subtree totals by (cgroup id, GPU index), read when a request needs them.
pub type KernelTree<'k> = &'k (dyn Fn() -> Vec<(CgroupKey, u64)> + Sync);

/// What the broker remembers between looks.
struct Broker<'f> {
    figures: &'f ParkFigures,
    gpus: &'f Gpus,
    tree: KernelTree<'f>,
    seen: Seen,
    host_budget: u64,
    pending: Vec<Pending>,
    backoffs: Backoffs,
    askers: HashMap<String, Asker>,
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

/// One open request for room: whose, which slot's, its tag.
struct Ask<'a> {
    asker: &'a Arc<CgroupLedger>,
    slot: usize,
    tag: u64,
}

impl Broker<'_> {
    /// The kernel's counts, read into `cache` the first time a look needs them.
    fn counts<'c>(&self, cache: &'c mut Option<KernelCounts>) -> &'c KernelCounts {
        cache.get_or_insert_with(|| KernelCounts::new(&(self.tree)(), self.gpus))
    }

    fn look(&mut self, ledgers: &Ledgers, now_ms: u64) {
        let all = ledgers.all();
        observe(&all, &mut self.seen, self.figures);
        publish_peers(&all);
        let alive: HashSet<&str> = all.iter().map(|c| c.cgroup.as_str()).collect();
        self.backoffs.prune(now_ms, |cg| alive.contains(cg));
        self.askers.retain(|cg, _| alive.contains(cg.as_str()));
        // The kernel's counts, read once per look and only if needed.
        let mut kernel: Option<KernelCounts> = None;
        // NVML's free memory per GPU, read once per look (a container can open a request in
        // every slot it can write).
        let mut free: HashMap<[u8; 16], Option<u64>> = HashMap::new();
        for p in std::mem::take(&mut self.pending) {
            if let Some(p) = self.follow(p, &mut kernel, now_ms) {
                self.pending.push(p);
            }
        }
        for asker in &all {
            // One request per asker is served at a time (the answer is one record).
            if self.pending.iter().any(|p| p.asker.cgroup == asker.cgroup) {
                continue;
            }
            let l = asker.ledger();
            let (room_for, verdict) = (
                l.park().room_for.load(SeqCst),
                l.park().room_verdict.load(SeqCst),
            );
            // Requests of live slots only: a slot nobody holds is taken back by the agent
            // (its request with it), and a request must not outlive the process that made
            // it (or the forger that wrote it into a slot it does not own).
            for s in candidates::live(l) {
                let sp = l.slot_park(s);
                if sp.need_bytes.load(SeqCst) == 0 {
                    continue;
                }
                let tag = room_tag(s, sp.need_seq.load(SeqCst));
                // Answered, unless a park was coming for it that failed: serve it again.
                if room_for == tag && verdict != ROOM_COMING {
                    continue;
                }
                let kernel = self.counts(&mut kernel);
                let ask = Ask {
                    asker,
                    slot: s,
                    tag,
                };
                if self.serve(&all, &ask, kernel, &mut free, now_ms) {
                    break; // a park is coming for this asker, or its turn is not yet
                }
            }
        }
    }

    /// Serves one request: answers "none", or starts a park (true), or leaves it for a
    /// later look (true: the asker's parks are spaced).
    fn serve(
        &mut self,
        all: &[Arc<CgroupLedger>],
        ask: &Ask<'_>,
        kernel: &KernelCounts,
        free: &mut HashMap<[u8; 16], Option<u64>>,
        now_ms: u64,
    ) -> bool {
        let asker = ask.asker;
        let l = asker.ledger();
        let sp = l.slot_park(ask.slot);
        let asked = sp.need_bytes.load(SeqCst);
        let dev = sp.need_dev.load(SeqCst) as usize;
        let state = self.askers.entry(asker.cgroup.clone()).or_default();
        let none = |state: &mut Asker, why: &str, bytes: u64, free: Option<u64>| {
            if let Some(unsaid) = state.say_none(now_ms) {
                tracing::info!(
                    event = "room_none",
                    cgroup = %asker.cgroup,
                    bytes,
                    free,
                    unsaid,
                    "{why}"
                );
            }
            answer(asker, ask.tag, ROOM_NONE);
            false
        };
        // The GPU the request names (a record of its own ledger, bound by the container).
        let uuid = (dev < MAX_DEVICES).then(|| l.device_uuid(dev));
        let Some((uuid, gpu)) = uuid.and_then(|u| Some((u, self.gpus.memory_of(&u)?))) else {
            return none(
                state,
                "asked for room on a GPU this node does not have",
                asked,
                None,
            );
        };
        // At most what it could use: its limit's headroom there (the limit from the page
        // only the agent writes; what it holds as the kernel counts it), and the GPU.
        let limit = l.limit(dev);
        let held = kernel.of(asker.cgroup_id, &uuid);
        let bytes = could_use(asked, limit, held, gpu);
        if bytes < asked && !state.said_clamped {
            state.said_clamped = true;
            tracing::warn!(
                event = "room_clamped",
                cgroup = %asker.cgroup,
                asked,
                bytes,
                limit = (limit != NO_LIMIT).then_some(limit),
                held,
                gpu,
                "asked for more room than it could use: request clamped (said once)"
            );
        }
        if bytes == 0 {
            return none(
                state,
                "asked for room it cannot use: nothing parked",
                asked,
                None,
            );
        }
        // A request is the container's word: nobody is parked for it while the GPU has the
        // room it could use (a container cannot make its idle neighbours park by asking for
        // room it does not need).
        let free = *free
            .entry(uuid)
            .or_insert_with(|| self.gpus.free_memory(&uuid));
        if free.is_some_and(|f| f >= bytes) {
            return none(
                state,
                "asked for room the GPU has: nothing parked",
                bytes,
                free,
            );
        }
        if now_ms < state.next_park_ms {
            return true; // served at its turn, within the shim's wait for an answer
        }
        let busy: HashSet<&str> = self
            .pending
            .iter()
            .map(|p| p.target.cgroup.as_str())
            .collect();
        let others: Vec<&Arc<CgroupLedger>> = all
            .iter()
            .filter(|c| {
                c.cgroup != asker.cgroup
                    && !busy.contains(c.cgroup.as_str())
                    && !self.backoffs.skips(&c.cgroup, now_ms)
            })
            .collect();
        let cands: Vec<Candidate> = others
            .iter()
            .filter_map(|c| candidate(c, &uuid, kernel, self.gpus))
            .collect();
        // What the asker has parked comes back once room is made: it does not count
        // against the host memory the one parked for it may take. Parks under way do.
        let asker_parked = l.parked_total(|u| self.gpus.memory_of(u));
        let coming = self
            .pending
            .iter()
            .map(|p| p.total)
            .fold(0, u64::saturating_add);
        let host_left = self.host_budget.saturating_sub(
            parked_now(all, self.gpus)
                .saturating_sub(asker_parked)
                .saturating_add(coming),
        );
        let chosen = pick(&cands, now_ms, host_left).and_then(|i| {
            others
                .iter()
                .find(|c| c.cgroup == cands[i].cgroup)
                .map(|c| (Arc::clone(c), cands[i].clone()))
        });
        let Some((target, cand)) = chosen else {
            return none(
                state,
                "asked for room: no idle parkable container to park",
                bytes,
                free,
            );
        };
        state.next_park_ms = now_ms + PARK_EVERY_MS;
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
        answer(asker, ask.tag, ROOM_COMING);
        let seen = kernel.of(target.cgroup_id, &uuid);
        self.pending.push(Pending {
            target,
            epoch,
            asker: Arc::clone(asker),
            tag: ask.tag,
            since_ms: now_ms,
            movable: cand.movable,
            total: cand.total,
            uuid,
            seen,
        });
        true
    }

    /// Follows a park under way: None once it is over. The asker of a park that failed is
    /// left with "coming" for its request, which the next look serves again. A park said
    /// done that the kernel saw free nothing on the GPU failed.
    fn follow(
        &mut self,
        p: Pending,
        kernel: &mut Option<KernelCounts>,
        now_ms: u64,
    ) -> Option<Pending> {
        let ms = now_ms.saturating_sub(p.since_ms);
        let why = match follow(&p, now_ms) {
            Outcome::Waiting => return Some(p),
            Outcome::Parked(_) if self.counts(kernel).of(p.target.cgroup_id, &p.uuid) >= p.seen => {
                "said it parked, but the kernel saw nothing freed".to_string()
            }
            Outcome::Parked(bytes) => {
                tracing::info!(
                    event = "parked",
                    cgroup = %p.target.cgroup,
                    bytes,
                    for_cgroup = %p.asker.cgroup,
                    ms,
                    "parked"
                );
                self.backoffs.parked(&p.target.cgroup);
                answer(&p.asker, p.tag, ROOM_DONE);
                return None;
            }
            Outcome::Refused(results) => format!("refused: {results:?}"),
            Outcome::NotStarted => "did not start its park in time".to_string(),
            Outcome::TimedOut => "did not finish its park in time".to_string(),
        };
        let pause_ms = self.backoffs.failed(&p.target.cgroup, now_ms);
        tracing::warn!(
            event = "park_failed",
            cgroup = %p.target.cgroup,
            for_cgroup = %p.asker.cgroup,
            ms,
            skipped_ms = pause_ms,
            "could not be parked: {why}; skipped for a while, another is asked"
        );
        None
    }
}

/// The broker's loop (its own thread): `host_budget` bytes of host memory may hold parked
/// memory, all containers together; what parking did goes to `figures`; `tree` reads the
/// kernel's subtree totals.
pub fn run(
    ledgers: &Ledgers,
    figures: &ParkFigures,
    gpus: &Gpus,
    host_budget: u64,
    tree: KernelTree<'_>,
) {
    let mut b = Broker {
        figures,
        gpus,
        tree,
        seen: HashMap::new(),
        host_budget,
        pending: Vec::new(),
        backoffs: Backoffs::default(),
        askers: HashMap::new(),
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

    #[test]
    fn default_host_budget_is_half_the_node() {
        let b = default_host_budget();
        assert!(b > 0, "MemTotal read");
    }
}
