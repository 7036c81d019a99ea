//! The compute controller: turns the compute shares, caps and priorities of the cgroups on
//! each GPU into turns on the device (docs/compute.md, "Agent-driven mode").
//!
//! The decisions are made by [`sched::Scheduler`], a pure function of time and observations;
//! this module only wires it to the ledgers: every tick it reads the clock once, bumps each
//! gated device's heartbeat and reads what the container's processes do
//! (`Ledger::activity`, stamps read against that heartbeat), hands the observations to the
//! scheduler, and writes its decisions into the ledgers' read-only pages (turn state, queue
//! bound), waking the threads that sleep on a turn whose state changed. It also publishes
//! the figures `fgpu status` and the metrics show.

pub mod sched;
mod switches;
pub mod team;

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fgpu_common::clock::mono_ns;
use fgpu_common::ledger::compute::TURN_OPEN;
use fgpu_common::ledger::{DeviceTurn, MAX_DEVICES};

use self::sched::{
    ACHIEVED_OVER, FRESH_BEATS, Mode, Observation, Scheduler, TenantId, Tuning, gated,
};
use super::gpus::Gpus;
use super::ledgers::{CgroupLedger, Ledgers};

pub use self::sched::TICK;
pub use self::switches::Gaps;
/// The tick while no device is gated (an idle node costs 20 wake-ups a second).
pub const IDLE_TICK: Duration = Duration::from_millis(50);
/// How often NVML's device utilisation is read while a device is gated (tens of µs a call).
const BUSY_EVERY_NS: u64 = 100_000_000;

/// A cgroup's compute figures for `fgpu status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComputeFigures {
    pub share_pct: Option<u32>,
    pub cap_pct: Option<u32>,
    /// Measured GPU time over the last [`ACHIEVED_OVER`], percent of wall time (summed over
    /// devices).
    pub used_pct: f64,
    /// Device time held in turns over the same window, percent of wall time: what a share
    /// is a share of.
    pub turn_pct: f64,
    /// Whether it co-runs (latency-bound) on some device.
    pub corun: bool,
    /// The queue bound each of its processes has now, µs (the largest over devices): the
    /// base, times its active processes ([`sched::Tenant::queue_bound`]).
    pub queue_us: u64,
}

/// What the controller shares with the status report.
#[derive(Default)]
pub struct ComputeStatus {
    by_cgroup: Mutex<HashMap<String, ComputeFigures>>,
    /// Turn switches per device, for the metrics (read-only: [`switches`]).
    pub switches: switches::SwitchStats,
}

impl ComputeStatus {
    pub fn all(&self) -> HashMap<String, ComputeFigures> {
        self.by_cgroup.lock().expect("compute status lock").clone()
    }
}

/// Wakes every thread sleeping on a turn's grant word.
fn wake(t: &DeviceTurn) {
    // SAFETY: FUTEX_WAKE (shared) on a valid, aligned u32 of a MAP_SHARED mapping; it only
    // wakes sleepers.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            t.grant.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        )
    };
}

/// Sets a turn's state, waking whoever sleeps on its word at every change (threads waiting
/// for the turn; each process's watcher, which settles its work when the turn closes).
fn set_turn(turn: &DeviceTurn, state: i64) {
    if turn.set(state) {
        wake(turn);
    }
}

/// The controller: the scheduler and the ledgers of the tenants it decides for.
pub struct Controller {
    sched: Scheduler,
    /// Each tenant's ledger, as last observed.
    ledgers: HashMap<TenantId, Arc<CgroupLedger>>,
    last_publish: u64,
    last_log: u64,
    /// Per device key: NVML's utilisation integrated over time, ns busy, and when it was
    /// last read.
    busy: HashMap<u64, u64>,
    last_busy: Option<u64>,
}

impl Default for Controller {
    fn default() -> Controller {
        Controller::with(Tuning::default())
    }
}

impl Controller {
    /// A controller with the agent environment's tuning overrides.
    pub fn new() -> Controller {
        Controller::with(Tuning::from_env())
    }

    fn with(tuning: Tuning) -> Controller {
        Controller {
            sched: Scheduler::new(tuning),
            ledgers: HashMap::new(),
            last_publish: 0,
            last_log: 0,
            busy: HashMap::new(),
            last_busy: None,
        }
    }

    /// Integrates the driver's device utilisation `readings` (uuid key, percent of the last
    /// sample period) read at `now` over the time since the last reading, and hands each
    /// device's total to the scheduler.
    fn device_busy(&mut self, now: u64, readings: &[(u64, u32)]) {
        let dt = self.last_busy.map_or(0, |t| now.saturating_sub(t));
        self.last_busy = Some(now);
        for &(key, pct) in readings {
            let b = self.busy.entry(key).or_default();
            *b += dt * u64::from(pct.min(100)) / 100;
            self.sched.device_busy(key, *b);
        }
    }

    /// One tick over all ledgers.
    pub fn tick(&mut self, ledgers: &[Arc<CgroupLedger>], status: &ComputeStatus) {
        let now = mono_ns();
        let observations = self.observe(ledgers);
        let out = self.sched.tick(now, &observations);
        for id in &out.released {
            if let Some(l) = self.ledgers.remove(id) {
                // No longer gated (or gone): let whatever still waits run.
                let turn = l.ledger().turn(id.1);
                turn.queue_ns.store(0, SeqCst);
                set_turn(turn, TURN_OPEN);
            }
        }
        for d in &out.decisions {
            let Some(l) = self.ledgers.get(&d.id) else {
                continue;
            };
            let turn = l.ledger().turn(d.id.1);
            if turn.queue_ns.load(SeqCst) != d.queue_ns {
                turn.queue_ns.store(d.queue_ns, SeqCst);
            }
            set_turn(turn, d.state);
        }
        for g in &out.grants {
            status.switches.granted(g.device, g.ended, g.at, g.to);
        }
        if now.saturating_sub(self.last_publish) >= 100_000_000 {
            self.last_publish = now;
            self.publish(now, status);
        }
    }

    /// Reads every gated device record of every ledger: bumps its heartbeat, reads what the
    /// processes do against it. Remembers each tenant's ledger for the decisions.
    fn observe(&mut self, ledgers: &[Arc<CgroupLedger>]) -> Vec<Observation> {
        let mut out = Vec::new();
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
                let turn = ledger.turn(idx);
                let beat = turn.heartbeat.fetch_add(1, SeqCst) + 1;
                out.push(Observation {
                    id,
                    device,
                    share,
                    cap,
                    priority: l.priority(),
                    team: l.team_on(device),
                    // A replaced ledger (agent restart path) is another mapping.
                    incarnation: Arc::as_ptr(l) as u64,
                    gpu_ns: ledger.usage.compute[idx].gpu_ns.load(SeqCst),
                    launches: ledger.usage.compute[idx].launches.load(SeqCst),
                    act: ledger.activity(idx, beat, FRESH_BEATS),
                });
                self.ledgers.insert(id, Arc::clone(l));
            }
        }
        out
    }

    /// Refreshes the status figures (and logs every tenant once a second at debug level).
    fn publish(&mut self, now: u64, status: &ComputeStatus) {
        let mut by_cgroup: HashMap<String, ComputeFigures> = HashMap::new();
        let log_now = now.saturating_sub(self.last_log) >= 1_000_000_000;
        if log_now {
            self.last_log = now;
        }
        let over = ACHIEVED_OVER.as_nanos() as u64;
        let ids: Vec<TenantId> = self.sched.tenants().map(|(k, _)| *k).collect();
        for id in ids {
            let Some(l) = self.ledgers.get(&id) else {
                continue;
            };
            let marks = if log_now {
                self.sched.log_mark(&id)
            } else {
                None
            };
            let Some(t) = self.sched.tenant(&id) else {
                continue;
            };
            let queue_ns = l.ledger().turn(id.1).queue_ns.load(SeqCst);
            let (open, probe) = self.sched.probe_of(t.device).unwrap_or_default();
            if let Some((s, last)) = marks {
                let turns = s.turns - last.turns;
                let per =
                    |a: u64, b: u64| format!("{:.2}", (a - b) as f64 / 1e6 / turns.max(1) as f64);
                tracing::debug!(
                    cgroup = %l.cgroup,
                    device = id.1,
                    used_pct_1s = format!("{:.1}", t.used_pct_over(1_000_000_000)),
                    turn_pct_1s = format!("{:.1}", t.turn_pct_over(1_000_000_000)),
                    share = t.share,
                    cap = t.cap,
                    priority = ?t.priority,
                    mode = ?t.mode,
                    device_open = open,
                    open_trials = probe.trials,
                    opened = probe.opened,
                    open_gain = format!("{:.2}", probe.last_gain),
                    open_least = format!("{:.2}", probe.last_least),
                    launches = t.launches,
                    duty = format!("{:.2}", t.duty),
                    tokens_ms = t.tokens / 1_000_000,
                    vtime_ms = format!("{:.1}", t.vtime / 1e6),
                    waiting = t.act.waiting,
                    inflight = t.act.inflight,
                    turns,
                    ended_quantum = s.ended_quantum - last.ended_quantum,
                    ended_idle = s.ended_idle - last.ended_idle,
                    ended_cap = s.ended_cap - last.ended_cap,
                    ended_priority = s.ended_priority - last.ended_priority,
                    placed_ms = format!("{:.1}", (s.placed_ns - last.placed_ns) as f64 / 1e6),
                    turn_ms = per(s.turn_ns, last.turn_ns),
                    first_launch_ms = per(s.first_launch_ns, last.first_launch_ns),
                    drain_ms = per(s.drain_ns, last.drain_ns),
                    drain_deadline = s.drain_deadline - last.drain_deadline,
                    switch_wait_ms = per(s.switch_wait_ns, last.switch_wait_ns),
                    "compute tenant"
                );
            }
            let f = by_cgroup.entry(l.cgroup.clone()).or_default();
            f.share_pct = gated(t.share).then_some(t.share);
            f.cap_pct = gated(t.cap).then_some(t.cap);
            f.used_pct += t.used_pct_over(over);
            f.turn_pct += t.turn_pct_over(over);
            f.corun |= t.mode == Mode::CoRun || open;
            f.queue_us = f.queue_us.max(queue_ns / 1000);
        }
        *status.by_cgroup.lock().expect("compute status lock") = by_cgroup;
    }

    /// Whether any device is gated (the controller ticks fast then).
    pub fn busy(&self) -> bool {
        self.sched.busy()
    }
}

/// Runs the controller until the process exits (its own thread: a tick every [`TICK`] while
/// some device is gated, every [`IDLE_TICK`] otherwise; NVML's device utilisation read every
/// [`BUSY_EVERY_NS`] meanwhile).
pub fn run(ledgers: &Ledgers, status: &ComputeStatus, gpus: &Gpus) {
    let mut c = Controller::new();
    loop {
        let all = ledgers.all();
        let now = mono_ns();
        if !c.busy() {
            c.last_busy = None;
        } else if c
            .last_busy
            .is_none_or(|t| now.saturating_sub(t) >= BUSY_EVERY_NS)
        {
            let readings = gpus.device_busy_pct();
            c.device_busy(now, &readings);
        }
        c.tick(&all, status);
        std::thread::sleep(if c.busy() { TICK } else { IDLE_TICK });
    }
}
