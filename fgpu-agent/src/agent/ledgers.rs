//! The per-cgroup ledgers the agent hands to shims (docs/design.md, section 5).
//!
//! Each ledger is two memfds mapped back to back into the agent: the `Limits` page, which
//! the agent writes and seals with `F_SEAL_FUTURE_WRITE` before handing it out (so shims can
//! map it read-only and nothing else), and the `Usage` page plus process slots, shared
//! read-write. See `fgpu_common::proto::shim` for the hand-over.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use fgpu_common::ledger::compute::TURN_CLOSED;
use fgpu_common::ledger::{Ledger, MAX_DEVICES, NO_LIMIT, uuid_key};

use crate::api::{ComputePriority, Limit};

use super::adopt;
use super::compute::sched::Team;
use super::compute::team::TeamSpec;
use super::gpus::uuid_bytes;

/// A share or ceiling that gates launches (1-99; 0 and 100 do not).
fn gated_pct(p: u32) -> bool {
    (1..100).contains(&p)
}

/// One cgroup's ledger, mapped into the agent.
pub struct CgroupLedger {
    pub cgroup: String,
    /// The cgroup's id (inode of its directory), to match kernel totals.
    pub cgroup_id: u64,
    limits_fd: OwnedFd,
    usage_fd: OwnedFd,
    map: fgpu_ledger::Mapping,
    /// Its effective compute priority (the controller reads it; shims never need it, so it
    /// lives here, not in the shared page).
    priority: std::sync::atomic::AtomicU8,
    /// Its compute team, if its share is a part of an ancestor's (agent-side, like the
    /// priority).
    team: Mutex<Option<TeamSpec>>,
}

impl CgroupLedger {
    /// A fresh ledger (no usage), or one around `usage` — the usage memfd a shim kept while
    /// the agent was away — so that a restart loses no charge. An offered descriptor is
    /// adopted only if it is a sealed usage memfd of the right size (fgpu_ledger::check_usage):
    /// nothing a container hands over can be resized under the agent's mapping.
    fn new(cgroup: &str, cgroup_id: u64, usage: Option<OwnedFd>) -> Result<Self> {
        let limits_fd = fgpu_ledger::create_limits()?;
        let usage_fd = match usage {
            Some(fd) => {
                fgpu_ledger::check_usage(fd.as_raw_fd())
                    .context("refusing the usage memfd handed over")?;
                fd
            }
            None => fgpu_ledger::create_usage(cgroup_id)?,
        };
        let map = fgpu_ledger::map_agent(limits_fd.as_raw_fd(), usage_fd.as_raw_fd())?;
        let ledger = Self {
            cgroup: cgroup.to_string(),
            cgroup_id,
            limits_fd,
            usage_fd,
            map,
            priority: std::sync::atomic::AtomicU8::new(ComputePriority::Normal as u8),
            team: Mutex::new(None),
        };
        ledger.ledger().init();
        fgpu_ledger::seal_limits(ledger.limits_fd.as_raw_fd())?;
        Ok(ledger)
    }

    pub fn ledger(&self) -> &Ledger {
        self.map.ledger()
    }

    /// Sets its compute team (`compute::team`; none: its share stands alone).
    pub fn set_team(&self, team: Option<TeamSpec>) {
        *self.team.lock().expect("team lock") = team;
    }

    /// Its team on the device of key `key`.
    pub fn team_on(&self, key: u64) -> Option<Team> {
        self.team.lock().expect("team lock").as_ref()?.on(key)
    }

    /// Its effective compute priority.
    pub fn priority(&self) -> ComputePriority {
        match self.priority.load(std::sync::atomic::Ordering::Relaxed) {
            p if p == ComputePriority::High as u8 => ComputePriority::High,
            p if p == ComputePriority::Low as u8 => ComputePriority::Low,
            _ => ComputePriority::Normal,
        }
    }

    /// The descriptors to hand to a shim: [limits, usage].
    pub fn fds(&self) -> [RawFd; 2] {
        [self.limits_fd.as_raw_fd(), self.usage_fd.as_raw_fd()]
    }

    /// Writes the effective limit into the limits page: compute settings on every device,
    /// the memory limit of each device record's GPU (its per-GPU value, else the plain one);
    /// a record no shim has bound to a GPU yet gets the lowest of them, so that the first
    /// allocations after binding are covered too ([`super::budget::refresh`] follows with
    /// the exact budgets).
    pub fn apply(&self, limit: &Limit) {
        let l = &self.ledger().limits;
        let by_key: Vec<(u64, u64)> = limit
            .memory_gpus
            .iter()
            .filter_map(|(u, b)| Some((uuid_key(&uuid_bytes(u)?), *b)))
            .collect();
        let lowest = limit
            .memory_gpus
            .values()
            .copied()
            .chain(limit.memory_bytes)
            .min();
        for (d, rec) in l.devices.iter().zip(&self.ledger().usage.devices) {
            let key = rec.key.load(std::sync::atomic::Ordering::SeqCst);
            let memory = if key == 0 {
                lowest
            } else {
                by_key
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, b)| *b)
                    .or(limit.memory_bytes)
            };
            d.memory_limit.store(
                memory.unwrap_or(NO_LIMIT),
                std::sync::atomic::Ordering::SeqCst,
            );
        }
        self.apply_compute(limit);
        l.park.park_after_ms.store(
            limit.park_after_ms.unwrap_or(0),
            std::sync::atomic::Ordering::SeqCst,
        );
        // A gated device starts closed: the controller grants turns (docs/compute.md).
        for (d, t) in l.devices.iter().zip(&l.turns) {
            let (share, cap) = (
                d.compute_share.load(std::sync::atomic::Ordering::SeqCst),
                d.compute_cap.load(std::sync::atomic::Ordering::SeqCst),
            );
            if gated_pct(share) || gated_pct(cap) {
                t.set(TURN_CLOSED);
            }
        }
        l.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Writes each device record's compute share and ceiling: its GPU's per-GPU value, else
    /// the plain one (a record no shim has bound to a GPU yet: the plain one; the budget
    /// refresh writes it again once bound). A record that becomes gated here starts with its
    /// turn closed. Returns whether anything changed (the caller bumps the generation).
    pub fn apply_compute(&self, limit: &Limit) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let keyed = |m: &std::collections::BTreeMap<String, u8>| -> Vec<(u64, u8)> {
            m.iter()
                .filter_map(|(u, p)| Some((uuid_key(&uuid_bytes(u)?), *p)))
                .collect()
        };
        let (shares, caps) = (keyed(&limit.compute_gpus), keyed(&limit.compute_cap_gpus));
        let pick = |per: &[(u64, u8)], key: u64, plain: Option<u8>| {
            let own = per
                .iter()
                .find(|(k, _)| key != 0 && *k == key)
                .map(|(_, p)| *p);
            u32::from(own.or(plain).unwrap_or(0))
        };
        let priority = limit.compute_priority.unwrap_or_default() as u8;
        let mut changed = self.priority.swap(priority, SeqCst) != priority;
        let l = &self.ledger().limits;
        for ((d, rec), t) in l
            .devices
            .iter()
            .zip(&self.ledger().usage.devices)
            .zip(&l.turns)
        {
            let key = rec.key.load(SeqCst);
            let share = pick(&shares, key, limit.compute_pct);
            let cap = pick(&caps, key, limit.compute_cap_pct);
            let (was_share, was_cap) = (
                d.compute_share.swap(share, SeqCst),
                d.compute_cap.swap(cap, SeqCst),
            );
            if (was_share, was_cap) != (share, cap) {
                changed = true;
                if !(gated_pct(was_share) || gated_pct(was_cap))
                    && (gated_pct(share) || gated_pct(cap))
                {
                    t.set(TURN_CLOSED);
                }
            }
        }
        changed
    }

    /// [`Self::apply_compute`] for records bound since the last change; bumps the
    /// generation (shims re-read their compute settings) if anything changed.
    pub fn refresh_compute(&self, limit: &Limit) {
        if self.apply_compute(limit) {
            self.ledger()
                .limits
                .generation
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Writes per-device memory limits (the hierarchical budgets of [`super::budget`],
    /// indexed like the ledger's device records). Shims read the limit on every allocation,
    /// so the generation (which makes them re-read compute settings) is not bumped.
    pub fn set_memory_limits(&self, limits: &[u64; MAX_DEVICES]) {
        for (d, &v) in self.ledger().limits.devices.iter().zip(limits) {
            if d.memory_limit.load(std::sync::atomic::Ordering::SeqCst) != v {
                d.memory_limit.store(v, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// Allocations the shims refused, all devices.
    pub fn denied(&self) -> u64 {
        self.ledger()
            .usage
            .devices
            .iter()
            .map(|d| d.alloc_denied.load(std::sync::atomic::Ordering::SeqCst))
            .sum()
    }

    /// Publishes the kernel's view of a device's usage for the shims to weigh.
    pub fn set_kernel_used(&self, uuid: &[u8; 16], bytes: u64) {
        let key = uuid_key(uuid);
        if let Some(d) = self
            .ledger()
            .usage
            .devices
            .iter()
            .find(|d| d.key.load(std::sync::atomic::Ordering::SeqCst) == key)
        {
            d.kernel_used
                .store(bytes, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Takes back the bytes (and compute state) of slots whose process died (no OFD lock on
    /// the slot's byte), so a dead process's share returns even when no shim of the cgroup
    /// runs any more.
    pub fn reclaim_dead(&self) -> u64 {
        fgpu_ledger::reclaim_dead(self.ledger(), self.usage_fd.as_raw_fd(), None, |_, _| {})
    }
}

/// All ledgers, by cgroup path.
#[derive(Default)]
pub struct Ledgers {
    by_cgroup: Mutex<HashMap<String, Arc<CgroupLedger>>>,
}

impl Ledgers {
    /// The ledger of `cgroup`, created (or adopted from `usage`) on first use, with `limit`
    /// applied when it is new.
    pub fn get_or_create(
        &self,
        cgroup: &str,
        cgroup_dir: &Path,
        mut usage: Option<OwnedFd>,
        limit: &Limit,
    ) -> Result<Arc<CgroupLedger>> {
        let mut map = self.by_cgroup.lock().expect("ledgers lock");
        if let Some(l) = map.get(cgroup) {
            return Ok(Arc::clone(l));
        }
        let cgroup_id = std::fs::metadata(cgroup_dir)
            .with_context(|| format!("cgroup {cgroup} is gone"))?
            .ino();
        // A reconnecting shim's page: its seals are checked below (a forged one refuses the
        // Hello), its tag here (another cgroup's page is not adopted: a fresh one is made).
        if let Some(fd) = usage.take() {
            usage = adopt::offered(fd, cgroup, cgroup_id)?;
        }
        // After an agent restart the cgroup's running shims still share their old usage
        // memfd; adopt it from one of them so that a process starting before they reconnect
        // joins the same count instead of a fresh one.
        let source = match (
            &usage,
            usage
                .is_none()
                .then(|| adopt::usage_memfd_in(cgroup, cgroup_dir, cgroup_id))
                .flatten(),
        ) {
            (Some(_), _) => "adopted from a reconnecting shim",
            (None, Some(found)) => {
                usage = Some(found);
                "adopted from a running process of the cgroup"
            }
            (None, None) => "created",
        };
        let ledger = Arc::new(CgroupLedger::new(cgroup, cgroup_id, usage)?);
        ledger.apply(limit);
        // How many others are parkable, from its first moment (the parking broker keeps it
        // current from then on): a shim asks for room only when someone could be parked.
        let peers = map
            .values()
            .filter(|l| l.ledger().park_after_ms().is_some())
            .count() as u64;
        ledger
            .ledger()
            .park()
            .parkable_peers
            .store(peers, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(cgroup, "ledger {source}");
        map.insert(cgroup.to_string(), Arc::clone(&ledger));
        Ok(ledger)
    }

    pub fn get(&self, cgroup: &str) -> Option<Arc<CgroupLedger>> {
        self.by_cgroup
            .lock()
            .expect("ledgers lock")
            .get(cgroup)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<CgroupLedger>> {
        self.by_cgroup
            .lock()
            .expect("ledgers lock")
            .values()
            .cloned()
            .collect()
    }

    /// Forgets ledgers whose cgroup no longer exists (shims still holding one keep it alive).
    pub fn retain(&self, keep: impl Fn(&CgroupLedger) -> bool) {
        self.by_cgroup
            .lock()
            .expect("ledgers lock")
            .retain(|_, l| keep(l));
    }
}

const _: () = assert!(MAX_DEVICES == 16);

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_common::ledger::PAGE;

    #[test]
    fn limits_page_is_sealed_against_new_writable_mappings() {
        let l = CgroupLedger::new("/t", 1, None).unwrap();
        l.apply(&Limit {
            memory_bytes: Some(1 << 30),
            ..Limit::default()
        });
        assert_eq!(l.ledger().limit(0), 1 << 30);
        assert!(l.ledger().validate().is_ok());
        let [limits, _] = l.fds();
        // SAFETY: probing mmap on our own descriptor; unmapped if it (wrongly) succeeds.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                limits,
                0,
            )
        };
        assert_eq!(
            p,
            libc::MAP_FAILED,
            "a writable mapping of the limits page must be refused"
        );
        // SAFETY: as above, read-only.
        let r = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                limits,
                0,
            )
        };
        assert_ne!(r, libc::MAP_FAILED);
        // SAFETY: the page just mapped.
        let seen = unsafe { &*(r as *const fgpu_common::ledger::Limits) };
        assert_eq!(
            seen.devices[0]
                .memory_limit
                .load(std::sync::atomic::Ordering::SeqCst),
            1 << 30
        );
        // The agent still updates it through its own mapping; the reader sees the change.
        l.apply(&Limit {
            memory_bytes: Some(2 << 30),
            ..Limit::default()
        });
        assert_eq!(
            seen.devices[0]
                .memory_limit
                .load(std::sync::atomic::Ordering::SeqCst),
            2 << 30
        );
        // SAFETY: unmapping our probe.
        unsafe { libc::munmap(r, PAGE) };
    }
}
