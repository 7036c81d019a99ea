//! The scheduler in simulated time ([`model`]): what tenants get, window by window.
//!
//! Each test states the behaviour docs/compute.md promises (issue 25's figures: a newcomer
//! gets 40-60% of every 1 s window from its first, an incumbent never drops under 40%, a cap
//! holds within one point over every 2 s window) and checks it on the device model, in
//! milliseconds of CPU time.

mod model;

use self::model::{MS, Proc, Sim, Work, show};
use super::Priority::{High, Low, Normal};

const KERNEL: u64 = MS;
const SAT: Work = Work::Saturate { kernel: KERNEL };

fn all_within(w: &[f64], lo: f64, hi: f64) -> bool {
    !w.is_empty() && w.iter().all(|x| (lo..=hi).contains(x))
}

/// Both tenants get 40-60% of every 1 s window of [from_ms, to_ms).
fn both_fair(
    s: &Sim,
    (b, what_b): (usize, &str),
    (a, what_a): (usize, &str),
    from_ms: u64,
    to_ms: u64,
) {
    for (t, what) in [(b, what_b), (a, what_a)] {
        let w = s.windows(t, from_ms, to_ms, 1000);
        assert!(
            all_within(&w, 40.0, 60.0),
            "{what}, per second: {}",
            show(&w)
        );
    }
}

#[test]
fn a_tenant_joining_a_busy_gpu_gets_its_share_from_its_first_second() {
    let mut s = Sim::new();
    let a = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    let b = s.tenant(50, 0, Normal, vec![Proc::new(SAT).from(5000)]);
    s.run_until(15_000);
    assert!(
        s.pct(a, 1000, 5000) > 95.0,
        "alone: {:.1}",
        s.pct(a, 1000, 5000)
    );
    both_fair(&s, (b, "newcomer"), (a, "incumbent"), 5000, 15_000);
    // Settled within 2 s, and no oscillation after.
    let late = s.windows(b, 7000, 15_000, 1000);
    assert!(all_within(&late, 45.0, 55.0), "after 2 s: {}", show(&late));
}

/// Turns of one quantum, not one or two: a holder whose quantum is over while the tenant
/// waiting is a little ahead of it in virtual time (the holder's last drain was shorter)
/// runs on only until it is level, not a whole further quantum. With whole quanta the two
/// tenants' turns doubled to 200 ms each at 50 / 50 and a 1 s window moved by up to 10
/// points (the H200's joiner: 47.4-56.0 per second); here every second is within 5.
#[test]
fn turns_last_one_quantum_when_the_tenants_drains_differ() {
    for (ka, kb) in [(KERNEL, 3 * MS), (KERNEL, 2 * MS), (MS / 2, 3 * MS)] {
        let mut s = Sim::new();
        let a = s.tenant(
            50,
            0,
            Normal,
            vec![Proc::new(Work::Saturate { kernel: ka })],
        );
        let b = s.tenant(
            50,
            0,
            Normal,
            vec![Proc::new(Work::Saturate { kernel: kb })],
        );
        s.run_until(14_000);
        for (t, what) in [(a, "short kernels"), (b, "long kernels")] {
            let w = s.windows(t, 2000, 14_000, 1000);
            assert!(
                all_within(&w, 45.0, 55.0),
                "{ka} / {kb} ns kernels, {what}, per second: {}",
                show(&w)
            );
            let st = s.sched.tenant(&(t as u64 + 1, 0)).expect("tenant").stats;
            let mean_ms = st.turn_ns as f64 / st.turns.max(1) as f64 / 1e6;
            assert!(
                mean_ms < 120.0,
                "{ka} / {kb} ns kernels, {what}: turns of {mean_ms:.1} ms on average (a quantum is 100)"
            );
        }
    }
}

/// Issue 25's root: a tenant that launched a little for seconds (PyTorch importing,
/// benchmarking cuDNN, warming up) was never idle long enough to be brought level, fell
/// seconds behind, and then took 95% of the device for 4 s.
#[test]
fn a_tenant_that_warmed_up_lightly_gets_no_catch_up() {
    let mut s = Sim::new();
    let a = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    let warm = Work::Steps {
        kernel: 100_000,
        host: 900_000,
        sync: false,
    };
    let b = s.tenant(
        50,
        0,
        Normal,
        vec![Proc::new(warm).from(2000).then(8000, SAT)],
    );
    s.run_until(18_000);
    both_fair(&s, (b, "after warm-up"), (a, "incumbent"), 8000, 18_000);
    // While it warmed up it was served (it needs ~10% of the device alone; beside A its
    // measured time over-states its use, so it takes turns part of the time) and A kept at
    // least its share. (A turn it holds while launching a little every millisecond is its
    // time, so A gets about half, not the 90% driver time-slicing would leave it: the
    // latency-bound case of issue 25, item 4, still open.)
    assert!(
        s.pct(b, 3000, 8000) > 4.0,
        "warm-up served: {:.1}",
        s.pct(b, 3000, 8000)
    );
    assert!(
        s.pct(a, 3000, 8000) >= 48.0,
        "incumbent: {:.1}",
        s.pct(a, 3000, 8000)
    );
}

#[test]
fn a_killed_holder_loses_the_device_and_its_restart_gets_no_catch_up() {
    let mut s = Sim::new();
    let a = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    let b = s.tenant(
        50,
        0,
        Normal,
        vec![
            Proc::new(SAT).from(1000).killed(6000),
            Proc::new(SAT).from(9000),
        ],
    );
    s.run_until(19_000);
    assert!(
        s.pct(a, 6000, 9000) > 95.0,
        "after the kill: {:.1}",
        s.pct(a, 6000, 9000)
    );
    both_fair(&s, (b, "restarted"), (a, "incumbent"), 9000, 19_000);
}

#[test]
fn a_stopped_tenant_frees_the_device_and_resumes_level() {
    let mut s = Sim::new();
    let a = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    let b = s.tenant(50, 0, Normal, vec![Proc::new(SAT).stopped(4000, 7000)]);
    s.run_until(15_000);
    assert!(
        s.pct(a, 4100, 7000) > 95.0,
        "while B is stopped: {:.1}",
        s.pct(a, 4100, 7000)
    );
    both_fair(&s, (b, "resumed"), (a, "the other"), 7000, 15_000);
}

#[test]
fn a_container_of_two_processes_gets_the_share_of_one() {
    let mut s = Sim::new();
    let a = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    let b = s.tenant(50, 0, Normal, vec![Proc::new(SAT), Proc::new(SAT)]);
    s.run_until(12_000);
    let (pa, pb) = (s.pct(a, 2000, 12_000), s.pct(b, 2000, 12_000));
    assert!(
        (pa - 50.0).abs() <= 5.0 && (pb - 50.0).abs() <= 5.0,
        "{pa:.1} / {pb:.1}"
    );
}

#[test]
fn a_cap_is_hard_on_an_idle_device() {
    for (name, procs) in [
        ("one GPU-bound process", vec![Proc::new(SAT)]),
        (
            "two GPU-bound processes",
            vec![Proc::new(SAT), Proc::new(SAT)],
        ),
        (
            "a host-gapped loop",
            vec![Proc::new(Work::Steps {
                kernel: 2 * MS,
                host: MS,
                sync: true,
            })],
        ),
    ] {
        let mut bare = Sim::new();
        let b = bare.tenant(0, 0, Normal, procs.clone());
        bare.run_until(4000);
        let bare = bare.pct(b, 1000, 4000);
        let mut s = Sim::new();
        let a = s.tenant(0, 30, Normal, procs);
        s.run_until(12_000);
        let w = s.windows(a, 0, 12_000, 2000);
        assert!(
            w.iter().all(|x| *x <= 31.0),
            "{name}: capped at 30, device time per 2 s: {}",
            show(&w)
        );
        // Its rate (device time it ran ÷ what it runs alone): at the cap, not above.
        let rate = s.pct(a, 2000, 12_000) * 100.0 / bare;
        assert!(
            (26.0..=32.0).contains(&rate),
            "{name}: {rate:.1}% of its bare rate ({bare:.1}% alone)"
        );
    }
}

#[test]
fn equal_shares_of_one_to_eight_tenants() {
    for n in 2..=8u32 {
        let share = 100 / n;
        let mut s = Sim::new();
        let ts: Vec<usize> = (0..n)
            .map(|_| s.tenant(share, 0, Normal, vec![Proc::new(SAT)]))
            .collect();
        s.run_until(12_000);
        let fair = 100.0 / f64::from(n);
        for t in ts {
            let p = s.pct(t, 2000, 12_000);
            assert!(
                (p - fair).abs() <= 5.0,
                "{n} tenants: {p:.1}, fair {fair:.1}"
            );
        }
    }
    let mut s = Sim::new();
    let a = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    s.run_until(3000);
    assert!(
        s.pct(a, 1000, 3000) > 95.0,
        "alone, work-conserving: {:.1}",
        s.pct(a, 1000, 3000)
    );
}

#[test]
fn uneven_shares_hold() {
    for shares in [vec![25, 75], vec![20, 30, 50], vec![10, 20, 30, 40]] {
        let mut s = Sim::new();
        let ts: Vec<usize> = shares
            .iter()
            .map(|&sh| s.tenant(sh, 0, Normal, vec![Proc::new(SAT)]))
            .collect();
        s.run_until(12_000);
        for (t, sh) in ts.into_iter().zip(&shares) {
            let p = s.pct(t, 2000, 12_000);
            assert!(
                (p - f64::from(*sh)).abs() <= 5.0,
                "{shares:?}: {p:.1} for {sh}"
            );
        }
    }
}

/// Steps per second of a light step loop, alone and beside a GPU-bound neighbour.
fn light_steps(neighbour: bool, priority: super::Priority, kernel: u64, host: u64) -> (f64, f64) {
    let mut s = Sim::new();
    let work = Work::Steps {
        kernel,
        host,
        sync: true,
    };
    let l = s.tenant(50, 0, priority, vec![Proc::new(work)]);
    let n = neighbour.then(|| s.tenant(50, 0, Normal, vec![Proc::new(SAT)]));
    s.run_until(10_000);
    (
        s.pct(l, 2000, 10_000),
        n.map_or(0.0, |n| s.pct(n, 2000, 10_000)),
    )
}

#[test]
fn a_tenant_doing_two_percent_work_is_not_held_back() {
    let (alone, _) = light_steps(false, Normal, 20_000, 980_000);
    let (beside, neighbour) = light_steps(true, Normal, 20_000, 980_000);
    assert!(alone > 1.5, "alone it does ~2%: {alone:.2}");
    assert!(
        beside >= 0.8 * alone,
        "beside a neighbour {beside:.2}% vs {alone:.2}% alone"
    );
    assert!(
        neighbour >= 90.0,
        "the neighbour gets the rest: {neighbour:.1}"
    );
}

#[test]
fn high_priority_is_served_first_within_its_share() {
    // A latency-bound step loop (2 ms of GPU per 8 ms of host) beside a GPU-bound one.
    let (normal, _) = light_steps(true, Normal, 2 * MS, 8 * MS);
    let (high, neighbour) = light_steps(true, High, 2 * MS, 8 * MS);
    let (alone, _) = light_steps(false, Normal, 2 * MS, 8 * MS);
    assert!(
        high >= 0.75 * alone,
        "high: {high:.1}% of the device, alone {alone:.1}%"
    );
    assert!(high > normal, "high {high:.1} vs normal {normal:.1}");
    assert!(
        neighbour >= 50.0,
        "the neighbour keeps its share and the spill-over: {neighbour:.1}"
    );
    // Both GPU-bound: high gets its share, not more.
    let mut s = Sim::new();
    let h = s.tenant(50, 0, High, vec![Proc::new(SAT)]);
    let n = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    s.run_until(12_000);
    let (ph, pn) = (s.pct(h, 2000, 12_000), s.pct(n, 2000, 12_000));
    assert!(
        (ph - 50.0).abs() <= 5.0 && (pn - 50.0).abs() <= 5.0,
        "{ph:.1} / {pn:.1}"
    );
}

#[test]
fn low_priority_only_gets_idle_time() {
    let mut s = Sim::new();
    let l = s.tenant(50, 0, Low, vec![Proc::new(SAT)]);
    let n = s.tenant(
        50,
        0,
        Normal,
        vec![Proc::new(SAT).then(6000, Work::Idle).then(9000, SAT)],
    );
    s.run_until(14_000);
    let busy = s.pct(l, 1000, 6000);
    assert!(busy <= 3.0, "low beside a busy normal tenant: {busy:.1}");
    assert!(s.pct(n, 1000, 6000) >= 95.0);
    let idle = s.pct(l, 6200, 9000);
    assert!(idle >= 90.0, "low on an idle device: {idle:.1}");
    let back = s.windows(l, 9000, 14_000, 1000);
    assert!(
        back.iter().all(|x| *x <= 5.0),
        "the normal tenant back: {}",
        show(&back)
    );
}

/// Hierarchical shares: a pod at 50 whose two containers both work gets 50 between them
/// (25 each), not 50 each; when one stops, the other gets the pod's whole share at once.
#[test]
fn a_team_share_is_split_among_the_members_using_the_device() {
    let mut s = Sim::new();
    let solo = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    let team = super::Team {
        id: 9,
        share: 50,
        weight: 100,
    };
    let m1 = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    let m2 = s.tenant(50, 0, Normal, vec![Proc::new(SAT).then(8000, Work::Idle)]);
    s.tenants[m1].team = Some(team);
    s.tenants[m2].team = Some(team);
    s.run_until(14_000);
    // Per second the team holds its 50 and the solo tenant its own; each member gets its
    // half over 2 s windows (a 25% quantum is 50 ms: one more or fewer in a second is 5
    // points).
    let solo_w = s.windows(solo, 1000, 8000, 1000);
    assert!(all_within(&solo_w, 45.0, 55.0), "solo: {}", show(&solo_w));
    let (w1, w2) = (
        s.windows(m1, 1000, 8000, 1000),
        s.windows(m2, 1000, 8000, 1000),
    );
    let sum: Vec<f64> = w1.iter().zip(&w2).map(|(a, b)| a + b).collect();
    assert!(
        all_within(&sum, 45.0, 55.0),
        "the team, per second: {}",
        show(&sum)
    );
    for (t, what) in [(m1, "m1"), (m2, "m2")] {
        let w = s.windows(t, 1000, 8000, 2000);
        assert!(all_within(&w, 20.0, 30.0), "{what} per 2 s: {}", show(&w));
    }
    for (t, what) in [(solo, "solo"), (m1, "m1 alone in its team")] {
        let w = s.windows(t, 9000, 14_000, 1000);
        assert!(
            all_within(&w, 44.0, 56.0),
            "{what} after m2 stopped: {}",
            show(&w)
        );
    }
}

/// Issue 25 item 4: two tenants that both leave the device idle between steps (a decoder
/// that syncs every token, a training loop that waits for its loss) each get more with the
/// device open — their work fills each other's gaps — than in turns, and the probe finds
/// it out and opens the device; two GPU-bound tenants never see it opened.
#[test]
fn tenants_that_leave_the_device_idle_run_open_when_both_gain() {
    let decoder = Work::Steps {
        kernel: 300_000,
        host: 300_000,
        sync: true,
    };
    let trainer = Work::Steps {
        kernel: 2 * MS,
        host: 2 * MS,
        sync: true,
    };
    let run = |open: bool| {
        let mut s = Sim::with(super::Tuning {
            open,
            ..super::Tuning::default()
        });
        let d = s.tenant(50, 0, Normal, vec![Proc::new(decoder)]);
        let c = s.tenant(50, 0, Normal, vec![Proc::new(trainer)]);
        s.run_until(16_000);
        let opened = s.sched.probe_of(model::DEVICE).map(|p| p.1.opened);
        (s.pct(d, 8000, 16_000), s.pct(c, 8000, 16_000), opened)
    };
    let (dt, ct, _) = run(false);
    let (dopen, copen, opened) = run(true);
    eprintln!(
        "turns: decoder {dt:.1}% cnn {ct:.1}% of the device; probed: {dopen:.1}% {copen:.1}% (opened {opened:?})"
    );
    assert_eq!(opened, Some(1), "the device was not opened");
    assert!(
        dopen >= dt * 0.97 && copen >= ct * 0.97 && dopen + copen > (dt + ct) * 1.05,
        "open should serve both: turns {dt:.1} / {ct:.1}, open {dopen:.1} / {copen:.1}"
    );
    // GPU-bound tenants: never opened.
    let mut s = Sim::new();
    s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    s.run_until(16_000);
    let stats = s.sched.probe_of(model::DEVICE).unwrap().1;
    assert_eq!((stats.trials, stats.opened), (0, 0), "{stats:?}");
}

/// A tenant that co-ran while it warmed up (light, duty < 0.3) and then started real work
/// that keeps the device ~65% busy goes back to turns at once: its share, not 1.5 × it
/// (the H200 joiner that kept co-running at 65.5% beside an incumbent at 50 for 3 s).
#[test]
fn a_co_runner_that_starts_real_work_goes_back_to_turns() {
    let mut s = Sim::new();
    let a = s.tenant(50, 0, Normal, vec![Proc::new(SAT)]);
    let warm = Work::Steps {
        kernel: 100_000,
        host: 900_000,
        sync: true,
    };
    let train = Work::Steps {
        kernel: 650_000,
        host: 350_000,
        sync: true,
    };
    let b = s.tenant(50, 0, Normal, vec![Proc::new(warm).then(4000, train)]);
    s.run_until(10_000);
    let wb = s.windows(b, 5000, 10_000, 1000);
    let wa = s.windows(a, 5000, 10_000, 1000);
    assert!(
        all_within(&wb, 0.0, 55.0) && all_within(&wa, 45.0, 100.0),
        "from 1 s after it started training, per second: it {} / the incumbent {}",
        show(&wb),
        show(&wa)
    );
}
