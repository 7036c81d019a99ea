//! Turns or the driver's time-slicing: which serves a device's tenants better.
//!
//! Turns guarantee every tenant its share, but a holder that leaves the device idle — a
//! token-by-token decoder between its tokens, a training loop that waits for `loss.item()`
//! — wastes what the others could have run then. When its tenants are like that, a device
//! may serve everybody better *open*: every tenant launching whenever it has work, the
//! driver time-slicing their contexts (what they get without fgpu). The probe finds out by
//! measuring, not by guessing: on a device whose tenants have been the same for a while and
//! whose turns left it partly idle (the driver's device utilisation, NVML's, under the wall
//! time; where the driver gives none, their measured GPU time), it counts each tenant's
//! launches (its progress: a step loop launches the same kernels every step) over a window
//! of turns, a window open and a window of turns again (A-B-A: a host that takes CPU from a
//! launcher for a second moves one window, not the comparison), and keeps the device open
//! only if **every** tenant progressed at least about as fast open as in the better of its
//! two windows of turns, and they gained on the whole.
//! Open, each tenant's rate is checked every window against its rate in turns; the first
//! that falls behind closes the device again. A rejected trial is retried later and later.
//!
//! Launch counts are written by the tenants' shims, so a tenant can lie about its own
//! rate — which only moves its own vote: to keep a device open every tenant's rate must
//! hold, and a lie that closes it gives everyone their guaranteed turns. Capped tenants and
//! priority classes other than `normal` keep the device in turns (open, nothing would
//! enforce them).

use super::TenantId;

/// Each measured window (turns, then open; and open windows checked one by one).
pub const WINDOW_NS: u64 = 1_000_000_000;
/// The same tenants on the device for this long before a first trial.
pub const SETTLE_NS: u64 = 3_000_000_000;
/// A rejected trial is retried after this long, doubling up to [`MAX_BACKOFF_NS`].
pub const BACKOFF_NS: u64 = 10_000_000_000;
pub const MAX_BACKOFF_NS: u64 = 160_000_000_000;
/// Open this long, the device goes back to turns for a window to measure them afresh.
pub const OPEN_FOR_NS: u64 = 20_000_000_000;
/// A trial only when the window of turns left at least this fraction of the device idle
/// (GPU-bound tenants never do: their devices are never opened). Idle is what the driver
/// says (NVML's device utilisation, integrated by the caller: [`Probe::step`]'s `busy_ns`)
/// where it says anything: the tenants' measured GPU time over-states a CPU-bound launcher's
/// use, because its batches' events span the host's gaps between its launches (on the H200 a
/// decoder and a ResNet step measured 96% together while NVML saw the device 64% busy, and a
/// 2-process container's measured time exceeded the wall time).
pub const IDLE_GATE: f64 = 0.1;
/// The driver's reading is believed only if it saw the device busy at least this fraction of
/// what the tenants measured: a driver that sees a device idle while its tenants measured it
/// busy is not reading the device they run on (the simulator's NVML in a process with other
/// simulator state: a CI run tried a device with two saturating tenants open, NVML 0% busy,
/// and one tenant lost 86% for the trial's second). On the H200 it saw 0.59 where the tenants
/// measured 0.96, and 0.75 where a 2-process container made it 1.38.
pub const DRIVER_PLAUSIBLE: f64 = 0.25;
/// Open is kept when every tenant's rate open is at least this fraction of its rate in
/// turns...
pub const FLOOR: f64 = 0.97;
/// ...and their mean ratio at least this.
pub const GAIN: f64 = 1.03;
/// Open, a tenant whose rate over a window falls under this fraction of its rate in turns
/// closes the device.
pub const KEEP: f64 = 0.92;

/// One tenant as the probe sees it at a tick.
#[derive(Debug, Clone, Copy)]
pub struct Member {
    pub id: TenantId,
    /// Its launches so far (only grows within an incarnation).
    pub launches: u64,
    /// Its measured GPU time so far, ns (likewise).
    pub gpu_ns: u64,
    /// Whether it may run open (normal priority, no cap).
    pub may_open: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Turns, as usual.
    Turns,
    /// Turns, measured: launches, measured GPU time and the driver's busy time at its start.
    Baseline {
        since: u64,
        counts: Vec<u64>,
        gpu: u64,
        busy: Option<u64>,
    },
    /// Open, measured against the baseline's rates.
    Trial {
        since: u64,
        counts: Vec<u64>,
        turns: Vec<f64>,
    },
    /// Turns again, measured: the trial is judged against the better of the two windows of
    /// turns around it.
    After {
        since: u64,
        counts: Vec<u64>,
        before: Vec<f64>,
        open: Vec<f64>,
    },
    /// Open, each window checked.
    Open {
        since: u64,
        window: u64,
        counts: Vec<u64>,
        turns: Vec<f64>,
    },
}

/// What a device's probe decided and measured, for the log and status.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProbeStats {
    pub trials: u64,
    pub opened: u64,
    pub closed_behind: u64,
    /// The last trial's mean ratio open ÷ turns, and its least.
    pub last_gain: f64,
    pub last_least: f64,
}

/// Per device.
#[derive(Debug, Clone)]
pub struct Probe {
    phase: Phase,
    /// The tenants the measurement is about (sorted); another set starts over.
    members: Vec<TenantId>,
    stable_since: u64,
    next_trial: u64,
    backoff: u64,
    /// Just went back to turns from open (the scheduler levels its tenants).
    closed: bool,
    pub stats: ProbeStats,
}

impl Default for Probe {
    fn default() -> Probe {
        Probe {
            phase: Phase::Turns,
            members: Vec::new(),
            stable_since: 0,
            next_trial: 0,
            backoff: BACKOFF_NS,
            closed: false,
            stats: ProbeStats::default(),
        }
    }
}

fn rates(now: u64, since: u64, from: &[u64], members: &[Member]) -> Vec<f64> {
    let secs = (now.saturating_sub(since) as f64 / 1e9).max(1e-9);
    members
        .iter()
        .zip(from)
        .map(|(m, c)| m.launches.saturating_sub(*c) as f64 / secs)
        .collect()
}

impl Probe {
    /// Whether the device runs open at this tick. `members`: the device's tenants using it
    /// (sorted by id); `busy_ns`: the time the driver saw the device busy so far (NVML's
    /// utilisation integrated over time; only grows), if it reports one.
    pub fn step(&mut self, now: u64, members: &[Member], busy_ns: Option<u64>) -> bool {
        let ids: Vec<TenantId> = members.iter().map(|m| m.id).collect();
        let eligible = members.len() >= 2 && members.iter().all(|m| m.may_open);
        if ids != self.members || !eligible {
            if ids != self.members {
                self.members = ids;
                self.stable_since = now;
            }
            self.close(now);
            return false;
        }
        let counts = || members.iter().map(|m| m.launches).collect::<Vec<_>>();
        let gpu = || members.iter().map(|m| m.gpu_ns).sum::<u64>();
        let baseline = || Phase::Baseline {
            since: now,
            counts: counts(),
            gpu: gpu(),
            busy: busy_ns,
        };
        match &mut self.phase {
            Phase::Turns => {
                if now >= self.next_trial && now.saturating_sub(self.stable_since) >= SETTLE_NS {
                    self.phase = baseline();
                }
                false
            }
            Phase::Baseline {
                since,
                counts: from,
                gpu: gpu_from,
                busy: busy_from,
            } => {
                if now.saturating_sub(*since) < WINDOW_NS {
                    return false;
                }
                let wall = now.saturating_sub(*since).max(1) as f64;
                let measured = 1.0 - gpu().saturating_sub(*gpu_from) as f64 / wall;
                let driver = busy_ns
                    .zip(*busy_from)
                    .map(|(b, f)| 1.0 - b.saturating_sub(f) as f64 / wall)
                    .filter(|idle| 1.0 - idle >= DRIVER_PLAUSIBLE * (1.0 - measured));
                let idle_frac = driver.unwrap_or(measured);
                let turns = rates(now, *since, from, members);
                if idle_frac < IDLE_GATE || turns.iter().any(|r| *r <= 0.0) {
                    tracing::debug!(
                        idle = format!("{idle_frac:.2}"),
                        idle_measured = format!("{measured:.2}"),
                        idle_driver = ?driver.map(|d| format!("{d:.2}")),
                        ?turns,
                        "compute: no open trial (busy holders, or no progress)"
                    );
                    // Busy holders (or a tenant that made no progress): stay in turns.
                    self.reject(now);
                    return false;
                }
                self.stats.trials += 1;
                self.phase = Phase::Trial {
                    since: now,
                    counts: counts(),
                    turns,
                };
                true
            }
            Phase::Trial {
                since,
                counts: from,
                turns,
            } => {
                if now.saturating_sub(*since) < WINDOW_NS {
                    return true;
                }
                let open = rates(now, *since, from, members);
                self.phase = Phase::After {
                    since: now,
                    counts: counts(),
                    before: std::mem::take(turns),
                    open,
                };
                self.closed = true;
                false
            }
            Phase::After {
                since,
                counts: from,
                before,
                open,
            } => {
                if now.saturating_sub(*since) < WINDOW_NS {
                    return false;
                }
                let after = rates(now, *since, from, members);
                let turns: Vec<f64> = before.iter().zip(&after).map(|(b, a)| b.max(*a)).collect();
                let ratios: Vec<f64> = open.iter().zip(&turns).map(|(o, t)| o / t).collect();
                let least = ratios.iter().copied().fold(f64::INFINITY, f64::min);
                let gain = ratios.iter().sum::<f64>() / ratios.len() as f64;
                (self.stats.last_gain, self.stats.last_least) = (gain, least);
                tracing::info!(
                    gain = format!("{gain:.2}"),
                    least = format!("{least:.2}"),
                    ?open,
                    ?turns,
                    "compute: open trial measured (rates open ÷ the better of the turns \
                     before and after)"
                );
                if least >= FLOOR && gain >= GAIN {
                    tracing::info!(
                        gain = format!("{gain:.2}"),
                        least = format!("{least:.2}"),
                        "compute: device runs open: every tenant progressed at least as fast \
                         with the driver time-slicing as in turns"
                    );
                    self.stats.opened += 1;
                    self.backoff = BACKOFF_NS;
                    self.phase = Phase::Open {
                        since: now,
                        window: now,
                        counts: counts(),
                        turns,
                    };
                    true
                } else {
                    self.reject(now);
                    false
                }
            }
            Phase::Open {
                since,
                window,
                counts: from,
                turns,
            } => {
                if now.saturating_sub(*window) < WINDOW_NS {
                    return true;
                }
                let open = rates(now, *window, from, members);
                if open.iter().zip(turns.iter()).any(|(o, t)| *o < KEEP * t) {
                    tracing::info!(
                        "compute: device back to turns: a tenant fell behind its rate in turns"
                    );
                    self.stats.closed_behind += 1;
                    self.reject(now);
                    self.closed = true;
                    return false;
                }
                if now.saturating_sub(*since) >= OPEN_FOR_NS {
                    // Measure turns afresh (then try open again at once).
                    self.phase = baseline();
                    self.closed = true;
                    return false;
                }
                (*window, *from) = (now, counts());
                true
            }
        }
    }

    /// Whether the device runs open (a trial or kept open).
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Trial { .. } | Phase::Open { .. })
    }

    /// Whether the device just went back to turns from running open (once).
    pub fn take_closed(&mut self) -> bool {
        std::mem::take(&mut self.closed)
    }

    fn reject(&mut self, now: u64) {
        self.phase = Phase::Turns;
        self.next_trial = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF_NS);
    }

    /// Back to turns (the tenants changed): a trial after they settle again.
    fn close(&mut self, now: u64) {
        if matches!(self.phase, Phase::Trial { .. } | Phase::Open { .. }) {
            self.closed = true;
        }
        if self.phase != Phase::Turns {
            self.phase = Phase::Turns;
        }
        self.next_trial = self.next_trial.max(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn m(id: u64, launches: u64, gpu_ns: u64) -> Member {
        Member {
            id: (id, 0),
            launches,
            gpu_ns,
            may_open: true,
        }
    }

    /// What the probe is told about the device's use at each 1 ms tick.
    #[derive(Clone, Copy)]
    struct Use {
        /// Each tenant's measured GPU time per ms, ns.
        measured: u64,
        /// The driver's busy time per ms, ns (None: no NVML).
        driver: Option<u64>,
    }
    /// Each tenant measures 0.3 of the wall time (the device 40% idle by their account).
    const IDLE: Use = Use {
        measured: 300_000,
        driver: None,
    };
    /// Each measures 0.5: busy.
    const BUSY: Use = Use {
        measured: 500_000,
        driver: None,
    };

    /// Drives a probe at 1 ms ticks over `secs` with launch rates `rate(i, open, t)` per
    /// tenant (launches per second) and the device's use `u`.
    fn drive(
        p: &mut Probe,
        from: u64,
        secs: u64,
        rate: impl Fn(usize, bool, u64) -> f64,
        u: Use,
    ) -> (u64, bool) {
        let mut counts = [0.0f64; 2];
        let mut gpu = from / 1_000_000 * u.measured;
        let mut busy = u.driver.map(|d| from / 1_000_000 * d);
        let mut open = false;
        let mut open_ticks = 0;
        let mut t = from;
        while t < from + secs * S {
            for (i, c) in counts.iter_mut().enumerate() {
                *c += rate(i, open, t) / 1000.0;
            }
            gpu += u.measured;
            busy = busy.zip(u.driver).map(|(b, d)| b + d);
            let ms = [m(1, counts[0] as u64, gpu), m(2, counts[1] as u64, gpu)];
            open = p.step(t, &ms, busy);
            open_ticks += u64::from(open);
            t += 1_000_000;
        }
        (open_ticks, open)
    }

    #[test]
    fn a_device_opens_when_every_tenant_gains_and_closes_when_one_falls_behind() {
        let mut p = Probe::default();
        // Open: both faster (130 and 110 launches/s against 100 in turns).
        let (_, open) = drive(
            &mut p,
            0,
            7,
            |i, o, _| if o { [130.0, 110.0][i] } else { 100.0 },
            IDLE,
        );
        assert!(open, "{:?}", p.stats);
        assert_eq!(p.stats.opened, 1);
        // Then tenant 2 falls to 80 open: closed within a window or two.
        let (_, open) = drive(
            &mut p,
            7 * S,
            3,
            |i, o, _| if o { [130.0, 80.0][i] } else { 100.0 },
            IDLE,
        );
        assert!(!open);
        assert_eq!(p.stats.closed_behind, 1);
    }

    /// A tenant slowed during the first window of turns (its host took its CPU for a
    /// second) looks as if it gained open; the window of turns after the trial shows it
    /// did not, and the device stays in turns.
    #[test]
    fn a_slow_first_window_of_turns_does_not_open_a_device() {
        let mut p = Probe::default();
        // Turns: tenant 1 at 50 launches/s during the first measured window (3-4 s), 100
        // otherwise; open: 80 (it loses 20%), tenant 2 gains.
        let (_, open) = drive(
            &mut p,
            0,
            8,
            |i, o, t| match (i, o) {
                (0, true) => 80.0,
                (0, false) if (3 * S..4 * S).contains(&t) => 50.0,
                (1, true) => 150.0,
                _ => 100.0,
            },
            IDLE,
        );
        assert!(!open);
        assert_eq!((p.stats.trials, p.stats.opened), (1, 0), "{:?}", p.stats);
        assert!(
            (p.stats.last_least - 0.8).abs() < 0.02,
            "judged against 100 (after), not 50: {:?}",
            p.stats
        );
    }

    #[test]
    fn a_device_stays_in_turns_when_one_tenant_would_lose_or_holders_are_busy() {
        let mut p = Probe::default();
        // One gains a lot, the other loses 10%: never open past the trial.
        let (ticks, open) = drive(
            &mut p,
            0,
            30,
            |i, o, _| if o { [200.0, 90.0][i] } else { 100.0 },
            IDLE,
        );
        assert!(!open);
        assert_eq!(p.stats.opened, 0);
        // Trials back off: the first at 4 s, the next 10 s after it, then 20 s.
        assert!(
            p.stats.trials <= 3 && ticks <= 3 * 1000 + 10,
            "{:?} {ticks}",
            p.stats
        );
        // Busy holders: no trial at all.
        let mut q = Probe::default();
        let (ticks, _) = drive(&mut q, 0, 20, |_, o, _| if o { 200.0 } else { 100.0 }, BUSY);
        assert_eq!((ticks, q.stats.trials), (0, 0));
    }

    /// A hostile tenant writes what it likes into its own launch count: a forged rate open
    /// (or a count that goes backwards) only moves its own vote, so a neighbour that loses
    /// open still keeps the device in turns.
    #[test]
    fn a_forged_launch_count_cannot_keep_a_device_open() {
        let mut p = Probe::default();
        let (_, open) = drive(
            &mut p,
            0,
            30,
            |i, o, _| if o { [1e9, 80.0][i] } else { 100.0 },
            IDLE,
        );
        assert!(!open);
        assert_eq!(p.stats.opened, 0, "{:?}", p.stats);
        // A count that drops (a page rewritten) reads as no progress: no trial.
        let mut q = Probe::default();
        for t in 0..8_000u64 {
            let forged = if t % 2 == 0 { u64::MAX } else { 0 };
            assert!(!q.step(
                t * 1_000_000,
                &[m(1, forged, t * 300_000), m(2, t, t * 300_000)],
                None
            ));
        }
    }

    #[test]
    fn capped_or_prioritised_tenants_keep_turns() {
        let mut p = Probe::default();
        for t in 0..10_000u64 {
            let ms = [
                m(1, t, 0),
                Member {
                    may_open: false,
                    ..m(2, t, 0)
                },
            ];
            assert!(!p.step(t * 1_000_000, &ms, Some(t * 100_000)));
        }
    }

    /// The driver's utilisation decides where it reports one: two CPU-bound launchers whose
    /// events span their host gaps measure 1.0 of the wall time together while NVML sees the
    /// device 64% busy (the H200's decoder / ResNet pair) — a trial; and a device NVML sees
    /// 100% busy is never tried, whatever the tenants measured.
    #[test]
    fn the_drivers_utilisation_decides_whether_a_device_is_idle() {
        let faster_open = |i: usize, o: bool, _| if o { [130.0, 120.0][i] } else { 100.0 };
        let mut p = Probe::default();
        let spans = Use {
            measured: 500_000,
            driver: Some(640_000),
        };
        let (_, open) = drive(&mut p, 0, 7, faster_open, spans);
        assert!(open, "{:?}", p.stats);
        assert_eq!((p.stats.trials, p.stats.opened), (1, 1));
        let mut q = Probe::default();
        let saturated = Use {
            measured: 300_000,
            driver: Some(1_000_000),
        };
        let (ticks, _) = drive(&mut q, 0, 20, faster_open, saturated);
        assert_eq!((ticks, q.stats.trials), (0, 0), "{:?}", q.stats);
        // A driver that sees the device idle while the tenants measured it busy reads another
        // device: the measured time decides (no trial).
        let mut s = Probe::default();
        let elsewhere = Use {
            measured: 500_000,
            driver: Some(0),
        };
        let (ticks, _) = drive(&mut s, 0, 20, faster_open, elsewhere);
        assert_eq!((ticks, s.stats.trials), (0, 0), "{:?}", s.stats);
        // Without NVML the measured time decides (busy by the tenants' account: no trial).
        let mut r = Probe::default();
        let (ticks, _) = drive(&mut r, 0, 20, faster_open, BUSY);
        assert_eq!((ticks, r.stats.trials), (0, 0));
    }
}
