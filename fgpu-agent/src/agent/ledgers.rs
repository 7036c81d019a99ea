//! The per-cgroup ledgers the agent hands to shims (docs/design.md, section 5).
//!
//! Each ledger is two memfds mapped back to back into the agent: the `Limits` page, which
//! the agent writes and seals with `F_SEAL_FUTURE_WRITE` before handing it out (so shims can
//! map it read-only and nothing else), and the `Usage` page plus process slots, shared
//! read-write. See `fgpu_common::proto::shim` for the hand-over.
//!
//! A tenant ([`super::tenant`]) that may make sub-cgroups could make a ledger per cgroup, so
//! each tenant holds at most `--max-ledgers-per-tenant` at once: past it a Hello from yet
//! another of its cgroups is refused ([`Ledgers::get_or_create`]), which costs nobody else
//! anything. Ledgers nobody uses any more (their cgroup gone, or empty with no slot held)
//! are dropped ([`Ledgers::drop_unused`]), which gives the tenant room again.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
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
    /// The tenant whose ledger bound it counts against ([`super::tenant::tenant_of`] of
    /// its cgroup when it was made).
    pub tenant: String,
    /// The effective limit last applied ([`Self::apply`]): the budget pass reads it here
    /// instead of walking the cgroup's ancestors again on every pass.
    effective: Mutex<Limit>,
    /// Whether the last budget pass found nothing to plan for it (and wrote its figures of
    /// a ledger at rest): the passes leave it out while it stays so.
    quiet: std::sync::atomic::AtomicBool,
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
    fn new(cgroup: &str, cgroup_id: u64, tenant: &str, usage: Option<OwnedFd>) -> Result<Self> {
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
            tenant: tenant.to_string(),
            effective: Mutex::new(Limit::default()),
            quiet: std::sync::atomic::AtomicBool::new(false),
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
        limit.clone_into(&mut self.effective.lock().expect("effective limit lock"));
        self.quiet.store(false, std::sync::atomic::Ordering::SeqCst);
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

    /// The effective limit last applied.
    pub fn effective(&self) -> Limit {
        self.effective.lock().expect("effective limit lock").clone()
    }

    /// [`Self::refresh_compute`] with the effective limit, where it sets compute per GPU.
    pub fn refresh_compute_per_gpu(&self) {
        let e = self.effective.lock().expect("effective limit lock");
        if !e.compute_gpus.is_empty() || !e.compute_cap_gpus.is_empty() {
            self.refresh_compute(&e);
        }
    }

    /// Whether the budget pass has nothing to plan for it as far as it knows itself: no
    /// memory limit at or above it and nothing reserved by its shims (the pass checks the
    /// kernel's figure).
    pub fn nothing_to_plan(&self) -> bool {
        !self
            .effective
            .lock()
            .expect("effective limit lock")
            .has_memory()
            && (0..MAX_DEVICES).all(|d| self.ledger().used(d) == 0)
    }

    /// Records whether the last pass found nothing to plan for it; returns what it was.
    pub fn set_quiet(&self, quiet: bool) -> bool {
        self.quiet.swap(quiet, std::sync::atomic::Ordering::SeqCst)
    }

    /// Takes back the bytes (and compute state) of dead processes' slots, at most `max`
    /// slots from slot `from` on ([`fgpu_ledger::reclaim_dead_in`]): the bytes given back
    /// and the slot to go on from (`None`: done).
    pub fn reclaim_dead_in(&self, from: usize, max: usize) -> (u64, Option<usize>) {
        fgpu_ledger::reclaim_dead_in(
            self.ledger(),
            self.usage_fd.as_raw_fd(),
            None,
            from,
            max,
            |_, _| {},
        )
    }

    /// Whether nothing uses it any more: its cgroup is gone, or holds no process (in it or
    /// below) while no process holds a slot of it. One read of `cgroup.events` and one
    /// lock query, whatever the number of slots.
    pub fn unused(&self, cgroup_dir: &Path) -> bool {
        let Ok(events) = std::fs::read_to_string(cgroup_dir.join("cgroup.events")) else {
            return !cgroup_dir.is_dir();
        };
        let populated = events.lines().any(|l| l.trim() == "populated 1");
        !populated && !fgpu_ledger::any_slot_locked(self.usage_fd.as_raw_fd())
    }
}

/// The refusal of a Hello that would make a ledger past its tenant's bound.
pub fn too_many(tenant: &str, max: usize) -> String {
    format!(
        "too many ledgers for {tenant}: at most {max} at once per tenant (one per cgroup whose \
         processes say Hello; see fgpu agent --max-ledgers-per-tenant)"
    )
}

/// All ledgers, by cgroup path, and how many each tenant holds.
pub struct Ledgers {
    inner: Mutex<Inner>,
    /// `--max-ledgers-per-tenant`.
    max_per_tenant: usize,
}

#[derive(Default)]
struct Inner {
    by_cgroup: HashMap<String, Arc<CgroupLedger>>,
    per_tenant: HashMap<String, usize>,
}

impl Inner {
    fn full(&self, tenant: &str, max: usize) -> bool {
        self.per_tenant.get(tenant).copied().unwrap_or(0) >= max
    }

    fn remove(&mut self, cgroup: &str) {
        if let Some(l) = self.by_cgroup.remove(cgroup)
            && let Some(n) = self.per_tenant.get_mut(&l.tenant)
        {
            *n -= 1;
            if *n == 0 {
                self.per_tenant.remove(&l.tenant);
            }
        }
    }
}

/// Ledgers a tenant holds at once, unless `--max-ledgers-per-tenant` says otherwise.
pub const DEFAULT_MAX_PER_TENANT: usize = 64;

impl Default for Ledgers {
    fn default() -> Self {
        Ledgers::new(DEFAULT_MAX_PER_TENANT)
    }
}

impl Ledgers {
    pub fn new(max_per_tenant: usize) -> Self {
        Ledgers {
            inner: Mutex::new(Inner::default()),
            max_per_tenant,
        }
    }

    /// The ledger of `cgroup`, created (or adopted from `usage`) on first use, with `limit`
    /// applied when it is new; refused if `tenant` holds its bound of ledgers already.
    /// The map is not locked while a new ledger is made (adopting a page may search the
    /// cgroup's processes): a status report or the budget pass never waits on a Hello.
    pub fn get_or_create(
        &self,
        cgroup: &str,
        tenant: &str,
        cgroup_dir: &Path,
        mut usage: Option<OwnedFd>,
        limit: &Limit,
    ) -> Result<Arc<CgroupLedger>> {
        {
            let inner = self.inner.lock().expect("ledgers lock");
            if let Some(l) = inner.by_cgroup.get(cgroup) {
                return Ok(Arc::clone(l));
            }
            if inner.full(tenant, self.max_per_tenant) {
                bail!(too_many(tenant, self.max_per_tenant));
            }
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
        let ledger = Arc::new(CgroupLedger::new(cgroup, cgroup_id, tenant, usage)?);
        ledger.apply(limit);
        let mut inner = self.inner.lock().expect("ledgers lock");
        // Another Hello of the cgroup may have made one meanwhile: that one is the ledger.
        if let Some(l) = inner.by_cgroup.get(cgroup) {
            return Ok(Arc::clone(l));
        }
        if inner.full(tenant, self.max_per_tenant) {
            bail!(too_many(tenant, self.max_per_tenant));
        }
        // How many others are parkable, from its first moment (the parking broker keeps it
        // current from then on): a shim asks for room only when someone could be parked.
        let peers = inner
            .by_cgroup
            .values()
            .filter(|l| l.ledger().park_after_ms().is_some())
            .count() as u64;
        ledger
            .ledger()
            .park()
            .parkable_peers
            .store(peers, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(cgroup, tenant, "ledger {source}");
        inner
            .by_cgroup
            .insert(cgroup.to_string(), Arc::clone(&ledger));
        *inner.per_tenant.entry(tenant.to_string()).or_default() += 1;
        Ok(ledger)
    }

    pub fn get(&self, cgroup: &str) -> Option<Arc<CgroupLedger>> {
        self.inner
            .lock()
            .expect("ledgers lock")
            .by_cgroup
            .get(cgroup)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<CgroupLedger>> {
        self.inner
            .lock()
            .expect("ledgers lock")
            .by_cgroup
            .values()
            .cloned()
            .collect()
    }

    /// Drops the ledgers nobody uses any more ([`CgroupLedger::unused`]; shims still
    /// holding one keep their mapping); returns how many. The checks run with the map
    /// unlocked.
    pub fn drop_unused(&self, dir_of: impl Fn(&str) -> std::path::PathBuf) -> usize {
        let unused: Vec<Arc<CgroupLedger>> = self
            .all()
            .into_iter()
            .filter(|l| l.unused(&dir_of(&l.cgroup)))
            .collect();
        let mut inner = self.inner.lock().expect("ledgers lock");
        let mut dropped = 0;
        for l in &unused {
            // Only the ledger checked: one made again for the cgroup meanwhile stays.
            if inner
                .by_cgroup
                .get(&l.cgroup)
                .is_some_and(|now| Arc::ptr_eq(now, l))
            {
                inner.remove(&l.cgroup);
                dropped += 1;
            }
        }
        dropped
    }
}

const _: () = assert!(MAX_DEVICES == 16);

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_common::ledger::PAGE;

    #[test]
    fn a_tenant_at_its_bound_is_refused_and_gets_room_back_when_a_ledger_goes() {
        let base = std::env::temp_dir().join(format!("fgpu-ledgers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = |c: &str| base.join(c.trim_start_matches('/'));
        for c in ["/a/1", "/a/2", "/a/3", "/b/1"] {
            std::fs::create_dir_all(dir(c)).unwrap();
        }
        let ledgers = Ledgers::new(2);
        let make = |c: &str, tenant: &str| {
            ledgers.get_or_create(c, tenant, &dir(c), None, &Limit::default())
        };
        make("/a/1", "/a").unwrap();
        make("/a/2", "/a").unwrap();
        make("/a/1", "/a").expect("an existing ledger is always handed out");
        let Err(err) = make("/a/3", "/a") else {
            panic!("a fourth ledger past the bound of 2 was made")
        };
        let err = err.to_string();
        assert_eq!(err, too_many("/a", 2));
        assert!(err.starts_with("too many ledgers for /a: at most 2 at once per tenant"));
        make("/b/1", "/b").expect("another tenant is not refused");
        // A ledger whose cgroup is gone is dropped (the temporary directories have no
        // cgroup.events: only whether they exist counts here), and its tenant has room again.
        std::fs::remove_dir(dir("/a/1")).unwrap();
        assert_eq!(ledgers.drop_unused(|c| dir(c)), 1);
        make("/a/3", "/a").unwrap();
        assert_eq!(ledgers.all().len(), 3);
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn limits_page_is_sealed_against_new_writable_mappings() {
        let l = CgroupLedger::new("/t", 1, "/t", None).unwrap();
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
