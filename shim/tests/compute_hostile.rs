//! Compute shares when a tenant is killed, stopped, frozen or hostile (issue 10), under the
//! real agent (`fgpu agent --sim`) on the simulator's one device timeline, every tenant a
//! cgroup with processes in PID namespaces of their own:
//!
//! - SIGKILL or SIGSTOP while a tenant waits for a turn, or while it holds one with work in
//!   flight (found by reading its own ledger page): the other is back at full speed within
//!   200 ms, and a new process in the killed container gets its share;
//! - the cgroup freezer (`docker pause`) and SIGSTOP + SIGCONT: the same, and the resumed
//!   tenant gets its share again — it banked nothing while it stood still;
//! - a tenant forging its page to hold the device, or to bank device time and spend it later.
//!
//! Workloads and tenants: common/classes.rs (as in compute_classes.rs). A pair's shares after
//! an event are checked as the work each did over the same window (`fgpu_testkit::shares`):
//! each within ±5 points of its share of what the two did together, and the two together
//! at least the busy floor (90% of one tenant alone, less half of any CPU the host stole).

mod common;

use common::agent::*;
use common::classes::*;
use common::tenants::{
    CpuMeter, Measured, Moment, assert_shares, longest_stall, progress, rate_between, usage_of,
    wait_for,
};
use fgpu_testkit::{Cgroup, mono_ns, privileged, unique};
use std::time::Duration;

/// How long a share is measured over after an event (from 500 ms after it): at 50 / 50 a
/// quantum is 200 ms of a 400 ms round, and a window must hold enough turns that one turn
/// more or less in it stays within the ±5 points asked (a 2 s window moved by ±5-8).
const SHARE_WINDOW_MS: u64 = 4000;

/// Re-executed as a client by `AgentWorld::client`; does nothing in a normal test run.
#[test]
fn client_entry() {
    if common::client::main() {
        std::process::exit(0);
    }
}

/// A tenant SIGKILLed or SIGSTOPped while it waits for a turn, or while it holds one with
/// work in flight, never holds the other off the device: the other is back at its solo rate
/// (≥ 90%) within 200 ms; after a kill, a new process in the same container gets its share.
#[test]
fn privileged_killed_or_stopped_tenants_never_stall_the_others() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clskill");
    let agent = w.agent();
    let alone = solo(&w, &agent, saturating(2000));
    for (sig, m) in [
        (libc::SIGKILL, Moment::Waiting),
        (libc::SIGKILL, Moment::Holding),
        (libc::SIGSTOP, Moment::Waiting),
        (libc::SIGSTOP, Moment::Holding),
    ] {
        let kill = sig == libc::SIGKILL;
        let what = format!("{} while {m:?}", if kill { "SIGKILL" } else { "SIGSTOP" });
        let b_ms = if kill { 11_000 } else { 4500 };
        let mut ts = vec![
            tenant(&w, "a", &["--compute", "50"], &[saturating(20_000)]),
            tenant(&w, "b", &["--compute", "50"], &[saturating(b_ms)]),
        ];
        go(&mut ts);
        std::thread::sleep(Duration::from_millis(1500));
        let a_pid = workload_pid(&ts[0]);
        let ledger = usage_of(a_pid);
        assert!(wait_for(ledger, m), "{what}: tenant a never seen {m:?}");
        // SAFETY: signalling the test's own workload process.
        assert_eq!(unsafe { libc::kill(a_pid as i32, sig) }, 0);
        let t_sig = mono_ns() / 1_000_000;
        std::thread::sleep(Duration::from_millis(1500));
        let mut b = ts.pop().unwrap();
        let mut a = ts.pop().unwrap();
        let mut newcomer = None;
        let cpu = CpuMeter::start();
        if kill {
            // A new process in the killed container, next to b for a share's window.
            let mut p = start(&w, &a.cg, &saturating(SHARE_WINDOW_MS + 1000));
            p.release();
            newcomer = Some(p);
        }
        let a2 = newcomer.map(|p| p.finish());
        let bf = b.procs.pop().unwrap().finish();
        let ctx = format!("{what}\nb: {bf}\nagent log:\n{}", agent.log_text());
        assert_eq!(bf.code, Some(0), "{ctx}");
        let p = progress(&bf.lines);
        let after = rate_between(&p, t_sig + 200, t_sig + 1200);
        let before = rate_between(&p, t_sig - 1000, t_sig);
        println!(
            "{what}: b {:.1}% before, {:.1}% from 200 ms after (solo {alone:.1} steps/s)",
            100.0 * before / alone,
            100.0 * after / alone
        );
        assert!(
            after >= 0.9 * alone,
            "b not back at full speed: {after:.1} steps/s\n{ctx}"
        );
        if let Some(a2) = a2 {
            assert_eq!(a2.code, Some(0), "the newcomer: {a2}\n{ctx}");
            let mine = 100.0 * rate(&a2) / alone;
            let a2_start = progress(&a2.lines).first().map_or(0, |s| s.0);
            let theirs =
                100.0 * rate_between(&p, a2_start + 500, a2_start + 500 + SHARE_WINDOW_MS) / alone;
            assert_shares(
                "  the newcomer in the killed container next to b",
                &[
                    Measured::new("newcomer", mine, 50.0),
                    Measured::new("b", theirs, 50.0),
                ],
                5.0,
                &cpu,
                &ctx,
            );
        }
        // Whatever is left of a (stopped, or the unshare of a killed one) goes with its
        // cgroup.
        a.cg.kill();
        a.procs.clear();
    }
}

/// `docker pause` — the cgroup freezer — on a tenant while it waits for a turn, and while it
/// holds one with work in flight, and SIGSTOP while it holds one: the other tenant is back at
/// its solo rate (≥ 90%) from 200 ms after; once thawed (SIGCONT), the stopped tenant gets its
/// share again next to it (50 ± 5 each from 500 ms after). Before the controller stopped
/// counting a stopped tenant's queued batches as activity, the thawed tenant held the device
/// for as long as it had been frozen (a at 74-78%, b stalled for 1.5 s).
#[test]
fn privileged_a_frozen_or_stopped_tenant_never_stalls_the_others_and_comes_back() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clsfreeze");
    let agent = w.agent();
    let alone = solo(&w, &agent, saturating(2000));
    for (freezer, m) in [
        (true, Moment::Waiting),
        (true, Moment::Holding),
        (false, Moment::Holding),
    ] {
        let what = format!(
            "{} while {m:?}",
            if freezer { "frozen" } else { "SIGSTOPped" }
        );
        let mut ts = vec![
            tenant(&w, "a", &["--compute", "50"], &[saturating(10_000)]),
            tenant(&w, "b", &["--compute", "50"], &[saturating(10_000)]),
        ];
        go(&mut ts);
        std::thread::sleep(Duration::from_millis(1500));
        let a_pid = workload_pid(&ts[0]);
        assert!(wait_for(usage_of(a_pid), m), "tenant a never seen {m:?}");
        let freeze = ts[0].cg.dir.join("cgroup.freeze");
        let stop = |on: bool| {
            if freezer {
                std::fs::write(&freeze, if on { "1" } else { "0" }).expect("cgroup.freeze");
            } else {
                let sig = if on { libc::SIGSTOP } else { libc::SIGCONT };
                // SAFETY: signalling the test's own workload process.
                assert_eq!(unsafe { libc::kill(a_pid as i32, sig) }, 0);
            }
        };
        stop(true);
        let t_stop = mono_ns() / 1_000_000;
        std::thread::sleep(Duration::from_millis(1500));
        stop(false);
        let t_back = mono_ns() / 1_000_000;
        let cpu = CpuMeter::start();
        let [a, b] = [0, 1].map(|i| ts[i].procs.pop().expect("process").finish());
        let ctx = format!("{what}\na: {a}\nb: {b}\nagent log:\n{}", agent.log_text());
        assert_eq!(a.code, Some(0), "{ctx}");
        assert_eq!(b.code, Some(0), "{ctx}");
        let (pa, pb) = (progress(&a.lines), progress(&b.lines));
        let stopped = 100.0 * rate_between(&pb, t_stop + 200, t_stop + 1200) / alone;
        let window = (t_back + 500, t_back + 500 + SHARE_WINDOW_MS);
        let back = 100.0 * rate_between(&pa, window.0, window.1) / alone;
        let next = 100.0 * rate_between(&pb, window.0, window.1) / alone;
        println!("{what}: b {stopped:.1}% from 200 ms after; resumed: a {back:.1}%, b {next:.1}%");
        assert!(
            stopped >= 90.0,
            "b not back at full speed: {stopped:.1}%\n{ctx}"
        );
        assert_shares(
            &format!("  {what}, resumed"),
            &[
                Measured::new("a", back, 50.0),
                Measured::new("b", next, 50.0),
            ],
            5.0,
            &cpu,
            &ctx,
        );
    }
}

/// A container running two processes loses one to SIGKILL while it holds the turn with work
/// in flight: the other process keeps the container's share and the neighbour container its
/// own (50 ± 5 of the work the two do, in units of one process alone), and the neighbour is
/// never held off the device for 300 ms (the dead process's queued work and stamps go with
/// its slot).
#[test]
fn privileged_a_two_process_container_keeps_its_share_when_one_is_killed() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clskill2p");
    let agent = w.agent();
    let alone = solo(&w, &agent, saturating(2000));
    let mut ts = vec![
        tenant(
            &w,
            "two",
            &["--compute", "50"],
            &[saturating(9000), saturating(9000)],
        ),
        tenant(&w, "one", &["--compute", "50"], &[saturating(9000)]),
    ];
    go(&mut ts);
    std::thread::sleep(Duration::from_millis(1500));
    let victim = workload_pids(&ts[0])[0];
    assert!(
        wait_for(usage_of(victim), Moment::Holding),
        "the two-process container never seen holding with work in flight"
    );
    // SAFETY: signalling the test's own workload process.
    assert_eq!(unsafe { libc::kill(victim as i32, libc::SIGKILL) }, 0);
    let t_kill = mono_ns() / 1_000_000;
    let cpu = CpuMeter::start();
    let one = ts.pop().unwrap().procs.pop().unwrap().finish();
    let mut two = ts.pop().unwrap();
    let survivor = two.procs.pop().unwrap().finish();
    let ctx = format!(
        "survivor: {survivor}\none: {one}\nagent log:\n{}",
        agent.log_text()
    );
    assert_eq!(survivor.code, Some(0), "{ctx}");
    assert_eq!(one.code, Some(0), "{ctx}");
    let (ps, po) = (progress(&survivor.lines), progress(&one.lines));
    let stall = longest_stall(&po, t_kill, t_kill + 2500);
    let window = (t_kill + 500, t_kill + 500 + SHARE_WINDOW_MS);
    let mine = 100.0 * rate_between(&ps, window.0, window.1) / alone;
    let theirs = 100.0 * rate_between(&po, window.0, window.1) / alone;
    println!(
        "one of two processes SIGKILLed while holding: the survivor {mine:.1}%, the neighbour \
         {theirs:.1}% (longest stall {stall} ms)"
    );
    assert!(stall < 300, "the neighbour stalled {stall} ms\n{ctx}");
    assert_shares(
        "  after the kill",
        &[
            Measured::new("survivor", mine, 50.0),
            Measured::new("neighbour", theirs, 50.0),
        ],
        5.0,
        &cpu,
        &ctx,
    );
    two.cg.kill();
    two.procs.clear();
}

/// A hostile tenant at 50 sits still for 3 s while its page says it has batches in flight
/// (to bank device time), then launches flat out: its neighbour at 50, saturating, still
/// gets its share through the burst (≥ 45% of its solo rate, never more than 300 ms without
/// progress), and the burster no more than its share (≤ 55%).
#[test]
fn privileged_a_tenant_cannot_bank_device_time_and_spend_it_later() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clsbank");
    let agent = w.agent();
    let alone = solo(&w, &agent, saturating(2000));
    let hostile = Cgroup::new(&unique("fgpu-cls-banker"));
    w.set_limits(&hostile, &["--compute", "50"]);
    let mut ts = vec![tenant(
        &w,
        "honest",
        &["--compute", "50"],
        &[saturating(7000)],
    )];
    let mut burst = start(&w, &hostile, &saturating(3000));
    let forger = w.client(&hostile, &[], "forge-compute", &["3000", "1"]);
    go(&mut ts);
    let f = forger.finish();
    let t_burst = mono_ns() / 1_000_000;
    burst.release();
    let b = burst.finish();
    let honest = ts.pop().unwrap().procs.pop().unwrap().finish();
    let ctx = format!(
        "forger: {f}\nburst: {b}\nhonest: {honest}\nagent log:\n{}",
        agent.log_text()
    );
    assert_eq!(f.code, Some(0), "{ctx}");
    assert_eq!(b.code, Some(0), "{ctx}");
    assert_eq!(honest.code, Some(0), "{ctx}");
    let p = progress(&honest.lines);
    let (t0, t1) = (t_burst + 300, t_burst + 2800);
    let stall = longest_stall(&p, t_burst, t1);
    assert!(
        stall < 300,
        "the honest tenant made no progress for {stall} ms in the burst\n{ctx}"
    );
    let got = 100.0 * rate_between(&p, t0, t1) / alone;
    let theirs = 100.0 * rate(&b) / alone;
    println!("after 3 s of forged queued work, the burst: honest {got:.1}%, burster {theirs:.1}%");
    assert!(got >= 45.0, "honest tenant at {got:.1}%\n{ctx}");
    assert!(theirs <= 55.0, "the burster got {theirs:.1}%\n{ctx}");
}

/// A hostile tenant at 50 writes into its own usage page, for 4 s, what would make a naive
/// controller wait for it forever — fresh waiting and launch stamps for every process and
/// device, huge queued work, measured GPU time that keeps it in turns — and never launches. Its neighbour at 50, saturating, still
/// gets its share (≥ 45% of its solo rate) and is never held off the device for more than a
/// turn and a drain (progress in every 300 ms); its forged stamps raise its queue bound by
/// at most the 4× cap.
#[test]
fn privileged_a_tenant_forging_its_page_cannot_hold_the_device() {
    if !privileged() {
        return;
    }
    let _one = common::tenants::measuring();
    let w = AgentWorld::new("clsforge");
    let agent = w.agent();
    let alone = solo(&w, &agent, saturating(2000));
    let hostile = Cgroup::new(&unique("fgpu-cls-forger"));
    w.set_limits(&hostile, &["--compute", "50"]);
    let mut ts = vec![tenant(
        &w,
        "honest",
        &["--compute", "50"],
        &[saturating(5000)],
    )];
    let forger = w.client(&hostile, &[], "forge-compute", &["4500"]);
    go(&mut ts);
    std::thread::sleep(Duration::from_millis(2000));
    let (_, status) = w.fgpu(&["status", "--json"]);
    let f = forger.finish();
    let honest = ts.pop().unwrap().procs.pop().unwrap().finish();
    let ctx = format!(
        "forger: {f}\nhonest: {honest}\nagent log:\n{}",
        agent.log_text()
    );
    assert_eq!(f.code, Some(0), "{ctx}");
    assert!(f.line("forge done").contains("writes="), "{ctx}");
    assert_eq!(honest.code, Some(0), "{ctx}");
    let p = progress(&honest.lines);
    let (t0, t1) = (p[0].0 + 500, p[p.len() - 1].0);
    let got = 100.0 * rate_between(&p, t0, t1) / alone;
    let stall = longest_stall(&p, t0, t1);
    assert!(
        stall < 300,
        "the honest tenant made no progress for {stall} ms\n{ctx}"
    );
    println!("next to a tenant forging its page: honest tenant at {got:.1}% of its solo rate");
    assert!(got >= 45.0, "honest tenant at {got:.1}%\n{ctx}");
    // Fresh stamps in every slot scale the forger's queue bound by at most 4 × 4 ms.
    let v: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let queue = v
        .as_array()
        .and_then(|a| a.iter().find(|r| r["cgroup"] == hostile.path.as_str()))
        .and_then(|r| r["compute_queue_us"].as_u64())
        .unwrap_or_else(|| panic!("no queue bound for {}: {status}", hostile.path));
    println!("the forger's queue bound: {queue} us");
    assert!(queue <= 16_000, "forger's queue bound {queue} us\n{status}");
}
