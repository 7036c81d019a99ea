//! The scheduler core: a pure function of time and observations.
//!
//! [`Scheduler::tick`] takes the tick's time and one [`Observation`] per gated (cgroup,
//! device) — what its processes do, read from its ledger by the caller — and returns the
//! [`Decision`]s to write back. It reads no clock and touches no ledger, so its behaviour is
//! tested in simulated time (`tests/`: a device model in milliseconds of CPU time) and the
//! controller around it (`super`) only wires ledgers to it.
//!
//! The model (docs/compute.md, "The scheduler"):
//! - A tenant's share is a share of the device's **time**. Only one tenant in turns holds
//!   the device at a time; a turn lasts its quantum ([`ROUND_NS`] × share of wall time, host
//!   gaps included), and its virtual time advances by the device time it held ÷ its share.
//!   The next turn goes to the competing tenant furthest behind.
//! - **Bounded lag** (as WFQ places a flow that becomes backlogged, and CFS/EEVDF a waking
//!   task): each device keeps a virtual time `V`, the least virtual time of the tenants
//!   competing for it (holding a turn, or waiting for one they may have), which never goes
//!   back. A tenant that starts competing — joins, wakes, resumes after SIGSTOP, a process
//!   restarted in its container, a co-runner back in turns, a capped tenant whose bucket
//!   refilled — starts at `V`, never behind it; and nobody is ever more than one virtual
//!   quantum ([`LAG_NS`]) behind `V`, whatever it did before (a tenant that kept launching a
//!   little for seconds, as PyTorch does while it imports and warms up, used to fall seconds
//!   behind and then take the device for as long).
//! - A turn ends at its quantum if anyone else of its class waits (re-granted if not:
//!   work-conserving), when its holder leaves it unused for [`IDLE_NS`], when a cap's bucket
//!   runs out, or after [`MIN_QUANTUM_NS`] when a tenant of a higher priority class waits. The
//!   next turn starts once the holder's queued work has drained, or after a deadline
//!   ([`MAX_DRAIN_NS`] at most).
//! - **Priority**: `high` tenants are served first while within their share (not more than a
//!   quantum ahead of `V`) and end a lower tenant's turn early; `low` tenants get the device
//!   only while no `normal` or `high` tenant competes. Unused share always spills over.
//! - **Caps are hard**: a token bucket refilled at the cap (at most a [`WINDOW_NS`] share of
//!   it) and charged the device time held (the turn from its first launch, and its drain): a
//!   tenant whose bucket is empty gets no turn, even on an idle device.
//! - A tenant whose turns leave the device mostly idle (measured GPU time under
//!   [`LIGHT_DUTY`] of its turn time) *co-runs*: its launches run whenever it has work,
//!   beside the holder, charged its measured time, while its measured use stays under its
//!   share; everybody's queued work is then bounded by [`CORUN_QUEUE_NS`]. Past its share it
//!   takes turns again.
//! - Nothing a tenant does or stops doing stalls the others: per-process stamps are read
//!   against the controller's heartbeat by the caller, and turns and drains are bounded by
//!   the tick's time.
//!
//! Tenants without a share or cap are not gated and not scheduled.

pub mod probe;
mod tenant;
#[cfg(test)]
mod tests;
mod tuning;

use std::collections::HashMap;
use std::time::Duration;

use fgpu_common::ledger::compute::{Activity, TURN_CLOSED, TURN_CORUN, TURN_OPEN};

pub use self::tenant::{Held, Mode, Tenant, TurnStats, gated};
pub use self::tuning::Tuning;

/// The controller's tick.
pub const TICK: Duration = Duration::from_micros(500);
/// A round of turns: a tenant's quantum is its weight's share of this (100 ms at 50%: ten
/// turns in every second, so that every 1 s window holds each share within a few points).
pub const ROUND_NS: i64 = 200_000_000;
/// The shortest quantum, and how long a turn lasts at least before a tenant of a higher
/// priority class ends it.
pub const MIN_QUANTUM_NS: i64 = 2_000_000;
/// The most a tenant's virtual time may be behind its device's: one quantum in virtual
/// units (a quantum is [`ROUND_NS`] × weight / 100 of device time, its virtual length is
/// therefore the same for every weight).
pub const LAG_NS: f64 = ROUND_NS as f64 / 100.0;
/// A cap's bucket holds at most the cap's share of this window.
pub const WINDOW_NS: i64 = 100_000_000;
/// A holder that neither launches nor reports GPU time for this long gives its turn up
/// (killed, stopped, or between bursts of work).
pub const IDLE_NS: u64 = 3_000_000;
/// The next turn waits at most this long for the previous holder's queued work to drain
/// (less when less is queued: 1.5 × its estimate + 1 ms).
pub const MAX_DRAIN_NS: u64 = 20_000_000;
/// A per-process stamp older than this many heartbeats is stale (the process stopped or
/// died): about 20 ms at [`TICK`].
pub const FRESH_BEATS: u64 = 40;
/// A tenant's duty is sampled every this much turn time (over however many turns).
const DUTY_SAMPLE_NS: u64 = 20_000_000;
/// A tenant whose turns keep the device busy less than this fraction of the time co-runs
/// (on the H200 a ResNet-18 training step with `loss.item()` runs at about 0.5, a
/// token-by-token decoder at 0.4-0.5: both are better served by turns; a loop that idles
/// three quarters of its turns is not).
pub const LIGHT_DUTY: f64 = 0.3;
/// A tenant sent back to turns does not co-run again for this long (no flapping).
const CORUN_COOLDOWN_NS: u64 = 2_000_000_000;
/// No process may have more than this estimated GPU time queued on a gated device (the
/// next holder's wait for the device is bounded by it, plus one launch; times the
/// container's active processes, at most [`tenant::MAX_QUEUE_SCALE`], see
/// [`Tenant::queue_bound`])...
pub const QUEUE_NS: u64 = 4_000_000;
/// ...and while anyone co-runs there, no more than this.
pub const CORUN_QUEUE_NS: u64 = 1_000_000;
/// A co-runner's measured use is checked against its share over this window...
const CORUN_WINDOW_NS: u64 = 300_000_000;
/// ...and it goes back to turns once it reaches this many times its share. Its measured
/// time includes the time its work waits behind the holder's, which over-states its use,
/// but only by the holder's queue (bounded at [`CORUN_QUEUE_NS`] meanwhile); at 1.5 a
/// tenant that co-ran while it warmed up and then started real work kept co-running at up
/// to 75% of the device at share 50 (a ResNet-18 joiner on the H200: 65.5% for 3 s beside
/// an incumbent at 50)...
const CORUN_OVER: f64 = 1.0;
/// ...or this many percent.
const CORUN_MAX_PCT: f64 = 90.0;
/// Status shows the share achieved over this long.
pub const ACHIEVED_OVER: Duration = Duration::from_secs(5);
/// Status figures are sampled this often.
const SAMPLE_NS: u64 = 100_000_000;

/// A tenant: (cgroup id, ledger device record).
pub type TenantId = (u64, usize);

/// `fgpu limit set --compute-priority` (ordered: `High` first).
pub use crate::api::ComputePriority as Priority;

/// A tenant's team on its device (`super::team`): its share is the team's `share` split
/// among the team's members that use the device, by their `weight`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Team {
    /// Non-zero; the same for every member.
    pub id: u64,
    /// The team's share, percent.
    pub share: u32,
    /// This member's weight (its own share, else 100).
    pub weight: u32,
}

/// One tenant at one tick, as the caller read it.
#[derive(Debug, Clone, Copy)]
pub struct Observation {
    pub id: TenantId,
    /// The device's key the record is bound to.
    pub device: u64,
    /// Share and cap in percent (gated when 1-99).
    pub share: u32,
    pub cap: u32,
    pub priority: Priority,
    /// Its team, if its share is a part of one (its own `share` is then replaced by its
    /// part of the team's).
    pub team: Option<Team>,
    /// Changes when the tenant's ledger is replaced: its readings start over (its virtual
    /// time is kept).
    pub incarnation: u64,
    /// Measured GPU time of its processes, ns (only grows within an incarnation).
    pub gpu_ns: u64,
    /// Their gated launches, counted as batches complete (only grows likewise).
    pub launches: u64,
    /// What its processes do (fresh stamps only, read at this tick's heartbeat).
    pub act: Activity,
}

/// What the caller writes back for one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub id: TenantId,
    /// `TURN_OPEN`, `TURN_CORUN` or `TURN_CLOSED`.
    pub state: i64,
    /// The queue bound of each of its processes, ns.
    pub queue_ns: u64,
}

/// A turn granted at `at` to `to` on device `device`, after the turn that ended at
/// `ended.0` (of `ended.1`), for the switch-latency metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub device: u64,
    pub ended: Option<(u64, TenantId)>,
    pub at: u64,
    pub to: TenantId,
}

/// A tick's result.
#[derive(Debug, Default)]
pub struct Outcome {
    /// One per tenant observed.
    pub decisions: Vec<Decision>,
    /// Tenants no longer observed (gone, or no longer gated): their turn is to be opened
    /// for good and their queue bound lifted.
    pub released: Vec<TenantId>,
    pub grants: Vec<Grant>,
}

/// A turn that just ended: the next waits until its tenant's work has drained (its shims
/// saw every batch complete) or the deadline passes.
#[derive(Clone, Copy)]
struct Drain {
    from: TenantId,
    started: u64,
    deadline: u64,
}

/// Per device: its virtual time, the turn in progress and the drain after the last one.
#[derive(Default)]
struct DeviceState {
    vtime: f64,
    holder: Option<TenantId>,
    draining: Option<Drain>,
    /// When the last turn ended and whose it was, until the next grant.
    ended: Option<(u64, TenantId)>,
    /// Turns, or open (`probe`).
    probe: probe::Probe,
}

/// Why a holder's turn ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Cap,
    Idle,
    Quantum,
    Priority,
}

/// The scheduler's state across ticks.
#[derive(Default)]
pub struct Scheduler {
    tenants: HashMap<TenantId, Tenant>,
    devices: HashMap<u64, DeviceState>,
    last_tick: Option<u64>,
    last_sample: u64,
    tuning: Tuning,
    /// Per device key: the time the driver saw it busy so far, ns ([`Scheduler::device_busy`]).
    busy: HashMap<u64, u64>,
}

impl Scheduler {
    pub fn new(tuning: Tuning) -> Scheduler {
        Scheduler {
            tuning,
            ..Scheduler::default()
        }
    }

    /// The driver's reading of a device's use (NVML's utilisation integrated over time by
    /// the caller: ns busy so far, only grows), for the open probe's idle gate
    /// ([`probe::IDLE_GATE`]); a device never given one is judged by its tenants' measured
    /// GPU time.
    pub fn device_busy(&mut self, device: u64, busy_ns: u64) {
        self.busy.insert(device, busy_ns);
    }

    /// One tick at `now` (ns of a monotonic clock) over this tick's observations.
    pub fn tick(&mut self, now: u64, observations: &[Observation]) -> Outcome {
        let dt = self.last_tick.map_or(0, |t| now.saturating_sub(t));
        self.last_tick = Some(now);
        let mut out = Outcome::default();
        self.discover(now, dt, observations, &mut out);
        split_teams(&mut self.tenants);
        let mut devices: Vec<u64> = self.tenants.values().map(|t| t.device).collect();
        devices.sort_unstable();
        devices.dedup();
        self.devices.retain(|d, _| devices.contains(d));
        for dev in devices {
            self.schedule(dev, now, dt, &mut out);
        }
        if now.saturating_sub(self.last_sample) >= SAMPLE_NS {
            self.last_sample = now;
            for t in self.tenants.values_mut() {
                t.record(now);
            }
        }
        out
    }

    /// Takes the observations: adds tenants seen for the first time (at their device's
    /// virtual time), updates the others, releases those not seen.
    fn discover(&mut self, now: u64, dt: u64, observations: &[Observation], out: &mut Outcome) {
        for t in self.tenants.values_mut() {
            t.seen = false;
        }
        for o in observations {
            if !(gated(o.share) || gated(o.cap)) || o.device == 0 {
                continue;
            }
            let v = self.devices.get(&o.device).map_or(0.0, |d| d.vtime);
            let t = self
                .tenants
                .entry(o.id)
                .or_insert_with(|| Tenant::new(o, v));
            if t.device != o.device || t.incarnation != o.incarnation {
                // Bound to another device, or its ledger was replaced: start over (level).
                let v = self.devices.get(&o.device).map_or(0.0, |d| d.vtime);
                *t = Tenant::new(o, v.max(t.vtime));
            }
            t.observe(o, now, dt as i64);
            t.seen = true;
        }
        let gone: Vec<TenantId> = self
            .tenants
            .iter()
            .filter(|(_, t)| !t.seen)
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.tenants.remove(&k);
            for d in self.devices.values_mut() {
                if d.holder == Some(k) {
                    d.holder = None;
                    d.ended = Some((now, k));
                }
                if d.draining.is_some_and(|x| x.from == k) {
                    d.draining = None;
                }
            }
            out.released.push(k);
        }
    }

    /// Decides the turn on one device.
    fn schedule(&mut self, device: u64, now: u64, dt: u64, out: &mut Outcome) {
        let tuning = self.tuning;
        let mut ids: Vec<TenantId> = self
            .tenants
            .iter()
            .filter(|(_, t)| t.device == device)
            .map(|(k, _)| *k)
            .collect();
        ids.sort_unstable();
        let tenants = &mut self.tenants;
        let dev = self.devices.entry(device).or_default();
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
                tracing::debug!(
                    cgroup_id = k.0,
                    device = k.1,
                    "compute: co-running tenant back to turns"
                );
            }
        }
        let busy = self.busy.get(&device).copied();
        if tuning.open && run_open(tenants, &ids, dev, now, busy) {
            // Open: everybody launches whenever it has work; the driver time-slices.
            if let Some(h) = dev.holder.take() {
                let t = tenants.get_mut(&h).expect("holder");
                if let Some(held) = t.held.take() {
                    t.stats.turn_ns += now.saturating_sub(held.granted);
                }
                dev.ended = Some((now, h));
            }
            dev.draining = None;
            for k in &ids {
                let t = &tenants[k];
                out.decisions.push(Decision {
                    id: *k,
                    state: TURN_CORUN,
                    queue_ns: t.queue_bound(tuning.open_queue_ns, tuning.queue_scale),
                });
            }
            return;
        }
        place(tenants, &ids, dev);
        // The holder: charge its turn, end it when due.
        if let Some(h) = dev.holder {
            let end = holder_end(tenants, &ids, h, now, dev.vtime, tuning.round_ns);
            let rival = !tuning.whole_quanta && rival_waits(tenants, &ids, h);
            let t = tenants.get_mut(&h).expect("holder");
            let held = t.held.expect("a holder holds a turn");
            if !held.pending {
                t.charge(dt, DUTY_SAMPLE_NS, held.launched);
            }
            if let Some(why) = end {
                match why {
                    End::Cap => t.stats.ended_cap += 1,
                    End::Idle => t.stats.ended_idle += 1,
                    End::Quantum => t.stats.ended_quantum += 1,
                    End::Priority => t.stats.ended_priority += 1,
                }
                t.stats.turn_ns += now.saturating_sub(held.granted);
                tracing::trace!(
                    cgroup_id = h.0,
                    held_us = now.saturating_sub(held.granted) / 1000,
                    why = ?why,
                    queued_us = t.act.queued_ns.max(0) / 1000,
                    inflight = t.act.inflight,
                    active = t.act.active,
                    "compute: turn ends"
                );
                t.held = None;
                dev.holder = None;
                dev.ended = Some((now, h));
                let queued = t.act.queued_ns.max(0) as u64;
                let wait = (queued + queued / 2 + 1_000_000).min(MAX_DRAIN_NS);
                dev.draining = Some(Drain {
                    from: h,
                    started: now,
                    deadline: now + wait,
                });
            } else if !held.pending
                && now.saturating_sub(held.since) >= t.quantum(tuning.round_ns)
                && !rival
            {
                // Alone (or everybody else is capped out): the turn goes on, a new quantum.
                // With a rival waiting that is still ahead of the holder in virtual time,
                // the quantum is not renewed: the turn ends at the first tick the rival is
                // level (`holder_end`), not a whole quantum later.
                t.held = Some(Held { since: now, ..held });
            }
        }
        // The drain: the previous holder's queued work still runs on the device, so the
        // device time is still its own (charged), and the next turn waits for it.
        if let Some(d) = dev.draining {
            let drained = match tenants.get_mut(&d.from) {
                None => true,
                Some(t) => {
                    t.charge(dt, DUTY_SAMPLE_NS, true);
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
                    t.competing = false;
                    tracing::debug!(
                        cgroup_id = d.from.0,
                        device = d.from.1,
                        duty = t.duty,
                        "compute: latency-bound tenant co-runs"
                    );
                }
            }
        }
        let draining = dev.draining.map(|d| d.from);
        if dev.holder.is_none()
            && (draining.is_none() || tuning.overlap)
            && let Some(n) = next_turn(tenants, &ids, draining, dev.vtime)
        {
            let t = tenants.get_mut(&n).expect("tenant");
            t.held = Some(Held {
                since: now,
                granted: now,
                launched: false,
                pending: draining.is_some(),
            });
            t.competing = true;
            t.stats.turns += 1;
            tracing::trace!(
                cgroup_id = n.0,
                pending = draining.is_some(),
                "compute: turn granted"
            );
            dev.holder = Some(n);
            out.grants.push(Grant {
                device,
                ended: dev.ended.take(),
                at: now,
                to: n,
            });
        }
        // The decisions: the holder's turn open, co-runners beside it, everybody else
        // closed; small queues while anyone co-runs.
        let corun = ids.iter().any(|k| tenants[k].mode == Mode::CoRun);
        let base = if corun {
            CORUN_QUEUE_NS.min(tuning.queue_ns)
        } else {
            tuning.queue_ns
        };
        for k in &ids {
            let t = &tenants[k];
            let state = if Some(*k) == dev.holder {
                TURN_OPEN
            } else if t.mode == Mode::CoRun {
                TURN_CORUN
            } else {
                TURN_CLOSED
            };
            out.decisions.push(Decision {
                id: *k,
                state,
                queue_ns: t.queue_bound(base, tuning.queue_scale && !corun),
            });
        }
    }

    /// The tenants, for status and the debug log.
    pub fn tenants(&self) -> impl Iterator<Item = (&TenantId, &Tenant)> {
        self.tenants.iter()
    }

    /// One tenant.
    pub fn tenant(&self, id: &TenantId) -> Option<&Tenant> {
        self.tenants.get(id)
    }

    /// Takes a tenant's statistics at a debug log line (returns those of the last one).
    pub fn log_mark(&mut self, id: &TenantId) -> Option<(TurnStats, TurnStats)> {
        let t = self.tenants.get_mut(id)?;
        let last = t.logged;
        t.logged = t.stats;
        Some((t.stats, last))
    }

    /// Whether the device of key `device` runs open now, and its probe's figures.
    pub fn probe_of(&self, device: u64) -> Option<(bool, probe::ProbeStats)> {
        let d = self.devices.get(&device)?;
        Some((d.probe.is_open(), d.probe.stats))
    }

    /// Whether any device is gated (the controller ticks fast then).
    pub fn busy(&self) -> bool {
        !self.tenants.is_empty()
    }
}

/// Teams: each member's share is its part of its team's share on its device, by weight,
/// among the members using the device (waiting, launching, with work in flight, holding a
/// turn or co-running); a member that uses it alone gets the whole team share, one that
/// stops leaves its part to the others at once. When no member uses the device, each gets
/// its part among all (for status).
fn split_teams(tenants: &mut HashMap<TenantId, Tenant>) {
    let using = |t: &Tenant| t.act.active > 0 || t.held.is_some();
    // (team, device) -> (weight of members using the device, weight of all members).
    let mut sums: HashMap<(u64, u64), (u64, u64)> = HashMap::new();
    for t in tenants.values() {
        if let Some(team) = t.team {
            let e = sums.entry((team.id, t.device)).or_default();
            let w = u64::from(team.weight);
            e.1 += w;
            if using(t) {
                e.0 += w;
            }
        }
    }
    for t in tenants.values_mut() {
        let Some(team) = t.team else {
            continue;
        };
        let (active, all) = sums[&(team.id, t.device)];
        let total = if using(t) && active > 0 { active } else { all };
        let part = u64::from(team.share) * u64::from(team.weight) / total.max(1);
        t.share = (part as u32).clamp(1, team.share.max(1));
    }
}

/// Asks the device's probe whether it runs open at `now` ([`probe`]); levels its tenants
/// at the device's virtual time when it goes back to turns (open, nobody's virtual time
/// moved: turns start over even).
fn run_open(
    tenants: &mut HashMap<TenantId, Tenant>,
    ids: &[TenantId],
    dev: &mut DeviceState,
    now: u64,
    busy_ns: Option<u64>,
) -> bool {
    let members: Vec<probe::Member> = ids
        .iter()
        .filter(|k| {
            let t = &tenants[*k];
            t.act.active > 0 || t.held.is_some()
        })
        .map(|k| {
            let t = &tenants[k];
            probe::Member {
                id: *k,
                launches: t.launches,
                gpu_ns: t.last_gpu,
                may_open: t.priority == Priority::Normal && !t.capped(),
            }
        })
        .collect();
    let open = dev.probe.step(now, &members, busy_ns);
    if dev.probe.take_closed() {
        tracing::debug!(stats = ?dev.probe.stats, "compute: device back to turns");
        for k in ids {
            let t = tenants.get_mut(k).expect("tenant");
            t.vtime = dev.vtime;
            t.competing = false;
        }
    }
    open
}

/// The priority class a tenant competes in now: `high` counts as high only within its
/// share (at most a quantum ahead of the device's virtual time `v`).
fn class(t: &Tenant, v: f64) -> u8 {
    match t.priority {
        Priority::High if t.vtime <= v + LAG_NS => 0,
        Priority::High | Priority::Normal => 1,
        Priority::Low => 2,
    }
}

/// Bounded lag: moves the device's virtual time up to the least of its competing tenants'
/// (of the best class competing: a starved `low` tenant does not hold it back), places every
/// tenant that starts competing at it, and keeps everybody within [`LAG_NS`] behind it.
fn place(tenants: &mut HashMap<TenantId, Tenant>, ids: &[TenantId], dev: &mut DeviceState) {
    let competes: Vec<(TenantId, bool)> = ids
        .iter()
        .map(|k| {
            let t = &tenants[k];
            (*k, t.competes())
        })
        .collect();
    // Incumbents: competing now and at the last tick.
    let incumbents = competes
        .iter()
        .filter(|(k, c)| *c && tenants[k].competing)
        .map(|(k, _)| &tenants[k]);
    let best = incumbents
        .clone()
        .map(|t| t.priority.max(Priority::Normal))
        .min();
    let least = incumbents
        .filter(|t| Some(t.priority.max(Priority::Normal)) == best)
        .map(|t| t.vtime)
        .fold(f64::INFINITY, f64::min);
    if least.is_finite() && least > dev.vtime {
        dev.vtime = least;
    }
    let floor = dev.vtime - LAG_NS;
    for (k, c) in competes {
        let t = tenants.get_mut(&k).expect("tenant");
        let at = if c && !t.competing { dev.vtime } else { floor };
        if t.place(at) {
            tracing::trace!(
                cgroup_id = k.0,
                starts = c && !t.competing,
                "compute: placed at the device's virtual time"
            );
        }
        t.competing = c;
    }
}

/// Whether (and why) holder `h`'s turn ends at this tick, on a device of virtual time `v`.
fn holder_end(
    tenants: &HashMap<TenantId, Tenant>,
    ids: &[TenantId],
    h: TenantId,
    now: u64,
    v: f64,
    round_ns: i64,
) -> Option<End> {
    let t = &tenants[&h];
    let held = t.held?;
    if held.pending {
        // Its clock starts when the drain before it ends.
        return None;
    }
    if !t.eligible() {
        return Some(End::Cap);
    }
    if t.idle_in_turn(now, IDLE_NS, MAX_DRAIN_NS) {
        return Some(End::Idle);
    }
    // Fairness classes: high and normal share the device by their shares, low gets what
    // they leave; a high tenant within its share also comes first.
    let held_ns = now.saturating_sub(held.since);
    let mut urgent = false;
    let mut due = false;
    for o in ids.iter().filter(|k| **k != h).map(|k| &tenants[k]) {
        if !waits_for_turn(o) {
            continue;
        }
        urgent |= class(o, v) < class(t, v);
        due |= fair(o) <= fair(t) && o.vtime <= t.vtime;
    }
    if urgent && held_ns >= MIN_QUANTUM_NS as u64 {
        return Some(End::Priority);
    }
    (due && held_ns >= t.quantum(round_ns)).then_some(End::Quantum)
}

/// Fairness classes: `high` and `normal` share the device by their shares, `low` gets what
/// they leave.
fn fair(t: &Tenant) -> u8 {
    u8::from(t.priority == Priority::Low)
}

/// Whether `t` waits for a turn it may take now.
fn waits_for_turn(t: &Tenant) -> bool {
    t.mode == Mode::Turns && t.waiting() && t.may_start()
}

/// Whether anybody of holder `h`'s fairness class (or a better one) waits for a turn, ahead
/// of it in virtual time or not.
fn rival_waits(tenants: &HashMap<TenantId, Tenant>, ids: &[TenantId], h: TenantId) -> bool {
    let t = &tenants[&h];
    ids.iter()
        .filter(|k| **k != h)
        .map(|k| &tenants[k])
        .any(|o| waits_for_turn(o) && fair(o) <= fair(t))
}

/// The next turn on a device of virtual time `v`: the waiting tenant of the best class, and
/// within it the furthest behind (the one draining excepted).
fn next_turn(
    tenants: &HashMap<TenantId, Tenant>,
    ids: &[TenantId],
    draining: Option<TenantId>,
    v: f64,
) -> Option<TenantId> {
    ids.iter()
        .filter(|k| {
            let t = &tenants[*k];
            Some(**k) != draining && waits_for_turn(t)
        })
        .min_by(|a, b| {
            let (ta, tb) = (&tenants[*a], &tenants[*b]);
            class(ta, v)
                .cmp(&class(tb, v))
                .then(ta.vtime.total_cmp(&tb.vtime))
        })
        .copied()
}
