//! The compute controller: turns the compute shares and caps of the cgroups on each GPU into
//! turns on the device (docs/compute.md, "Agent-driven mode" has the model and its numbers).
//!
//! - A *tenant* is a gated (cgroup, device). Its share is a share of the device's **time**:
//!   only one tenant in turns holds the device at a time, a turn lasts its quantum
//!   ([`ROUND_NS`] × share) of wall time — host gaps included, so that a share holds on
//!   throughput ("30%" = 30% of what it would do alone) for GPU-bound and host-gapped loops
//!   alike, and for any number of processes or streams in the container —, and its virtual
//!   time advances by the device time it held ÷ its share. The next turn goes to the waiting
//!   tenant furthest behind; a newcomer or a tenant back from idling (or from being stopped or
//!   frozen, whatever its page says is queued) starts level with the others (no banking).
//! - A turn ends at its quantum if anyone else waits (re-granted if not: work-conserving),
//!   when its holder leaves it unused for [`IDLE_NS`], or when a cap's bucket runs out. The
//!   next turn starts once the holder's queued work has drained, or after a deadline from the
//!   controller's own clock ([`MAX_DRAIN_NS`] at most).
//! - A tenant whose turns leave the device mostly idle (measured GPU time under
//!   [`LIGHT_DUTY`] of its turn time: a decoder that syncs every token, small-batch
//!   inference) *co-runs*: its launches run whenever it has work, beside the holder, while its
//!   measured use stays under its share; everybody's queued work is then bounded by
//!   [`CORUN_QUEUE_NS`] so that its steps wait little. Past its share it takes turns again.
//! - Nothing a tenant does or stops doing stalls the others: every per-process stamp is read
//!   against the controller's heartbeat (a killed or stopped process's stamps go stale in
//!   [`FRESH_BEATS`] ticks), turns and drains are bounded by the controller's clock, and the
//!   decisions are written into the ledger's read-only page.
//!
//! Caps are token buckets on measured GPU time (refilled at the cap, at most a
//! [`WINDOW_NS`] share of it; a turn is charged at most the device time it held, see
//! `Tenant::settle_cap`): a tenant whose bucket is empty gets no turn, even on an idle
//! device. Tenants without a share or cap are not gated and not scheduled.

mod switches;
mod tenant;
mod tuning;

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fgpu_common::ledger::compute::{TURN_CLOSED, TURN_CORUN, TURN_OPEN};
use fgpu_common::ledger::{DeviceTurn, MAX_DEVICES};

use self::tenant::{Held, Mode, Tenant, gated};
use self::tuning::Tuning;
use super::ledgers::{CgroupLedger, Ledgers};

pub const TICK: Duration = Duration::from_micros(500);
/// The tick while no device is gated (an idle node costs 20 wake-ups a second).
pub const IDLE_TICK: Duration = Duration::from_millis(50);
/// A round of turns: a tenant's quantum is its weight's share of this.
pub const ROUND_NS: i64 = 400_000_000;
/// The shortest quantum.
const MIN_QUANTUM_NS: i64 = 2_000_000;
/// A cap's bucket holds at most the cap's share of this window.
pub const WINDOW_NS: i64 = 100_000_000;
/// A holder that neither launches nor reports GPU time for this long gives its turn up
/// (killed, stopped, or between bursts of work).
const IDLE_NS: u64 = 3_000_000;
/// The next turn waits at most this long for the previous holder's queued work to drain
/// (less when less is queued: 1.5 × its estimate + 1 ms).
const MAX_DRAIN_NS: u64 = 20_000_000;
/// A per-process stamp older than this many heartbeats is stale (the process stopped or
/// died): about 20 ms at [`TICK`].
pub const FRESH_BEATS: u64 = 40;
/// A tenant's duty is sampled every this much turn time (over however many turns).
const DUTY_SAMPLE_NS: u64 = 20_000_000;
/// A tenant whose turns keep the device busy less than this fraction of the time co-runs
/// (on the H200 a ResNet-18 training step with `loss.item()` runs at about 0.5, a
/// token-by-token decoder at 0.4-0.5: both are better served by turns; a loop that idles
/// three quarters of its turns is not).
const LIGHT_DUTY: f64 = 0.3;
/// A tenant sent back to turns does not co-run again for this long (no flapping).
const CORUN_COOLDOWN_NS: u64 = 2_000_000_000;
/// No process may have more than this estimated GPU time queued on a gated device (the
/// next holder's wait for the device is bounded by it, plus one launch; times the
/// container's active processes, at most [`tenant::MAX_QUEUE_SCALE`], see
/// [`Tenant::queue_bound`])...
const QUEUE_NS: u64 = 4_000_000;
/// ...and while anyone co-runs there, no more than this.
const CORUN_QUEUE_NS: u64 = 1_000_000;
/// A co-runner's measured use is checked against its share over this window...
const CORUN_WINDOW_NS: u64 = 300_000_000;
/// ...and it goes back to turns once it is this many times its share (its measured time
/// includes the time its work waits behind the holder's, so it over-states its use)...
const CORUN_OVER: f64 = 1.5;
/// ...or this many percent.
const CORUN_MAX_PCT: f64 = 90.0;
/// `fgpu status` shows the share achieved over this long.
pub const ACHIEVED_OVER: Duration = Duration::from_secs(5);

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
    /// base, times its active processes ([`Tenant::queue_bound`]).
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

fn now_ns() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

/// Sets a tenant's turn state, waking whoever sleeps on its word at every change (threads
/// waiting for the turn; each process's watcher, which settles its work when the turn closes).
fn set_turn(t: &Tenant, state: i64) {
    let turn = t.turn();
    if turn.set(state) {
        wake(turn);
    }
}

/// A tenant: (cgroup id, ledger device record).
type TenantId = (u64, usize);

/// A turn that just ended: the next waits until its tenant's work has drained (its shims saw
/// every batch complete) or the deadline passes.
#[derive(Clone, Copy)]
struct Drain {
    from: TenantId,
    started: u64,
    deadline: u64,
}

/// Per device: the turn in progress and the drain after the last one.
#[derive(Default)]
struct DeviceState {
    holder: Option<TenantId>,
    draining: Option<Drain>,
    /// When the last turn ended and whose it was, until the next grant (for the metrics'
    /// switch latency).
    ended: Option<(u64, TenantId)>,
}

/// The controller's state across ticks.
#[derive(Default)]
pub struct Controller {
    tenants: HashMap<TenantId, Tenant>,
    devices: HashMap<u64, DeviceState>,
    last_tick: u64,
    last_sample: u64,
    last_log: u64,
    tuning: Tuning,
}

impl Controller {
    pub fn new() -> Controller {
        Controller {
            tuning: Tuning::from_env(),
            ..Controller::default()
        }
    }

    /// One tick over all ledgers.
    pub fn tick(&mut self, ledgers: &[Arc<CgroupLedger>], status: &ComputeStatus) {
        let now = now_ns();
        let dt = if self.last_tick == 0 {
            0
        } else {
            now.saturating_sub(self.last_tick)
        };
        self.last_tick = now;
        self.discover(ledgers, now);
        for t in self.tenants.values_mut() {
            t.observe(now, dt as i64);
        }
        let mut devices: Vec<u64> = self.tenants.values().map(|t| t.device).collect();
        devices.sort_unstable();
        devices.dedup();
        self.devices.retain(|d, _| devices.contains(d));
        for dev in devices {
            self.schedule(dev, now, dt, status);
        }
        if now - self.last_sample >= 100_000_000 {
            self.last_sample = now;
            self.publish(now, status);
        }
    }

    /// Adds tenants that became gated, drops those that are gone or no longer gated (their
    /// turn is opened for good).
    fn discover(&mut self, ledgers: &[Arc<CgroupLedger>], now: u64) {
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
                if !self.tenants.contains_key(&id) {
                    let v = self.level_vtime(device);
                    self.tenants
                        .insert(id, Tenant::new(Arc::clone(l), idx, device, v));
                }
                let t = self.tenants.get_mut(&id).expect("tenant");
                if !Arc::ptr_eq(&t.ledger, l) || t.device != device {
                    // The cgroup's ledger was replaced (agent restart path): start over.
                    *t = Tenant::new(Arc::clone(l), idx, device, t.vtime);
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
                t.turn().queue_ns.store(0, SeqCst);
                set_turn(&t, TURN_OPEN);
                for d in self.devices.values_mut() {
                    if d.holder == Some(k) {
                        d.holder = None;
                        d.ended = Some((now, k));
                    }
                }
            }
        }
    }

    /// Where a newcomer on `device` starts: level with the tenants already there.
    fn level_vtime(&self, device: u64) -> f64 {
        let m = self
            .tenants
            .values()
            .filter(|t| t.device == device)
            .map(|t| t.vtime)
            .fold(f64::INFINITY, f64::min);
        if m.is_finite() { m } else { 0.0 }
    }

    /// Decides the turn on one device.
    fn schedule(&mut self, device: u64, now: u64, dt: u64, status: &ComputeStatus) {
        let tuning = self.tuning;
        let ids: Vec<TenantId> = self
            .tenants
            .iter()
            .filter(|(_, t)| t.device == device)
            .map(|(k, _)| *k)
            .collect();
        let tenants = &mut self.tenants;
        let dev = self.devices.entry(device).or_default();
        // No banking: an idle tenant's virtual time keeps up with the active ones'.
        let active_min = ids
            .iter()
            .map(|k| &tenants[k])
            .filter(|t| !t.idle(now, IDLE_NS))
            .map(|t| t.vtime)
            .fold(f64::INFINITY, f64::min);
        if active_min.is_finite() {
            for k in &ids {
                let t = tenants.get_mut(k).expect("tenant");
                if t.idle(now, IDLE_NS) && t.vtime < active_min {
                    tracing::trace!(
                        cgroup = %t.ledger.cgroup,
                        behind_ms = (active_min - t.vtime) * t.weight() / 1e6,
                        "compute: idle tenant brought level (no banking)"
                    );
                    t.vtime = active_min;
                }
            }
        }
        // Co-runners: open while under their share, back to turns past it.
        for k in &ids {
            let t = tenants.get_mut(k).expect("tenant");
            if t.mode == Mode::CoRun
                && (!t.eligible()
                    || t.used_pct_over(CORUN_WINDOW_NS)
                        >= (CORUN_OVER * f64::from(t.share)).min(CORUN_MAX_PCT))
            {
                t.mode = Mode::Turns;
                t.reset_duty();
                t.corun_after = now + CORUN_COOLDOWN_NS;
                tracing::debug!(cgroup = %t.ledger.cgroup, device = t.idx, "compute: co-running tenant back to turns");
            }
        }
        // The holder: charge its turn, end it when due.
        if let Some(h) = dev.holder {
            // Somebody else waits who is not ahead of the holder: its quantum is then over
            // (a holder still furthest behind goes on, no switch for nothing).
            let mine = tenants[&h].vtime;
            let others_wait = ids.iter().any(|k| {
                let o = &tenants[k];
                *k != h && o.mode == Mode::Turns && o.waiting() && o.eligible() && o.vtime <= mine
            });
            let t = tenants.get_mut(&h).expect("holder");
            let held = t.held.expect("a holder holds a turn");
            if !held.pending {
                t.charge(dt, DUTY_SAMPLE_NS);
            }
            let long = now.saturating_sub(held.since) >= t.quantum(tuning.round_ns);
            let idle = t.idle_in_turn(now, IDLE_NS, MAX_DRAIN_NS);
            if held.pending {
                // Its clock starts when the drain before it ends.
            } else if !t.eligible() || idle || (others_wait && long) {
                if !t.eligible() {
                    t.stats.ended_cap += 1;
                } else if idle {
                    t.stats.ended_idle += 1;
                } else {
                    t.stats.ended_quantum += 1;
                }
                t.stats.turn_ns += now.saturating_sub(held.granted);
                tracing::trace!(
                    cgroup = %t.ledger.cgroup,
                    held_us = now.saturating_sub(held.granted) / 1000,
                    why = if !t.eligible() { "cap" } else if idle { "idle" } else { "quantum" },
                    queued_us = t.act.queued_ns.max(0) / 1000,
                    inflight = t.act.inflight,
                    active = t.act.active,
                    queue_us = t.turn().queue_ns.load(SeqCst) / 1000,
                    "compute: turn ends"
                );
                t.held = None;
                set_turn(t, TURN_CLOSED);
                dev.holder = None;
                dev.ended = Some((now, h));
                let queued = t.act.queued_ns.max(0) as u64;
                let wait = (queued + queued / 2 + 1_000_000).min(MAX_DRAIN_NS);
                dev.draining = Some(Drain {
                    from: h,
                    started: now,
                    deadline: now + wait,
                });
            } else if long {
                // Alone (or everybody else is capped out): the turn goes on.
                t.held = Some(Held { since: now, ..held });
            }
        }
        // The drain: the previous holder's queued work still runs on the device, so the
        // device time is still its own (charged), and the next turn waits for it.
        if let Some(d) = dev.draining {
            let drained = match tenants.get_mut(&d.from) {
                None => true,
                Some(t) => {
                    t.charge(dt, DUTY_SAMPLE_NS);
                    t.act.inflight <= 0
                }
            };
            if drained || now >= d.deadline {
                dev.draining = None;
                let took = now.saturating_sub(d.started);
                tracing::trace!(
                    took_us = took / 1000,
                    deadline = !drained,
                    "compute: drain ends"
                );
                for k in &ids {
                    let o = tenants.get_mut(k).expect("tenant");
                    if *k == d.from {
                        o.stats.drain_ns += took;
                        o.stats.drain_deadline += u64::from(!drained);
                    } else if let Some(h) = o.held.as_mut().filter(|h| h.pending) {
                        // Opened during the drain (overlap): its clock starts now.
                        (h.pending, h.since, h.granted) = (false, now, now);
                        o.stats.switch_wait_ns += took;
                    } else if o.mode == Mode::Turns && o.waiting() {
                        o.stats.switch_wait_ns += took;
                    }
                }
                if let Some(t) = tenants.get_mut(&d.from)
                    && gated(t.share)
                    && t.duty < tuning.light_duty
                    && t.eligible()
                    && now >= t.corun_after
                {
                    t.mode = Mode::CoRun;
                    tracing::debug!(
                        cgroup = %t.ledger.cgroup,
                        device = t.idx,
                        duty = t.duty,
                        "compute: latency-bound tenant co-runs"
                    );
                }
            }
        }
        let draining = dev.draining.map(|d| d.from);
        if dev.holder.is_none() && (draining.is_none() || tuning.overlap) {
            let next = ids
                .iter()
                .filter(|k| {
                    let t = &tenants[*k];
                    Some(**k) != draining && t.mode == Mode::Turns && t.waiting() && t.eligible()
                })
                .min_by(|a, b| tenants[*a].vtime.total_cmp(&tenants[*b].vtime))
                .copied();
            if let Some(n) = next {
                let t = tenants.get_mut(&n).expect("tenant");
                t.held = Some(Held {
                    since: now,
                    granted: now,
                    launched: false,
                    pending: draining.is_some(),
                });
                t.stats.turns += 1;
                t.begin_turn();
                tracing::trace!(cgroup = %t.ledger.cgroup, pending = draining.is_some(), "compute: turn granted");
                dev.holder = Some(n);
                status.switches.granted(device, dev.ended.take(), now, n);
            }
        }
        // Write the decisions: the holder's turn open, co-runners beside it, everybody else
        // closed; small queues while anyone co-runs.
        let corun = ids.iter().any(|k| tenants[k].mode == Mode::CoRun);
        let base = if corun {
            CORUN_QUEUE_NS.min(tuning.queue_ns)
        } else {
            tuning.queue_ns
        };
        for k in &ids {
            let t = &tenants[k];
            let queue = t.queue_bound(base, tuning.queue_scale && !corun);
            let state = if Some(*k) == dev.holder {
                TURN_OPEN
            } else if t.mode == Mode::CoRun {
                TURN_CORUN
            } else {
                TURN_CLOSED
            };
            let turn = t.turn();
            if turn.queue_ns.load(SeqCst) != queue {
                turn.queue_ns.store(queue, SeqCst);
            }
            set_turn(t, state);
        }
    }

    /// Refreshes the status figures (and logs every tenant once a second at debug level).
    fn publish(&mut self, now: u64, status: &ComputeStatus) {
        let mut by_cgroup: HashMap<String, ComputeFigures> = HashMap::new();
        let log_now = now - self.last_log >= 1_000_000_000;
        if log_now {
            self.last_log = now;
        }
        let over = ACHIEVED_OVER.as_nanos() as u64;
        for t in self.tenants.values_mut() {
            t.record(now);
            if log_now {
                let (s, l) = (t.stats, t.logged);
                t.logged = s;
                let turns = s.turns - l.turns;
                let per =
                    |a: u64, b: u64| format!("{:.2}", (a - b) as f64 / 1e6 / turns.max(1) as f64);
                tracing::debug!(
                    cgroup = %t.ledger.cgroup,
                    device = t.idx,
                    used_pct_1s = format!("{:.1}", t.used_pct_over(1_000_000_000)),
                    turn_pct_1s = format!("{:.1}", t.turn_pct_over(1_000_000_000)),
                    share = t.share,
                    cap = t.cap,
                    mode = ?t.mode,
                    duty = format!("{:.2}", t.duty),
                    tokens_ms = t.tokens / 1_000_000,
                    vtime_ms = format!("{:.1}", t.vtime / 1e6),
                    waiting = t.act.waiting,
                    inflight = t.act.inflight,
                    grants = t.turn().grant.load(SeqCst),
                    turns,
                    ended_quantum = s.ended_quantum - l.ended_quantum,
                    ended_idle = s.ended_idle - l.ended_idle,
                    ended_cap = s.ended_cap - l.ended_cap,
                    turn_ms = per(s.turn_ns, l.turn_ns),
                    first_launch_ms = per(s.first_launch_ns, l.first_launch_ns),
                    drain_ms = per(s.drain_ns, l.drain_ns),
                    drain_deadline = s.drain_deadline - l.drain_deadline,
                    switch_wait_ms = per(s.switch_wait_ns, l.switch_wait_ns),
                    "compute tenant"
                );
            }
            let f = by_cgroup.entry(t.ledger.cgroup.clone()).or_default();
            f.share_pct = gated(t.share).then_some(t.share);
            f.cap_pct = gated(t.cap).then_some(t.cap);
            f.used_pct += t.used_pct_over(over);
            f.turn_pct += t.turn_pct_over(over);
            f.corun |= t.mode == Mode::CoRun;
            f.queue_us = f.queue_us.max(t.turn().queue_ns.load(SeqCst) / 1000);
        }
        *status.by_cgroup.lock().expect("compute status lock") = by_cgroup;
    }

    /// Whether any device is gated (the controller ticks fast then).
    pub fn busy(&self) -> bool {
        !self.tenants.is_empty()
    }
}

/// Runs the controller until the process exits (its own thread: a tick every [`TICK`] while
/// some device is gated, every [`IDLE_TICK`] otherwise).
pub fn run(ledgers: &Ledgers, status: &ComputeStatus) {
    let mut c = Controller::new();
    loop {
        let all = ledgers.all();
        c.tick(&all, status);
        std::thread::sleep(if c.busy() { TICK } else { IDLE_TICK });
    }
}
