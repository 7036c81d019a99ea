//! Whom to park: what the broker knows of each parkable container ([`Candidate`], from its
//! ledger, checked against the kernel's count) and the choice itself ([`pick`], a pure
//! function).
//!
//! A container's slots are its own word. The kernel's count of the container's memory on a
//! GPU (the probes on libcuda, [`KernelCounts`]) is not: a container is credited, on each
//! GPU, with no more than the kernel sees it hold there ([`credited`]), so one whose slots
//! claim memory the kernel does not see is not a candidate (credited with nothing on the
//! GPU asked about), and a claim beyond the kernel's count moves it no earlier in the
//! choice nor makes it look bigger for host memory. (Memory the probes do not see, CUDA
//! arrays, pins its holder anyway: it is asked, answers "pinned", and `fgpu status` says
//! why.)

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;

use fgpu_common::event::CgroupKey;
use fgpu_common::ledger::park::RESIDENT;
use fgpu_common::ledger::{Ledger, MAX_DEVICES, uuid_key};

use super::super::gpus::{Gpus, uuid_bytes};
use super::super::ledgers::CgroupLedger;

/// How far a container's claim of the memory it holds on a GPU may exceed the kernel's count
/// before the claim is said to contradict it in the log: 64 MiB.
pub const KERNEL_TOLERANCE: u64 = 64 << 20;

/// The kernel's count of each cgroup's device memory (its subtree's), per GPU.
#[derive(Debug, Default)]
pub struct KernelCounts(HashMap<(u64, [u8; 16]), u64>);

impl KernelCounts {
    /// From the kernel's subtree totals by (cgroup id, GPU index) and the node's GPUs.
    pub fn new(tree: &[(CgroupKey, u64)], gpus: &Gpus) -> Self {
        let uuids: HashMap<u32, [u8; 16]> = gpus
            .devices
            .iter()
            .filter_map(|g| Some((g.index, uuid_bytes(&g.uuid)?)))
            .collect();
        let mut by = HashMap::new();
        for (k, bytes) in tree {
            if let Some(u) = uuids.get(&k.device) {
                let e: &mut u64 = by.entry((k.cgroup_id, *u)).or_default();
                *e = e.saturating_add(*bytes);
            }
        }
        KernelCounts(by)
    }

    /// Bytes the kernel sees `cgroup_id`'s subtree hold on the GPU `uuid`.
    pub fn of(&self, cgroup_id: u64, uuid: &[u8; 16]) -> u64 {
        self.0.get(&(cgroup_id, *uuid)).copied().unwrap_or(0)
    }
}

/// What the broker knows of one parkable container, for [`pick`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub cgroup: String,
    /// Bytes its processes hold on the GPU asked about (context overhead excluded; no more
    /// than the kernel sees).
    pub movable: u64,
    /// Bytes it would put in host memory (all GPUs, each no more than the kernel sees).
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
pub fn live(l: &Ledger) -> impl Iterator<Item = usize> + '_ {
    (0..l.slots_in_range()).filter(|&s| l.slot_in_use(s))
}

/// The ledger's device record bound to `uuid`.
pub fn record_of(l: &Ledger, uuid: &[u8; 16]) -> Option<usize> {
    let key = uuid_key(uuid);
    (0..MAX_DEVICES).find(|&i| l.usage.devices[i].key.load(SeqCst) == key)
}

/// Whether `claim` bytes on a GPU contradict the kernel's `seen` there.
pub fn contradicts(claim: u64, seen: u64) -> bool {
    claim > seen.saturating_add(KERNEL_TOLERANCE)
}

/// What a container claiming `claim` bytes on a GPU is credited with: no more than the
/// kernel's `seen` there.
pub fn credited(claim: u64, seen: u64) -> u64 {
    claim.min(seen)
}

/// [`Candidate`] for `c` on the GPU `uuid`; None if it is not parkable. `kernel`: the
/// kernel's counts; `gpus`: the node's GPUs, each of which its claims are checked on.
pub fn candidate(
    c: &CgroupLedger,
    uuid: &[u8; 16],
    kernel: &KernelCounts,
    gpus: &Gpus,
) -> Option<Candidate> {
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
    let mut held = [0u64; MAX_DEVICES];
    for s in live(l) {
        let slot = &l.slots[s];
        let sp = l.slot_park(s);
        for (i, h) in held.iter_mut().enumerate() {
            let b = slot.used[i]
                .load(SeqCst)
                .saturating_sub(slot.overhead[i].load(SeqCst));
            *h = h.saturating_add(b);
        }
        cand.last_active_ms = cand.last_active_ms.max(sp.last_active_ms.load(SeqCst));
        cand.unavailable |= sp.phase.load(SeqCst) != RESIDENT || sp.pinned.load(SeqCst) != 0;
    }
    // Every real GPU the container has a record of: credited with what the kernel sees.
    for g in &gpus.devices {
        let Some(u) = uuid_bytes(&g.uuid) else {
            continue;
        };
        let Some(r) = record_of(l, &u) else {
            continue;
        };
        let seen = kernel.of(c.cgroup_id, &u);
        if contradicts(held[r], seen) {
            tracing::debug!(
                cgroup = %c.cgroup,
                claimed = held[r],
                seen,
                "its slots claim memory the kernel does not see: credited with what it sees"
            );
        }
        let mine = credited(held[r], seen);
        cand.total = cand.total.saturating_add(mine);
        if r == rec {
            cand.movable = mine;
        }
    }
    Some(cand)
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
    fn a_claim_the_kernel_does_not_see_is_a_contradiction_past_the_tolerance() {
        const MIB: u64 = 1 << 20;
        assert!(!contradicts(512 * MIB, 512 * MIB));
        assert!(!contradicts(512 * MIB + KERNEL_TOLERANCE, 512 * MIB));
        assert!(contradicts(512 * MIB + KERNEL_TOLERANCE + 1, 512 * MIB));
        assert!(contradicts(1 << 30, 0));
        assert!(!contradicts(0, 0));
        assert!(contradicts(u64::MAX, u64::MAX - 1 - KERNEL_TOLERANCE));
        assert!(!contradicts(u64::MAX, u64::MAX));
    }

    #[test]
    fn a_container_is_credited_with_no_more_than_the_kernel_sees() {
        // A forged page: nothing behind it, nothing credited (and so not a candidate).
        assert_eq!(credited(u64::MAX, 0), 0);
        assert_eq!(
            pick(&[c("forged", credited(1 << 40, 0), 0, 0)], 10_000, u64::MAX),
            None
        );
        // An honest one (or one whose arrays the probes do not see): what the kernel sees.
        assert_eq!(credited(512 << 20, 512 << 20), 512 << 20);
        assert_eq!(credited(512 << 20, 256 << 20), 256 << 20);
        assert_eq!(credited(256 << 20, 300 << 20), 256 << 20);
    }
}
