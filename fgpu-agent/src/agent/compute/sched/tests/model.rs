//! A device and its tenants' processes in simulated time, for the scheduler's tests.
//!
//! The device runs submitted kernels one after another in submission order (a gated device
//! has one holder's work at a time; co-runners' kernels interleave with it), every tenant's
//! measured GPU time being the device time its kernels ran. A process does what the shim
//! makes a real one do: it launches only while its turn is open (or co-run) and its queued
//! estimate is under the queue bound the scheduler wrote; otherwise it waits, re-stamping
//! its waiting stamp with the controller's heartbeat at every look. A stopped process stamps
//! nothing; a killed one's slot is cleared at once (its queued kernels still run). The
//! scheduler is ticked every [`TICK_NS`] with observations built from these pages exactly as
//! `Ledger::activity` builds them (stamps fresh for `FRESH_BEATS`).

use std::collections::VecDeque;

use fgpu_common::ledger::compute::{Activity, TURN_CLOSED, TURN_OPEN};

use super::super::{FRESH_BEATS, Observation, Priority, Scheduler, Team, Tuning, gated};

/// The model's step, ns.
pub const STEP_NS: u64 = 50_000;
/// The controller's tick, ns (as `TICK`).
pub const TICK_NS: u64 = 500_000;
pub const MS: u64 = 1_000_000;

/// What a process does, phase by phase.
#[derive(Debug, Clone, Copy)]
pub enum Work {
    /// A GPU-bound loop: kernels of this length back to back, as many queued as allowed.
    Saturate { kernel: u64 },
    /// A step loop: `host` ns of CPU, then one kernel of `kernel` ns; with `sync` the next
    /// step's host time starts when the kernel completed (`loss.item()`, a decoder's token).
    Steps { kernel: u64, host: u64, sync: bool },
    /// Nothing (the process sleeps).
    Idle,
}

#[derive(Debug, Clone)]
pub struct Proc {
    /// (from ns, work) phases, in order.
    phases: Vec<(u64, Work)>,
    start: u64,
    stopped: Vec<(u64, u64)>,
    killed: Option<u64>,
    /// CPU time left before the next launch.
    host_left: u64,
    /// Waiting for its last kernel to complete (a synchronising step loop).
    syncing: bool,
    wait_beat: u64,
    launch_beat: u64,
    /// Its kernels not yet complete: (id, est ns).
    inflight: VecDeque<(u64, u64)>,
    /// When its last kernel completed (event timing starts a batch there or at its submit).
    last_done: u64,
}

impl Proc {
    pub fn new(work: Work) -> Proc {
        Proc {
            phases: vec![(0, work)],
            start: 0,
            stopped: Vec::new(),
            killed: None,
            host_left: 0,
            syncing: false,
            wait_beat: 0,
            launch_beat: 0,
            inflight: VecDeque::new(),
            last_done: 0,
        }
    }

    /// Starts at `ms`.
    pub fn from(mut self, ms: u64) -> Proc {
        self.start = ms * MS;
        self
    }

    /// Does `work` from `ms` on.
    pub fn then(mut self, ms: u64, work: Work) -> Proc {
        self.phases.push((ms * MS, work));
        self
    }

    /// SIGSTOPped from `from_ms` to `to_ms`.
    pub fn stopped(mut self, from_ms: u64, to_ms: u64) -> Proc {
        self.stopped.push((from_ms * MS, to_ms * MS));
        self
    }

    /// SIGKILLed at `ms`.
    pub fn killed(mut self, ms: u64) -> Proc {
        self.killed = Some(ms * MS);
        self
    }

    fn alive(&self, now: u64) -> bool {
        now >= self.start && self.killed.is_none_or(|k| now < k)
    }

    fn running(&self, now: u64) -> bool {
        self.alive(now) && !self.stopped.iter().any(|&(a, b)| now >= a && now < b)
    }

    fn work(&self, now: u64) -> Work {
        self.phases
            .iter()
            .rev()
            .find(|(at, _)| now >= *at)
            .map_or(Work::Idle, |(_, w)| *w)
    }
}

pub struct TenantModel {
    pub share: u32,
    pub cap: u32,
    pub priority: Priority,
    /// Its team, if its share is part of one (the scheduler splits the team's share).
    pub team: Option<Team>,
    pub procs: Vec<Proc>,
    /// The turn state and queue bound the scheduler last wrote.
    state: i64,
    queue_ns: u64,
    /// Device time its kernels ran, ns.
    pub gpu_ns: u64,
    /// Kernels it launched.
    pub launches: u64,
    /// GPU time as the shim measures it (events around each batch: from its submission, or
    /// the completion of the stream's previous batch, to its completion — time spent behind
    /// another tenant's work included), ns: what the scheduler is told.
    pub measured_ns: u64,
    /// (time, gpu_ns) every 10 ms.
    samples: Vec<(u64, u64)>,
}

pub struct Sim {
    pub sched: Scheduler,
    pub tenants: Vec<TenantModel>,
    /// Submitted kernels not yet run: (tenant, proc, id, left ns, submitted at).
    device: VecDeque<(usize, usize, u64, u64, u64)>,
    now: u64,
    beat: u64,
    next_id: u64,
}

/// The device key every tenant of the model is bound to.
pub const DEVICE: u64 = 0xd00d;

impl Sim {
    pub fn new() -> Sim {
        Sim::with(Tuning::default())
    }

    pub fn with(tuning: Tuning) -> Sim {
        Sim {
            sched: Scheduler::new(tuning),
            tenants: Vec::new(),
            device: VecDeque::new(),
            now: 0,
            beat: 0,
            next_id: 1,
        }
    }

    /// Adds a tenant (share, cap, priority) of these processes; returns its index.
    pub fn tenant(&mut self, share: u32, cap: u32, priority: Priority, procs: Vec<Proc>) -> usize {
        self.tenants.push(TenantModel {
            share,
            cap,
            priority,
            team: None,
            procs,
            // An ungated tenant is never decided for: its launches run.
            state: if gated(share) || gated(cap) {
                TURN_CLOSED
            } else {
                TURN_OPEN
            },
            queue_ns: 0,
            gpu_ns: 0,
            launches: 0,
            measured_ns: 0,
            samples: vec![(0, 0)],
        });
        self.tenants.len() - 1
    }

    /// Runs until `ms`.
    pub fn run_until(&mut self, ms: u64) {
        let end = ms * MS;
        while self.now < end {
            if self.now.is_multiple_of(TICK_NS) {
                self.tick();
            }
            self.step();
            self.now += STEP_NS;
            if self.now.is_multiple_of(10 * MS) {
                for t in &mut self.tenants {
                    t.samples.push((self.now, t.gpu_ns));
                }
            }
        }
    }

    /// The controller's tick: observations from the pages, decisions back into them.
    fn tick(&mut self) {
        self.beat += 1;
        let (now, beat) = (self.now, self.beat);
        let fresh = |b: u64| b != 0 && b <= beat && beat - b <= FRESH_BEATS;
        let obs: Vec<Observation> = self
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut a = Activity::default();
                for p in t.procs.iter().filter(|p| p.alive(now)) {
                    let inflight = p.inflight.len() as i64;
                    a.waiting += u32::from(fresh(p.wait_beat));
                    a.last_launch = a.last_launch.max(p.launch_beat);
                    if fresh(p.launch_beat) || fresh(p.wait_beat) || inflight > 0 {
                        a.active += 1;
                    }
                    a.inflight += inflight;
                    a.queued_ns += p.inflight.iter().map(|k| k.1 as i64).sum::<i64>();
                }
                Observation {
                    id: (i as u64 + 1, 0),
                    device: DEVICE,
                    share: t.share,
                    cap: t.cap,
                    priority: t.priority,
                    team: t.team,
                    incarnation: 1,
                    gpu_ns: t.measured_ns,
                    launches: t.launches,
                    act: a,
                }
            })
            .collect();
        let out = self.sched.tick(now, &obs);
        for d in out.decisions {
            let t = &mut self.tenants[d.id.0 as usize - 1];
            (t.state, t.queue_ns) = (d.state, d.queue_ns);
        }
    }

    /// One step: the device runs, the processes launch or wait.
    fn step(&mut self) {
        let mut budget = STEP_NS;
        while budget > 0 {
            let Some(head) = self.device.front_mut() else {
                break;
            };
            let ran = head.3.min(budget);
            head.3 -= ran;
            budget -= ran;
            let (ti, pi, id) = (head.0, head.1, head.2);
            self.tenants[ti].gpu_ns += ran;
            if head.3 == 0 {
                let submitted = head.4;
                self.device.pop_front();
                let done = self.now + (STEP_NS - budget);
                let t = &mut self.tenants[ti];
                let p = &mut t.procs[pi];
                t.measured_ns += done.saturating_sub(submitted.max(p.last_done));
                p.last_done = done;
                p.inflight.retain(|k| k.0 != id);
                if p.inflight.is_empty() {
                    p.syncing = false;
                }
            }
        }
        let (now, beat) = (self.now, self.beat);
        for ti in 0..self.tenants.len() {
            for pi in 0..self.tenants[ti].procs.len() {
                self.step_proc(ti, pi, now, beat);
            }
        }
    }

    fn step_proc(&mut self, ti: usize, pi: usize, now: u64, beat: u64) {
        let t = &mut self.tenants[ti];
        let (open, queue) = (t.state > 0, t.queue_ns);
        let p = &mut t.procs[pi];
        if let Some(k) = p.killed
            && now >= k
        {
            // The agent's reaper clears the slot; what it queued still runs.
            (p.wait_beat, p.launch_beat) = (0, 0);
            p.inflight.clear();
            return;
        }
        if !p.running(now) {
            return;
        }
        let (kernel, again, sync) = match p.work(now) {
            Work::Idle => {
                p.wait_beat = 0;
                return;
            }
            Work::Saturate { kernel } => (kernel, 0, false),
            Work::Steps { kernel, host, sync } => {
                if p.syncing {
                    return;
                }
                if p.host_left > 0 {
                    p.host_left = p.host_left.saturating_sub(STEP_NS);
                    return;
                }
                (kernel, host, sync)
            }
        };
        if !open {
            p.wait_beat = beat.max(1);
            return;
        }
        p.wait_beat = 0;
        let queued: u64 = p.inflight.iter().map(|k| k.1).sum();
        let bound = if queue == 0 { 4 * MS } else { queue };
        if queued >= bound {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        p.inflight.push_back((id, kernel));
        p.launch_beat = beat.max(1);
        p.host_left = again;
        p.syncing = sync;
        self.device.push_back((ti, pi, id, kernel, now));
        self.tenants[ti].launches += 1;
    }

    /// Tenant `t`'s device time, percent of wall time, over [from_ms, to_ms).
    pub fn pct(&self, t: usize, from_ms: u64, to_ms: u64) -> f64 {
        let s = &self.tenants[t].samples;
        let at = |ms: u64| {
            s.iter()
                .rev()
                .find(|(n, _)| *n <= ms * MS)
                .map_or(0, |(_, g)| *g)
        };
        (at(to_ms) - at(from_ms)) as f64 * 100.0 / ((to_ms - from_ms) * MS) as f64
    }

    /// Tenant `t`'s share in each `window_ms` window of [from_ms, to_ms).
    pub fn windows(&self, t: usize, from_ms: u64, to_ms: u64, window_ms: u64) -> Vec<f64> {
        (from_ms..to_ms)
            .step_by(window_ms as usize)
            .filter(|w| w + window_ms <= to_ms)
            .map(|w| self.pct(t, w, w + window_ms))
            .collect()
    }
}

/// Formats windows for a failure message.
pub fn show(w: &[f64]) -> String {
    w.iter()
        .map(|x| format!("{x:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}
