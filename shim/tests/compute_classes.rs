//! Compute shares for the workloads people run (issue 10), under the real agent
//! (`fgpu agent --sim`) on the simulator's one device timeline, every tenant a cgroup with
//! processes in PID namespaces of their own:
//!
//! - loops with host gaps between steps (an optimizer step, data loading) next to saturating
//!   ones, two and three tenants: shares of *work* (steps per second ÷ the same loop alone);
//! - a container with two processes next to one with one, and a process feeding the device
//!   from two threads on two streams: one share, not two;
//! - a latency-bound tenant that syncs every step next to a saturating one;
//! - a CPU-bound launcher (host work before every launch) next to a saturating one.
//!
//! Tenants that are killed, stopped, frozen or hostile: compute_hostile.rs. Workloads are
//! `fgpu-sim-load steps-for MS K KERNEL GAP_US` (K 1 ms kernels, a sync, GAP_US of host time;
//! common/classes.rs); rates come from its `steps-for ok` line or its `steps-at` lines (every
//! 100 ms, with CLOCK_MONOTONIC). Figures are printed (`-- --nocapture`).

mod common;

use common::agent::*;
use common::classes::*;
use common::tenants::{CpuMeter, Measured, assert_shares, progress, rate_between};
use fgpu_testkit::privileged;
use std::time::Duration;

/// Re-executed as a client by `AgentWorld::client`; does nothing in a normal test run.
#[test]
fn client_entry() {
    if common::client::main() {
        std::process::exit(0);
    }
}

/// A loop with host gaps between its steps gets its share of *work* next to saturating
/// loops, with two tenants (30/70) and with three (20/30/50): its steps per second, as a
/// fraction of what it does alone, are its share of the work all of them do (±3 points),
/// and so are the others'; together ≥ 90% (`fgpu_testkit::shares`, less half of any CPU the
/// host stole).
#[test]
fn privileged_host_gapped_loops_get_their_share_of_work() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clsgap");
    let agent = w.agent();
    let (solo_gap, solo_sat) = (
        solo(&w, &agent, gapped(3000)),
        solo(&w, &agent, saturating(3000)),
    );
    let mut ts = vec![
        tenant(&w, "gap30", &["--compute", "30"], &[gapped(8000)]),
        tenant(&w, "sat70", &["--compute", "70"], &[saturating(8000)]),
    ];
    let cpu = CpuMeter::start();
    go(&mut ts);
    let r = finish(ts, &agent);
    let (g, s) = (100.0 * r[0][0] / solo_gap, 100.0 * r[1][0] / solo_sat);
    println!("alone {solo_gap:.1} / {solo_sat:.1} steps/s");
    let ctx = format!("agent log:\n{}", agent.log_text());
    assert_shares(
        "gapped 30 / saturating 70, % of their solo rates",
        &[
            Measured::new("gapped", g, 30.0),
            Measured::new("saturating", s, 70.0),
        ],
        3.0,
        &cpu,
        &ctx,
    );

    let mut ts = vec![
        tenant(&w, "gap20", &["--compute", "20"], &[gapped(8000)]),
        tenant(&w, "sat30", &["--compute", "30"], &[saturating(8000)]),
        tenant(&w, "sat50", &["--compute", "50"], &[saturating(8000)]),
    ];
    let cpu = CpuMeter::start();
    go(&mut ts);
    let r = finish(ts, &agent);
    let got = [
        100.0 * r[0][0] / solo_gap,
        100.0 * r[1][0] / solo_sat,
        100.0 * r[2][0] / solo_sat,
    ];
    assert_shares(
        "gapped 20 / saturating 30 / saturating 50, % of their solo rates",
        &[
            Measured::new("gapped", got[0], 20.0),
            Measured::new("sat30", got[1], 30.0),
            Measured::new("sat50", got[2], 50.0),
        ],
        3.0,
        &cpu,
        &ctx,
    );
}

/// A CPU-bound launcher (its thread, not the device, is the bottleneck) at 25 next to a
/// saturating tenant at 75: the launcher gets its share of work within ±5 points, the
/// saturating tenant at least its share (−3) and no more than what the launcher left.
/// (The launcher gets about 21-23 on a quiet machine: taking turns costs a CPU-bound loop
/// part of its turns, which on the H200 is worse — docs/benchmarks.md — so this is held at
/// the H200 bar's ±5, not the ±3 of the GPU-bound cases.)
///
/// The launcher's rate is the CPU it gets: its rate alone is measured before and after the
/// pair and averaged (the interleaved method of docs/benchmarks.md), and its floor is
/// lowered by half the CPU the host stole during the pair, as `fgpu_testkit::shares`
/// lowers the device-busy floor (a CI host stole 15-26% of this machine's CPU while the two
/// ran, against 3-15% while the launcher ran alone, and took the launcher from 22% to 15%;
/// no scheduler gives back a CPU the host took).
#[test]
fn privileged_a_cpu_bound_launcher_gets_its_share_of_work() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clscpu");
    let agent = w.agent();
    let before = CpuMeter::start();
    let (cpu_before, solo_sat) = (
        solo(&w, &agent, cpu_bound(3000)),
        solo(&w, &agent, saturating(3000)),
    );
    let stolen_before = before.stolen_pct();
    let during = CpuMeter::start();
    let mut ts = vec![
        tenant(&w, "cpu25", &["--compute", "25"], &[cpu_bound(8000)]),
        tenant(&w, "sat75", &["--compute", "75"], &[saturating(8000)]),
    ];
    go(&mut ts);
    let r = finish(ts, &agent);
    let stolen = during.stolen_pct();
    let after = CpuMeter::start();
    let cpu_after = solo(&w, &agent, cpu_bound(3000));
    let stolen_after = after.stolen_pct();
    let solo_cpu = (cpu_before + cpu_after) / 2.0;
    let (c, s) = (100.0 * r[0][0] / solo_cpu, 100.0 * r[1][0] / solo_sat);
    println!(
        "CPU-bound launcher 25 / saturating 75 (alone {cpu_before:.1} and {cpu_after:.1} / \
         {solo_sat:.1} steps/s): {c:.1}% / {s:.1}% [host stole {stolen_before:.1}% / \
         {stolen:.1}% / {stolen_after:.1}% of the CPU before / during / after]"
    );
    let ctx = format!("agent log:\n{}", agent.log_text());
    let floor = fgpu_testkit::shares::lowered(20.0, stolen);
    assert!(
        (floor..=30.0).contains(&c),
        "CPU-bound launcher at 25: {c:.1}% (want {floor:.1}-30: 25 ± 5, the floor less half \
         the {stolen:.1}% the host stole)\n{ctx}"
    );
    let most = 78.0 + (25.0 - c).max(0.0);
    assert!(
        (72.0..=most).contains(&s),
        "saturating tenant at 75: {s:.1}% (want 72-{most:.1}: its share, and no more than \
         the launcher left)\n{ctx}"
    );
}

/// A container running two processes gets its container's share, not two shares and not
/// less: 50/50 against a container running one.
#[test]
fn privileged_a_two_process_container_gets_one_share() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("cls2p");
    let agent = w.agent();
    let alone = solo(&w, &agent, saturating(3000));
    let mut ts = vec![
        tenant(
            &w,
            "two",
            &["--compute", "50"],
            &[saturating(8000), saturating(8000)],
        ),
        tenant(&w, "one", &["--compute", "50"], &[saturating(8000)]),
    ];
    let cpu = CpuMeter::start();
    go(&mut ts);
    std::thread::sleep(Duration::from_millis(3000));
    let (_, status) = w.fgpu(&["status", "--json"]);
    let cgs = [ts[0].cg.path.clone(), ts[1].cg.path.clone()];
    let r = finish(ts, &agent);
    let two = 100.0 * (r[0][0] + r[0][1]) / alone;
    let one = 100.0 * r[1][0] / alone;
    println!(
        "2-process container / 1-process container at 50/50: {two:.1}% ({:.1} + {:.1}) / {one:.1}%",
        100.0 * r[0][0] / alone,
        100.0 * r[0][1] / alone
    );
    let ctx = format!("status: {status}\nagent log:\n{}", agent.log_text());
    assert_shares(
        "2-process / 1-process container at 50/50, % of one process alone",
        &[
            Measured::new("two-process", two, 50.0),
            Measured::new("one-process", one, 50.0),
        ],
        3.0,
        &cpu,
        &ctx,
    );
    // Each of the two processes may queue twice the base bound (their events span each
    // other's work); the one-process container keeps the base (4 ms).
    let v: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let queue_us = |cg: &str| {
        v.as_array()
            .and_then(|a| a.iter().find(|r| r["cgroup"] == cg))
            .map(|r| r["compute_queue_us"].clone())
            .unwrap_or_else(|| panic!("no row for {cg}: {status}"))
    };
    assert_eq!(queue_us(&cgs[0]), 8000, "two processes: {ctx}");
    assert_eq!(queue_us(&cgs[1]), 4000, "one process: {ctx}");
}

/// A cap holds for the container, not per process: two saturating processes in one
/// container capped at 30 on an otherwise idle device do 30 ± 4% of what one does alone
/// together. (Their batches' events span each other's work, so their measured GPU time is
/// about twice the device time they hold; a bucket charged with it gave them half the cap.)
#[test]
fn privileged_a_capped_two_process_container_gets_its_cap() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clscap2");
    let agent = w.agent();
    let alone = solo(&w, &agent, saturating(3000));
    let mut ts = vec![tenant(
        &w,
        "cap2",
        &["--compute-cap", "30"],
        &[saturating(4000), saturating(4000)],
    )];
    go(&mut ts);
    std::thread::sleep(Duration::from_millis(2500));
    let (_, status) = w.fgpu(&["status", "--json"]);
    let r = finish(ts, &agent);
    let both = 100.0 * (r[0][0] + r[0][1]) / alone;
    println!(
        "2-process container capped at 30 alone: {both:.1}% ({:.1} + {:.1}) of one process alone",
        100.0 * r[0][0] / alone,
        100.0 * r[0][1] / alone
    );
    let ctx = format!("status: {status}\nagent log:\n{}", agent.log_text());
    within(both, 30.0, 4.0, "capped two-process container", &ctx);
}

/// A container whose one process feeds the device from two threads, each on a stream of its
/// own, at 50 next to a one-process container at 50: the threads share one share (their
/// steps together 50 ± 3% of what the two threads do alone), not one each.
#[test]
fn privileged_two_threads_on_two_streams_get_one_share() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clsthr");
    let agent = w.agent();
    let alone_threads = solo(&w, &agent, threaded(3000, 2));
    let alone = solo(&w, &agent, saturating(3000));
    let mut ts = vec![
        tenant(&w, "threads", &["--compute", "50"], &[threaded(8000, 2)]),
        tenant(&w, "one", &["--compute", "50"], &[saturating(8000)]),
    ];
    let cpu = CpuMeter::start();
    go(&mut ts);
    let r = finish(ts, &agent);
    let two = 100.0 * r[0][0] / alone_threads;
    let one = 100.0 * r[1][0] / alone;
    println!(
        "2 threads on 2 streams / 1 thread at 50/50: {two:.1}% / {one:.1}% (alone {alone_threads:.1} / \
         {alone:.1} steps/s)"
    );
    let ctx = format!("agent log:\n{}", agent.log_text());
    assert_shares(
        "2 threads / 1 thread at 50/50, % of their solo rates",
        &[
            Measured::new("two-thread", two, 50.0),
            Measured::new("one-thread", one, 50.0),
        ],
        3.0,
        &cpu,
        &ctx,
    );
}

/// A tenant that does little GPU work per step and waits for it (1 ms kernel, sync, 4 ms of
/// host time) at 50% next to a saturating tenant at 50%: it gets at least half its solo step
/// rate, and so does the neighbour (today's turn-taking alone would make each of its steps
/// wait for the neighbour's turn).
#[test]
fn privileged_a_latency_bound_tenant_is_served_promptly() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clslat");
    let agent = w.agent();
    let (solo_lat, solo_sat) = (
        solo(&w, &agent, latency_bound(3000)),
        solo(&w, &agent, saturating(3000)),
    );
    let mut ts = vec![
        tenant(&w, "lat50", &["--compute", "50"], &[latency_bound(8000)]),
        tenant(&w, "sat50", &["--compute", "50"], &[saturating(8000)]),
    ];
    go(&mut ts);
    std::thread::sleep(Duration::from_millis(6000));
    let (_, status) = w.fgpu(&["status", "--json"]);
    let lat_cg = ts[0].cg.path.clone();
    let r = finish(ts, &agent);
    let (l, s) = (100.0 * r[0][0] / solo_lat, 100.0 * r[1][0] / solo_sat);
    println!(
        "latency-bound 50 / saturating 50 (alone {solo_lat:.1} / {solo_sat:.1} steps/s): {l:.1}% / {s:.1}% of their solo rates"
    );
    let ctx = format!("status: {status}\nagent log:\n{}", agent.log_text());
    assert!(
        l >= 50.0,
        "latency-bound tenant at {l:.1}% of its solo rate\n{ctx}"
    );
    assert!(s >= 50.0, "saturating neighbour at {s:.1}%\n{ctx}");
    let v: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let row = v
        .as_array()
        .and_then(|a| a.iter().find(|r| r["cgroup"] == lat_cg.as_str()))
        .unwrap_or_else(|| panic!("no row for {lat_cg}: {status}"));
    assert_eq!(
        row["compute_corun"], true,
        "status says it co-runs: {status}"
    );
}

/// Issue 25's join: a tenant that launched a little for seconds (as PyTorch does while it
/// imports, benchmarks cuDNN and warms up: a 100 µs kernel every millisecond) next to a
/// saturating incumbent, both at 50, then starts real work. Over its first 4 s of real work
/// it gets 40-60% of its solo rate, and so does the incumbent (before the scheduler bounded
/// lag, it took about 95% of the device for those 4 s).
#[test]
fn privileged_a_tenant_joining_after_a_light_warm_up_gets_no_catch_up() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clsjoin");
    let agent = w.agent();
    let solo_rate = solo(&w, &agent, saturating(3000));
    let mut warm: Vec<String> = ["steps-for", "6000", "1", "sleep_100us", "1000"]
        .map(String::from)
        .to_vec();
    warm.extend(saturating(6000));
    let mut ts = vec![
        tenant(&w, "incumbent", &["--compute", "50"], &[saturating(14_000)]),
        tenant(&w, "joiner", &["--compute", "50"], &[warm]),
    ];
    go(&mut ts);
    let mut done = Vec::new();
    for t in ts {
        for p in t.procs {
            done.push(p.finish());
        }
    }
    let ctx = format!("agent log:\n{}", agent.log_text());
    for f in &done {
        assert_eq!(f.code, Some(0), "{f}\n{ctx}");
    }
    let inc = progress(&done[0].lines);
    // The joiner's real work: the steps-at lines after its warm-up's result line.
    let split = done[1]
        .lines
        .iter()
        .position(|l| l.starts_with("steps-for ok"))
        .expect("warm-up result");
    let real = progress(&done[1].lines[split + 1..]);
    let t0 = real.first().expect("real work progress").0;
    let (j, i) = (
        100.0 * rate_between(&real, t0, t0 + 4000) / solo_rate,
        100.0 * rate_between(&inc, t0, t0 + 4000) / solo_rate,
    );
    println!(
        "first 4 s after a light warm-up, 50/50: joiner {j:.1}%, incumbent {i:.1}% of the solo rate ({solo_rate:.1} steps/s)"
    );
    assert!((40.0..=60.0).contains(&j), "joiner {j:.1}%\n{ctx}");
    assert!((40.0..=60.0).contains(&i), "incumbent {i:.1}%\n{ctx}");
}

/// Hierarchical shares: a pod cgroup at 50 whose two containers (child cgroups without a
/// share of their own, each a ledger) both saturate gets 50 between them, next to another
/// tenant at 50 — not 50 each (which left the neighbour a third).
#[test]
fn privileged_a_pods_share_is_split_among_its_containers() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clsteam");
    let agent = w.agent();
    let solo_rate = solo(&w, &agent, saturating(3000));
    let pod = fgpu_testkit::Cgroup::new(&fgpu_testkit::unique("fgpu-cls-pod"));
    w.set_limits(&pod, &["--compute", "50"]);
    let name = pod.path.trim_start_matches('/').to_string();
    let c1 = fgpu_testkit::Cgroup::new(&format!("{name}/c1"));
    let c2 = fgpu_testkit::Cgroup::new(&format!("{name}/c2"));
    let mut other = vec![tenant(
        &w,
        "other",
        &["--compute", "50"],
        &[saturating(6000)],
    )];
    let mut members = [
        start(&w, &c1, &saturating(6000)),
        start(&w, &c2, &saturating(6000)),
    ];
    go(&mut other);
    for p in &mut members {
        p.release();
    }
    let ctx = format!("agent log:\n{}", agent.log_text());
    let pct = |f: &Finished| 100.0 * rate(f) / solo_rate;
    let m: Vec<f64> = members
        .into_iter()
        .map(|p| {
            let f = p.finish();
            assert_eq!(f.code, Some(0), "{f}\n{ctx}");
            pct(&f)
        })
        .collect();
    let o = finish(other, &agent)[0][0] * 100.0 / solo_rate;
    println!(
        "pod at 50 with two containers vs a tenant at 50: containers {:.1}% + {:.1}% = {:.1}%, other {o:.1}% of the solo rate",
        m[0],
        m[1],
        m[0] + m[1]
    );
    within(o, 50.0, 7.0, "the other tenant", &ctx);
    within(
        m[0] + m[1],
        50.0,
        7.0,
        "the pod's two containers together",
        &ctx,
    );
    for (i, x) in m.iter().enumerate() {
        within(*x, 25.0, 6.0, &format!("container {}", i + 1), &ctx);
    }
}

/// Issue 25 item 4: two tenants that leave the device idle between steps (1 ms of work,
/// a sync, 1 ms of host time) each get more with the device open than their turns give
/// (50% each): the agent measures both ways (a trial open after 4 s) and serves them open
/// or co-running. Over 12 s, the first ~5 in turns: each well over half its solo rate.
#[test]
fn privileged_tenants_that_leave_the_device_idle_share_it_open() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clsopen");
    let agent = w.agent();
    let solo_rate = solo(&w, &agent, steps(3000, 1, 1000));
    let mut ts = vec![
        tenant(
            &w,
            "gapped-a",
            &["--compute", "50"],
            &[steps(12_000, 1, 1000)],
        ),
        tenant(
            &w,
            "gapped-b",
            &["--compute", "50"],
            &[steps(12_000, 1, 1000)],
        ),
    ];
    let paths: Vec<String> = ts.iter().map(|t| t.cg.path.clone()).collect();
    go(&mut ts);
    std::thread::sleep(Duration::from_secs(9));
    let (_, status) = w.fgpu(&["status"]);
    let rates = finish(ts, &agent);
    let ctx = format!("status at 9 s:\n{status}\nagent log:\n{}", agent.log_text());
    let pct: Vec<f64> = rates.iter().map(|r| 100.0 * r[0] / solo_rate).collect();
    println!(
        "two gapped loops at 50/50 (alone {solo_rate:.1} steps/s): {:.1}% / {:.1}% of their solo rates",
        pct[0], pct[1]
    );
    assert!(
        agent.log_text().contains("compute: open trial measured"),
        "the device was never tried open\n{ctx}"
    );
    for (p, path) in pct.iter().zip(&paths) {
        assert!(*p >= 60.0, "{path}: {p:.1}% (turns alone give 50)\n{ctx}");
    }
}
