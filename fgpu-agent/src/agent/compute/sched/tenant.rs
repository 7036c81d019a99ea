//! One gated (cgroup, device) — a *tenant* — as the scheduler keeps it across ticks: what its
//! processes did at the last observation, its virtual time, its cap's bucket, its mode (turns
//! or co-running) and its history for status. Nothing here reads a clock or a ledger: every
//! method takes the tick's time and the tick's observation.

use std::collections::VecDeque;

use fgpu_common::ledger::compute::Activity;

use super::{ACHIEVED_OVER, MIN_QUANTUM_NS, Observation, Priority, Team, WINDOW_NS};

/// The most a container's active processes scale its per-process queue bound by.
pub const MAX_QUEUE_SCALE: u32 = 4;

/// How a tenant gets the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// It takes turns: alone on the device while it holds one.
    Turns,
    /// It runs beside the holder whenever it has work (a latency-bound tenant below its
    /// share: its turns left the device mostly idle).
    CoRun,
}

/// The turn a tenant holds.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    /// When it was granted (or last rolled over), ns.
    pub since: u64,
    /// When it was granted, ns (for the statistics).
    pub granted: u64,
    /// Whether a launch was seen in it yet (a cap is charged from then on: the wake-up of a
    /// process waiting for the grant is not the tenant's device time).
    pub launched: bool,
    /// Opened while the previous holder's work still drains: its processes may launch (the
    /// work queues behind the drain), but its clock starts when the drain ends.
    pub pending: bool,
}

/// How a tenant's turns went (only grows; logged as deltas, read by status and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TurnStats {
    /// Turns granted.
    pub turns: u64,
    /// Turns ended at their quantum because somebody else waited.
    pub ended_quantum: u64,
    /// Turns given up unused (the idle rule).
    pub ended_idle: u64,
    /// Turns ended by an empty cap bucket.
    pub ended_cap: u64,
    /// Turns ended early for a tenant of a higher priority class.
    pub ended_priority: u64,
    /// Time from grant to the end of its turns, ns.
    pub turn_ns: u64,
    /// Time its drains took after its turns, ns, and how many ended at their deadline
    /// (its shims did not report the work complete in time).
    pub drain_ns: u64,
    pub drain_deadline: u64,
    /// Time from a grant to the first launch seen in that turn, ns (wake-up and host time).
    pub first_launch_ns: u64,
    /// Time it waited for a turn while another tenant's drain ran, ns (switch latency).
    pub switch_wait_ns: u64,
    /// Times it was placed forward to the device's virtual time (joining, waking, or past
    /// the lag bound), and the virtual time it lost so, ns of its own device time.
    pub placed: u64,
    pub placed_ns: u64,
}

pub struct Tenant {
    /// The device's key (UUID hash) the record is bound to.
    pub device: u64,
    pub share: u32,
    pub cap: u32,
    pub priority: Priority,
    /// Its team (its `share` is then its part of the team's, set every tick).
    pub team: Option<Team>,
    /// The observation's incarnation this state belongs to.
    pub incarnation: u64,
    /// Measured GPU time at the last tick (the ledger's `gpu_ns`).
    pub last_gpu: u64,
    /// Its launches so far (the ledger's `launches`).
    pub launches: u64,
    /// Device time held in turns (or measured while co-running) ÷ weight: the next turn goes
    /// to the waiting tenant furthest behind. Never more than one quantum behind the
    /// device's virtual time ([`super::Scheduler`]).
    pub vtime: f64,
    /// Whether it competed for the device at the last tick (held a turn, or waited for one
    /// it may have): a tenant that starts competing is placed at the device's virtual time.
    pub competing: bool,
    /// A cap's bucket of device time, ns.
    pub tokens: i64,
    /// This tick's view of its processes.
    pub act: Activity,
    /// The newest launch stamp seen, and when it (or measured GPU time) last moved, ns.
    pub launch_beat: u64,
    pub launch_at: u64,
    pub mode: Mode,
    /// Measured GPU time ÷ turn time over its recent turns (1: it keeps the device busy).
    pub duty: f64,
    /// Turn time and measured GPU time since the last duty sample.
    duty_turn: u64,
    duty_gpu: u64,
    pub held: Option<Held>,
    /// It may co-run from this time on (ns; a cool-down after it was sent back to turns).
    pub corun_after: u64,
    /// Device time held in turns, ns (only grows; for status).
    pub turn_total: u64,
    pub stats: TurnStats,
    /// The statistics at the last debug log line.
    pub logged: TurnStats,
    pub seen: bool,
    /// (tick time, gpu_ns, turn_total) samples for the achieved share and co-run usage.
    pub history: VecDeque<(u64, u64, u64)>,
}

impl Tenant {
    /// A tenant first observed as `o`, starting at virtual time `vtime`.
    pub fn new(o: &Observation, vtime: f64) -> Tenant {
        Tenant {
            device: o.device,
            share: o.share,
            cap: o.cap,
            priority: o.priority,
            team: o.team,
            incarnation: o.incarnation,
            last_gpu: o.gpu_ns,
            launches: o.launches,
            vtime,
            competing: false,
            tokens: 0,
            act: Activity::default(),
            launch_beat: o.act.last_launch,
            launch_at: 0,
            mode: Mode::Turns,
            duty: 1.0,
            duty_turn: 0,
            duty_gpu: 0,
            held: None,
            corun_after: 0,
            turn_total: 0,
            stats: TurnStats::default(),
            logged: TurnStats::default(),
            seen: true,
            history: VecDeque::new(),
        }
    }

    pub fn weight(&self) -> f64 {
        f64::from(if gated(self.share) {
            self.share
        } else {
            self.cap
        })
        .max(1.0)
    }

    pub fn capped(&self) -> bool {
        gated(self.cap)
    }

    /// May keep the device (a cap's bucket is not empty).
    pub fn eligible(&self) -> bool {
        !self.capped() || self.tokens > 0
    }

    /// May be granted a turn: a cap's bucket holds half its burst (a turn granted on the
    /// first token would end a tick later: the cap would go to grant and drain latencies).
    pub fn may_start(&self) -> bool {
        !self.capped() || self.tokens >= WINDOW_NS * i64::from(self.cap) / 200
    }

    pub fn waiting(&self) -> bool {
        self.act.waiting > 0
    }

    /// Competes for the device now: holds a turn, or waits for one it may have.
    pub fn competes(&self) -> bool {
        self.mode == Mode::Turns && (self.held.is_some() || (self.waiting() && self.may_start()))
    }

    /// The length of its turn in a round of `round_ns`, ns of device time.
    pub fn quantum(&self, round_ns: i64) -> u64 {
        let q = (round_ns as f64 * self.weight() / 100.0) as i64;
        q.max(MIN_QUANTUM_NS) as u64
    }

    /// Takes this tick's observation `o` at time `now` (`dt` since the last tick): measured
    /// time, the cap's bucket, what its processes do.
    pub fn observe(&mut self, o: &Observation, now: u64, dt: i64) {
        (self.share, self.cap, self.priority, self.team) = (o.share, o.cap, o.priority, o.team);
        self.act = o.act;
        self.launches = o.launches;
        let delta = o.gpu_ns.saturating_sub(self.last_gpu);
        self.last_gpu = o.gpu_ns;
        if self.mode == Mode::Turns {
            // Taking turns, all it runs runs in its turns (measured a little later).
            self.duty_gpu = self.duty_gpu.saturating_add(delta);
        }
        if self.capped() {
            let burst = WINDOW_NS * i64::from(self.cap) / 100;
            self.tokens = (self.tokens + dt * i64::from(self.cap) / 100).min(burst);
        }
        if self.mode == Mode::CoRun {
            // Beside the holder its device time is what it measured.
            self.vtime += delta as f64 / self.weight();
            if self.capped() {
                self.tokens -= delta.min(i64::MAX as u64) as i64;
            }
        }
        if self.act.last_launch != self.launch_beat || delta > 0 {
            self.launch_beat = self.act.last_launch;
            self.launch_at = now;
            if let Some(h) = self.held.as_mut()
                && !h.launched
                && !h.pending
            {
                h.launched = true;
                self.stats.first_launch_ns += now.saturating_sub(h.granted);
            }
        }
    }

    /// The queue bound for each of its processes, from the device's `base`: with `scale`,
    /// times its processes using the device (waiting, launching or with work in flight: at
    /// most [`MAX_QUEUE_SCALE`]; waiting ones count, so the bound is already scaled when
    /// its turn is granted). Several processes of one container share its turn, and the
    /// driver time-slices their contexts: each batch's events then span the others' work
    /// too, so each process's estimates grow about N-fold and an unscaled bound left each of
    /// them about 1/N of its real work queued — on the H200 the processes of a 2-process
    /// ResNet container spent ~10% of their turns waiting for their oldest batch
    /// (`sync_ms`), where one process alone spent none. Scaled, the container's real queued
    /// work stays about N × base; the drain after its turn is bounded by the controller's
    /// deadline whatever the pages say, and a container forging launch stamps in many slots
    /// gains at most the cap.
    pub fn queue_bound(&self, base: u64, scale: bool) -> u64 {
        queue_bound(base, self.act.active, scale)
    }

    /// Not using its turn: no launch and no measured time for `idle_ns` since it was granted
    /// — longer while it has work queued (its processes may be blocked in a synchronisation
    /// until that work has run): 1.5 × the queued estimate + 2 ms more, at most `max_ns`.
    /// Measured by the controller's clock, so a killed or stopped holder loses its turn
    /// within that bound whatever its page says.
    pub fn idle_in_turn(&self, now: u64, idle_ns: u64, max_ns: u64) -> bool {
        let since = self.held.map_or(0, |h| h.since);
        let grace = if self.act.inflight > 0 {
            let q = self.act.queued_ns.max(0) as u64;
            (idle_ns + q + q / 2 + 2_000_000).min(max_ns)
        } else {
            idle_ns
        };
        now.saturating_sub(self.launch_at.max(since)) >= grace
    }

    /// Charges `dt` of device time it held (in a turn or its drain): virtual time, the
    /// status total (`turn_total`), the duty sample (taken every `sample_ns` of turn time),
    /// and a cap's bucket once the turn saw its first launch (`for_cap`).
    pub fn charge(&mut self, dt: u64, sample_ns: u64, for_cap: bool) {
        self.vtime += dt as f64 / self.weight();
        if self.capped() && for_cap {
            self.tokens -= dt.min(i64::MAX as u64) as i64;
        }
        self.turn_total += dt;
        self.duty_turn += dt;
        if self.duty_turn >= sample_ns {
            let sample = (self.duty_gpu as f64 / self.duty_turn as f64).min(1.0);
            self.duty = 0.5 * self.duty + 0.5 * sample;
            (self.duty_turn, self.duty_gpu) = (0, 0);
        }
    }

    /// Moves its virtual time forward to `v` (never back); returns whether it moved.
    pub fn place(&mut self, v: f64) -> bool {
        if self.vtime >= v {
            return false;
        }
        self.stats.placed += 1;
        self.stats.placed_ns += ((v - self.vtime) * self.weight()) as u64;
        self.vtime = v;
        true
    }

    /// Starts over on duty (it co-ran, or comes back to turns).
    pub fn reset_duty(&mut self) {
        self.duty = 1.0;
        (self.duty_turn, self.duty_gpu) = (0, 0);
    }

    /// Measured GPU time over (at most) the last `ns`, percent of wall time.
    pub fn used_pct_over(&self, ns: u64) -> f64 {
        self.pct_over(ns, |&(_, g, _)| g)
    }

    /// Device time held in turns over (at most) the last `ns`, percent of wall time.
    pub fn turn_pct_over(&self, ns: u64) -> f64 {
        self.pct_over(ns, |&(_, _, t)| t)
    }

    fn pct_over(&self, ns: u64, pick: impl Fn(&(u64, u64, u64)) -> u64) -> f64 {
        let Some(last) = self.history.back() else {
            return 0.0;
        };
        let t1 = last.0;
        match self.history.iter().find(|s| t1 - s.0 <= ns) {
            Some(first) if t1 > first.0 => {
                pick(last).saturating_sub(pick(first)) as f64 * 100.0 / (t1 - first.0) as f64
            }
            _ => 0.0,
        }
    }

    /// Adds a history sample, keeping [`ACHIEVED_OVER`].
    pub fn record(&mut self, now: u64) {
        self.history
            .push_back((now, self.last_gpu, self.turn_total));
        let keep = ACHIEVED_OVER.as_nanos() as u64;
        while self
            .history
            .front()
            .is_some_and(|&(at, _, _)| now - at > keep)
        {
            self.history.pop_front();
        }
    }
}

pub fn gated(pct: u32) -> bool {
    (1..100).contains(&pct)
}

/// [`Tenant::queue_bound`] for a container with `active` processes.
fn queue_bound(base: u64, active: u32, scale: bool) -> u64 {
    let n = if scale {
        active.clamp(1, MAX_QUEUE_SCALE)
    } else {
        1
    };
    base.saturating_mul(u64::from(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_bound_grows_with_active_processes_up_to_the_cap() {
        let base = 4_000_000;
        assert_eq!(
            queue_bound(base, 0, true),
            base,
            "nobody active yet: the base"
        );
        assert_eq!(queue_bound(base, 1, true), base);
        assert_eq!(queue_bound(base, 2, true), 2 * base);
        assert_eq!(
            queue_bound(base, u32::MAX, true),
            u64::from(MAX_QUEUE_SCALE) * base,
            "forged stamps in every slot gain at most the cap"
        );
        assert_eq!(
            queue_bound(base, 3, false),
            base,
            "FGPU_COMPUTE_QUEUE_SCALE=0"
        );
        assert_eq!(queue_bound(u64::MAX, 2, true), u64::MAX, "no overflow");
    }
}
