//! One gated (cgroup, device) — a *tenant* — as the controller keeps it across ticks: what
//! its processes do (read from the ledger each tick, see `Ledger::activity`), its virtual
//! time, its cap's bucket, its mode (turns or co-running) and its history for status.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use fgpu_common::ledger::DeviceTurn;
use fgpu_common::ledger::compute::Activity;

use super::{ACHIEVED_OVER, FRESH_BEATS, MIN_QUANTUM_NS, WINDOW_NS};
use crate::agent::ledgers::CgroupLedger;

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
    /// Whether a launch was seen in it yet.
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
}

pub struct Tenant {
    pub ledger: Arc<CgroupLedger>,
    pub idx: usize,
    /// The device's key (UUID hash) the record is bound to.
    pub device: u64,
    pub share: u32,
    pub cap: u32,
    /// Measured GPU time at the last tick (the ledger's `gpu_ns`).
    pub last_gpu: u64,
    /// Device time held in turns / weight: the next turn goes to the waiting tenant furthest
    /// behind.
    pub vtime: f64,
    /// A cap's bucket of measured GPU time, ns.
    pub tokens: i64,
    /// Since its last turn began: measured GPU time, device time held (the turn and its
    /// drain), and what its cap's bucket was charged — the smaller of the two.
    cap_gpu: u64,
    cap_held: u64,
    cap_charged: u64,
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
    pub fn new(ledger: Arc<CgroupLedger>, idx: usize, device: u64, vtime: f64) -> Tenant {
        let gpu = ledger.ledger().usage.compute[idx].gpu_ns.load(SeqCst);
        Tenant {
            ledger,
            idx,
            device,
            share: 0,
            cap: 0,
            last_gpu: gpu,
            vtime,
            tokens: 0,
            cap_gpu: 0,
            cap_held: 0,
            cap_charged: 0,
            act: Activity::default(),
            launch_beat: 0,
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

    pub fn turn(&self) -> &DeviceTurn {
        self.ledger.ledger().turn(self.idx)
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

    /// May get the device now (a cap's bucket is not empty).
    pub fn eligible(&self) -> bool {
        !self.capped() || self.tokens > 0
    }

    pub fn waiting(&self) -> bool {
        self.act.waiting > 0
    }

    /// The length of its turn in a round of `round_ns`, ns of device time.
    pub fn quantum(&self, round_ns: i64) -> u64 {
        let q = (round_ns as f64 * self.weight() / 100.0) as i64;
        q.max(MIN_QUANTUM_NS) as u64
    }

    /// Reads the ledger at tick time `now` (`dt` since the last tick): measured time, the
    /// cap's bucket, what its processes do. Bumps the device's heartbeat.
    pub fn observe(&mut self, now: u64, dt: i64) {
        let beat = self.turn().heartbeat.fetch_add(1, SeqCst) + 1;
        self.act = self.ledger.ledger().activity(self.idx, beat, FRESH_BEATS);
        let gpu = self.ledger.ledger().usage.compute[self.idx]
            .gpu_ns
            .load(SeqCst);
        let delta = gpu.saturating_sub(self.last_gpu);
        self.last_gpu = gpu;
        if self.mode == Mode::Turns {
            // Taking turns, all it runs runs in its turns (measured a little later).
            self.duty_gpu = self.duty_gpu.saturating_add(delta);
        }
        if self.capped() {
            let burst = WINDOW_NS * i64::from(self.cap) / 100;
            self.tokens = (self.tokens + dt * i64::from(self.cap) / 100).min(burst);
            if self.mode == Mode::CoRun {
                self.tokens -= delta.min(i64::MAX as u64) as i64;
            } else {
                self.cap_gpu = self.cap_gpu.saturating_add(delta);
                self.settle_cap();
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
    /// its turn is granted). Several
    /// processes of one container share its turn, and the driver time-slices their contexts:
    /// each batch's events then span the others' work too, so each process's estimates grow
    /// about N-fold and an unscaled bound left each of them about 1/N of its real work
    /// queued — on the H200 the processes of a 2-process ResNet container spent ~10% of their
    /// turns waiting for their oldest batch (`sync_ms`), where one process alone spent none.
    /// Scaled, the container's real queued work stays about N × base; the drain after its
    /// turn is bounded by the controller's deadline whatever the pages say, and a container
    /// forging launch stamps in many slots gains at most the cap.
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

    /// Not using the device at all (for the no-banking rule): no turn, nobody waiting (fresh
    /// stamps only), no launch and no measured time for `idle_ns`. Work its page still counts
    /// as queued does not make it busy: a process SIGSTOPped or frozen (`docker pause`) with
    /// batches in flight keeps its count, and so can a forged page — counted as busy, its
    /// virtual time fell behind for as long as it stood still, and once resumed it held the
    /// device until it caught up (1.5 s of a 1.5 s freeze, on the simulator). While its last
    /// turn's work drains it is charged the drain, so keeping it level changes nothing then.
    pub fn idle(&self, now: u64, idle_ns: u64) -> bool {
        self.held.is_none()
            && !self.waiting()
            && self.mode == Mode::Turns
            && now.saturating_sub(self.launch_at) >= idle_ns
    }

    /// Charges `dt` of device time it held (in a turn or its drain): virtual time, the
    /// status total (`turn_total`), and the duty sample (taken every `sample_ns` of turn time).
    pub fn charge(&mut self, dt: u64, sample_ns: u64) {
        self.vtime += dt as f64 / self.weight();
        self.cap_held = self.cap_held.saturating_add(dt);
        self.settle_cap();
        self.turn_total += dt;
        self.duty_turn += dt;
        if self.duty_turn >= sample_ns {
            let sample = (self.duty_gpu as f64 / self.duty_turn as f64).min(1.0);
            self.duty = 0.5 * self.duty + 0.5 * sample;
            (self.duty_turn, self.duty_gpu) = (0, 0);
        }
    }

    /// A turn begins: its cap is charged afresh ([`settle_cap`](Self::settle_cap)).
    pub fn begin_turn(&mut self) {
        (self.cap_gpu, self.cap_held, self.cap_charged) = (0, 0, 0);
    }

    /// Charges a cap's bucket, taking turns, with the smaller of the measured GPU time and
    /// the device time held since its turn began. Measured time alone overstates a
    /// container with several processes: each batch's events span the others' work too
    /// (two saturating processes capped at 30 on the simulator got 19.6% together); held
    /// time alone would charge a single process its grant latencies too (23% at a 30 cap).
    fn settle_cap(&mut self) {
        if !self.capped() {
            return;
        }
        let c = self.cap_gpu.min(self.cap_held);
        self.tokens -= c.saturating_sub(self.cap_charged).min(i64::MAX as u64) as i64;
        self.cap_charged = self.cap_charged.max(c);
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
