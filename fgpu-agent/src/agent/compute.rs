//! The compute controller: turns the compute shares and caps of the cgroups on each GPU into
//! turns on the device (docs/compute.md, "Agent-driven mode").
//!
//! Only one gated container runs on a device at a time, so that the GPU time its shims
//! measure with events is its own (two contexts time-sliced by the driver would each measure
//! the other's slices too). Every [`TICK`]:
//! - each gated (cgroup, device) — a *tenant* — reports measured GPU time (`gpu_ns`) and
//!   how many of its threads wait for budget (`waiting`) through its ledger;
//! - its virtual time advances by measured time / weight (the share; the cap for a tenant
//!   with only a cap), and a cap is a token bucket (refilled at the cap, at most a
//!   [`WINDOW_NS`] share of it);
//! - the holder of the turn keeps it until its quantum ([`ROUND_NS`] × weight) is spent or
//!   it goes idle while others wait, or its cap runs out; then the waiting tenant with the
//!   smallest virtual time gets the next turn: its `launch_budget` is set to its quantum,
//!   `grant` is bumped and its waiting threads are woken (futex). Everybody else's budget is
//!   kept negative, so their launches wait.
//! - Work-conserving: only tenants that wait get turns; a holder alone keeps being granted.
//!   An idle tenant cannot bank time: its virtual time is kept up with the active ones'.
//!
//! Tenants without a share or cap are not gated and not scheduled (they run whenever they
//! launch; shares are then shares of what they leave).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fgpu_common::ledger::{DeviceCompute, MAX_DEVICES};

use super::ledgers::{CgroupLedger, Ledgers};

pub const TICK: Duration = Duration::from_micros(500);
/// The tick while no device is gated (an idle node costs 20 wake-ups a second).
pub const IDLE_TICK: Duration = Duration::from_millis(50);
/// A round of turns: a tenant's quantum is its weight's share of this.
pub const ROUND_NS: i64 = 100_000_000;
/// How long the next turn waits at most for the previous holder's queued work to drain.
const MAX_DRAIN_NS: u64 = 50_000_000;
/// The shortest quantum.
const MIN_QUANTUM_NS: i64 = 2_000_000;
/// A cap's bucket holds at most the cap's share of this window.
pub const WINDOW_NS: i64 = 100_000_000;
/// A holder that neither waits for budget nor reports GPU time for this long, with no work
/// queued, yields its turn to waiting tenants...
const IDLE_NS: i64 = 2_000_000;
/// ...and with work queued, after twice its estimated time and this much (a process that
/// died with work queued never reports it complete).
const STALL_NS: i64 = 5_000_000;
/// `fgpu status` shows the share achieved over this long.
pub const ACHIEVED_OVER: Duration = Duration::from_secs(5);
/// Budget of a tenant without the turn.
const CLOSED: i64 = -1;

/// A cgroup's compute figures for `fgpu status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComputeFigures {
    pub share_pct: Option<u32>,
    pub cap_pct: Option<u32>,
    /// Measured GPU time over the last [`ACHIEVED_OVER`], percent of wall time (summed over
    /// devices).
    pub used_pct: f64,
}

/// What the controller shares with the status report.
#[derive(Default)]
pub struct ComputeStatus {
    by_cgroup: Mutex<HashMap<String, ComputeFigures>>,
}

impl ComputeStatus {
    pub fn all(&self) -> HashMap<String, ComputeFigures> {
        self.by_cgroup.lock().expect("compute status lock").clone()
    }
}

struct Tenant {
    ledger: Arc<CgroupLedger>,
    idx: usize,
    device: u64,
    share: u32,
    cap: u32,
    last_gpu: u64,
    vtime: f64,
    tokens: i64,
    /// Host time without waiting threads or reported GPU time, ns.
    quiet: i64,
    seen: bool,
    /// (tick time, gpu_ns) samples for the achieved share.
    history: VecDeque<(u64, u64)>,
}

impl Tenant {
    fn compute(&self) -> &DeviceCompute {
        &self.ledger.ledger().usage.compute[self.idx]
    }

    fn budget(&self) -> &std::sync::atomic::AtomicI64 {
        &self.ledger.ledger().usage.devices[self.idx].launch_budget
    }

    fn weight(&self) -> f64 {
        f64::from(if gated(self.share) {
            self.share
        } else {
            self.cap
        })
    }

    fn capped(&self) -> bool {
        gated(self.cap)
    }

    fn eligible(&self) -> bool {
        !self.capped() || self.tokens > 0
    }

    fn waiting(&self) -> bool {
        self.compute().waiting.load(SeqCst) > 0
    }

    /// Not using the device (see [`IDLE_NS`], [`STALL_NS`]).
    fn idle(&self) -> bool {
        let c = self.compute();
        self.quiet >= IDLE_NS
            && (c.inflight.load(SeqCst) <= 0
                || self.quiet >= STALL_NS + 2 * c.queued_ns.load(SeqCst).max(0))
    }

    fn quantum(&self) -> i64 {
        let q = (ROUND_NS as f64 * self.weight() / 100.0) as i64;
        let q = q.max(MIN_QUANTUM_NS);
        if self.capped() {
            q.min(self.tokens.max(0))
        } else {
            q
        }
    }

    /// Measured GPU time over the history (at most [`ACHIEVED_OVER`]), percent of wall time.
    fn used_pct(&self) -> f64 {
        self.used_pct_over(ACHIEVED_OVER.as_nanos() as u64)
    }

    /// The same over (at most) the last `ns`.
    fn used_pct_over(&self, ns: u64) -> f64 {
        let Some(&(t1, g1)) = self.history.back() else {
            return 0.0;
        };
        match self.history.iter().find(|&&(t, _)| t1 - t <= ns) {
            Some(&(t0, g0)) if t1 > t0 => (g1 - g0) as f64 * 100.0 / (t1 - t0) as f64,
            _ => 0.0,
        }
    }
}

fn gated(pct: u32) -> bool {
    (1..100).contains(&pct)
}

fn now_ns() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wakes every thread sleeping on a tenant's grant word.
fn wake(c: &DeviceCompute) {
    // SAFETY: FUTEX_WAKE (shared) on a valid, aligned u32 of a MAP_SHARED mapping; it only
    // wakes sleepers.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            c.grant.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        )
    };
}

/// A tenant: (cgroup id, ledger device record).
type TenantId = (u64, usize);

/// The controller's state across ticks.
#[derive(Default)]
pub struct Controller {
    tenants: HashMap<TenantId, Tenant>,
    /// Per device key: the tenant holding the turn.
    holders: HashMap<u64, TenantId>,
    /// Per device key: a turn just ended; the next waits until that tenant's work has
    /// drained (its shims saw every batch complete) or this deadline passes.
    draining: HashMap<u64, (TenantId, u64)>,
    last_tick: u64,
    last_sample: u64,
    last_log: u64,
}

impl Controller {
    /// One tick over all ledgers.
    pub fn tick(&mut self, ledgers: &[Arc<CgroupLedger>], status: &ComputeStatus) {
        let now = now_ns();
        let dt = if self.last_tick == 0 {
            0
        } else {
            (now - self.last_tick) as i64
        };
        self.last_tick = now;
        self.discover(ledgers);
        for t in self.tenants.values_mut() {
            let gpu = t.compute().gpu_ns.load(SeqCst);
            let delta = gpu.saturating_sub(t.last_gpu);
            t.last_gpu = gpu;
            t.vtime += delta as f64 / t.weight();
            if t.capped() {
                let burst = WINDOW_NS * i64::from(t.cap) / 100;
                t.tokens = (t.tokens + dt * i64::from(t.cap) / 100).min(burst) - delta as i64;
            }
            t.quiet = if delta == 0 && !t.waiting() {
                t.quiet + dt
            } else {
                0
            };
            t.compute().heartbeat.fetch_add(1, SeqCst);
        }
        let devices: Vec<u64> = {
            let mut d: Vec<u64> = self.tenants.values().map(|t| t.device).collect();
            d.sort_unstable();
            d.dedup();
            d
        };
        for dev in devices {
            self.schedule(dev, now);
        }
        if now - self.last_sample >= 100_000_000 {
            self.last_sample = now;
            self.publish(now, status);
        }
    }

    /// Adds tenants that became gated, drops those that are gone or no longer gated (their
    /// budget is opened for good).
    fn discover(&mut self, ledgers: &[Arc<CgroupLedger>]) {
        for t in self.tenants.values_mut() {
            t.seen = false;
        }
        for l in ledgers {
            let ledger = l.ledger();
            for idx in 0..MAX_DEVICES {
                let device = ledger.usage.devices[idx].key.load(SeqCst);
                let lim = &ledger.limits.devices[idx];
                let (share, cap) = (lim.compute_share.load(SeqCst), lim.compute_cap.load(SeqCst));
                if device == 0 || !(gated(share) || gated(cap)) {
                    continue;
                }
                let id = (l.cgroup_id, idx);
                let min_vtime = if self.tenants.contains_key(&id) {
                    0.0
                } else {
                    self.min_vtime(device)
                };
                let t = self.tenants.entry(id).or_insert_with(|| {
                    let gpu = ledger.usage.compute[idx].gpu_ns.load(SeqCst);
                    Tenant {
                        ledger: Arc::clone(l),
                        idx,
                        device,
                        share,
                        cap,
                        last_gpu: gpu,
                        vtime: min_vtime,
                        tokens: 0,
                        quiet: 0,
                        seen: true,
                        history: VecDeque::new(),
                    }
                });
                if !Arc::ptr_eq(&t.ledger, l) {
                    // The cgroup's ledger was replaced (agent restart path): start over.
                    t.ledger = Arc::clone(l);
                    t.last_gpu = ledger.usage.compute[idx].gpu_ns.load(SeqCst);
                    t.history.clear();
                }
                (t.share, t.cap, t.seen) = (share, cap, true);
            }
        }
        let gone: Vec<TenantId> = self
            .tenants
            .iter()
            .filter(|(_, t)| !t.seen)
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            if let Some(t) = self.tenants.remove(&k) {
                // No longer gated: let whatever still waits run.
                t.budget().store(i64::MAX / 2, SeqCst);
                t.compute().grant.fetch_add(1, SeqCst);
                wake(t.compute());
                self.holders.retain(|_, h| *h != k);
            }
        }
    }

    /// Where a newcomer on `device` starts: level with the tenants already there.
    fn min_vtime(&self, device: u64) -> f64 {
        let m = self
            .tenants
            .values()
            .filter(|t| t.device == device)
            .map(|t| t.vtime)
            .fold(f64::INFINITY, f64::min);
        if m.is_finite() { m } else { 0.0 }
    }

    /// Decides the turn on one device.
    fn schedule(&mut self, device: u64, now: u64) {
        let ids: Vec<TenantId> = self
            .tenants
            .iter()
            .filter(|(_, t)| t.device == device)
            .map(|(k, _)| *k)
            .collect();
        // No banking: an idle tenant's virtual time keeps up with the active ones'.
        let active_min = ids
            .iter()
            .map(|k| &self.tenants[k])
            .filter(|t| !t.idle())
            .map(|t| t.vtime)
            .fold(f64::INFINITY, f64::min);
        if active_min.is_finite() {
            for k in &ids {
                let t = self.tenants.get_mut(k).expect("tenant");
                if t.idle() {
                    t.vtime = t.vtime.max(active_min);
                }
            }
        }
        let mut holder = self.holders.get(&device).cloned();
        if let Some(h) = holder {
            let t = &self.tenants[&h];
            let others_wait = ids
                .iter()
                .any(|k| *k != h && self.tenants[k].waiting() && self.tenants[k].eligible());
            let spent = t.budget().load(SeqCst) < 0;
            let end = !t.eligible() || (others_wait && (spent || t.idle())) || (spent && t.idle());
            if end {
                t.budget().store(CLOSED, SeqCst);
                holder = None;
                self.holders.remove(&device);
                // The next turn starts once this one's queued work has run: measured GPU
                // time is then each tenant's own.
                let queued = t.compute().queued_ns.load(SeqCst).max(0) as u64;
                let wait = (2 * queued + 2_000_000).min(MAX_DRAIN_NS);
                self.draining.insert(device, (h, now + wait));
            } else if spent && t.waiting() {
                // Alone (or everybody else is capped out): the turn goes on.
                grant(t);
            }
        }
        if let Some((from, deadline)) = self.draining.get(&device).cloned() {
            let drained = self
                .tenants
                .get(&from)
                .is_none_or(|t| t.compute().inflight.load(SeqCst) <= 0);
            if drained || now >= deadline {
                self.draining.remove(&device);
            }
        }
        if holder.is_none() && !self.draining.contains_key(&device) {
            let next = ids
                .iter()
                .filter(|k| self.tenants[*k].waiting() && self.tenants[*k].eligible())
                .min_by(|a, b| self.tenants[*a].vtime.total_cmp(&self.tenants[*b].vtime))
                .cloned();
            if let Some(n) = next {
                let t = self.tenants.get_mut(&n).expect("tenant");
                t.quiet = 0;
                grant(t);
                self.holders.insert(device, n);
                holder = Some(n);
            }
        }
        // Everybody else waits.
        for k in &ids {
            if Some(k) != holder.as_ref() {
                let b = self.tenants[k].budget();
                if b.load(SeqCst) >= 0 {
                    b.store(CLOSED, SeqCst);
                }
            }
        }
    }

    /// Refreshes the status figures.
    fn publish(&mut self, now: u64, status: &ComputeStatus) {
        let mut by_cgroup: HashMap<String, ComputeFigures> = HashMap::new();
        let log_now = now - self.last_log >= 1_000_000_000;
        if log_now {
            self.last_log = now;
        }
        for (&(_, idx), t) in self.tenants.iter_mut() {
            let cgroup = &t.ledger.cgroup;
            t.history.push_back((now, t.last_gpu));
            while t
                .history
                .front()
                .is_some_and(|&(at, _)| now - at > ACHIEVED_OVER.as_nanos() as u64)
            {
                t.history.pop_front();
            }
            if log_now {
                let c = t.compute();
                tracing::debug!(
                    cgroup = %cgroup,
                    device = idx,
                    used_pct_1s = format!("{:.1}", t.used_pct_over(1_000_000_000)),
                    share = t.share,
                    cap = t.cap,
                    tokens_ms = t.tokens / 1_000_000,
                    vtime_ms = format!("{:.1}", t.vtime / 1e6),
                    waiting = c.waiting.load(SeqCst),
                    inflight = c.inflight.load(SeqCst),
                    grants = c.grant.load(SeqCst),
                    "compute tenant"
                );
            }
            let f = by_cgroup.entry(cgroup.clone()).or_default();
            f.share_pct = gated(t.share).then_some(t.share);
            f.cap_pct = gated(t.cap).then_some(t.cap);
            f.used_pct += t.used_pct();
        }
        *status.by_cgroup.lock().expect("compute status lock") = by_cgroup;
    }
}

/// Gives `t` the turn: its quantum as budget, then a wake-up.
fn grant(t: &Tenant) {
    t.budget().store(t.quantum(), SeqCst);
    t.compute().grant.fetch_add(1, Relaxed);
    wake(t.compute());
}

/// Runs the controller until the process exits (its own thread: a tick every [`TICK`] while
/// some device is gated, every [`IDLE_TICK`] otherwise).
pub fn run(ledgers: &Ledgers, status: &ComputeStatus) {
    let mut c = Controller::default();
    loop {
        let all = ledgers.all();
        c.tick(&all, status);
        std::thread::sleep(if c.tenants.is_empty() {
            IDLE_TICK
        } else {
            TICK
        });
    }
}
