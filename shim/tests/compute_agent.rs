//! Compute shares under the agent (issue 6): `fgpu limit set CGROUP --compute PCT` /
//! `--compute-cap PCT`, the agent's controller handing out turns on the simulator's one
//! device timeline, the shims' launch gates keeping to them. Every tenant is a cgroup with
//! processes in PID namespaces of their own, saturating the device with 1 ms kernels (10 at
//! a time, then a synchronisation, like a training loop); a tenant's achieved share is the
//! GPU time its kernels took over its wall time — the simulator runs one kernel at a time,
//! so this is exact, independent of what the gate measured.
//!
//! `privileged_*` tests run the real agent (`fgpu agent --sim`) and need root.
//! Figures are printed (`cargo test --test compute_agent -- --nocapture`).

mod common;

use common::agent::*;
use common::tenants::*;
use fgpu_testkit::privileged;

/// Re-executed as a client by `AgentWorld::client`; does nothing in a normal test run.
#[test]
fn client_entry() {
    if common::client::main() {
        std::process::exit(0);
    }
}

/// `elapsed_ms=` of a line.
fn tenant(w: &AgentWorld, name: &str, options: &[&str], work: &[&str]) -> Tenant {
    tenant_of(w, &w.load, "cmp", name, options, work)
}

/// `fgpu limit set CGROUP OPTIONS` from a thread, `ms` after now; joins to its success.
fn set_later(
    w: &AgentWorld,
    cgroup: String,
    ms: u64,
    options: &[&str],
) -> std::thread::JoinHandle<bool> {
    let (fgpu, socket) = w.fgpu_and_socket();
    let options: Vec<String> = options.iter().map(|o| o.to_string()).collect();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        std::process::Command::new(fgpu)
            .args(["limit", "set", &cgroup])
            .args(&options)
            .arg("--socket")
            .arg(socket)
            .status()
            .expect("fgpu limit set")
            .success()
    })
}

const KERNELS_10S: [&str; 3] = ["launch-for", "10000", "sleep_1000us"];

/// Two tenants at 30 / 70 for 10 s, one replaying CUDA graphs (so graph launches are what
/// is counted for it), one launching kernels: each within ±3 points of its share, and the
/// device kept busy. `fgpu status` shows the configured and achieved shares.
#[test]
fn privileged_two_tenants_at_30_70_get_their_shares() {
    if !privileged() {
        return;
    }
    let _one = measuring();
    let w = AgentWorld::new("cmp3070");
    let agent = w.agent();
    let mut ts = vec![
        tenant(
            &w,
            "g30",
            &["--compute", "30"],
            &["graph-for", "10000", "10", "sleep_1000us"],
        ),
        tenant(&w, "k70", &["--compute", "70"], &KERNELS_10S),
    ];
    expect_30_70("", &w, &agent, &mut ts);
}

/// Three tenants at 20 / 30 / 50 for 10 s: each within ±3 points.
#[test]
fn privileged_three_tenants_at_20_30_50_get_their_shares() {
    if !privileged() {
        return;
    }
    let _one = measuring();
    let w = AgentWorld::new("cmp235");
    let agent = w.agent();
    let mut ts: Vec<Tenant> = [20, 30, 50]
        .iter()
        .map(|p| {
            tenant(
                &w,
                &format!("k{p}"),
                &["--compute", &p.to_string()],
                &KERNELS_10S,
            )
        })
        .collect();
    let cpu = CpuMeter::start();
    let (results, _) = run_together(&w, &agent, &mut ts, 100);
    let shares: Vec<f64> = results.iter().map(|r| share(&r[0])).collect();
    let ctx = format!("{results:#?}\nagent log:\n{}", agent.log_text());
    let measured: Vec<Measured<'_>> = shares
        .iter()
        .zip([("k20", 20.0), ("k30", 30.0), ("k50", 50.0)])
        .map(|(&got, (name, want))| Measured { name, got, want })
        .collect();
    assert_shares("20/30/50 over 10 s", &measured, 3.0, &cpu, &ctx);
}

/// A tenant with a 30 % share takes the time its 70 % neighbour leaves: 30 % while both
/// run, nearly all of the device once the neighbour stops. A tenant with a 30 % cap alone on
/// the device stays under it.
#[test]
fn privileged_shares_are_work_conserving_and_caps_are_not() {
    if !privileged() {
        return;
    }
    let _one = measuring();
    let w = AgentWorld::new("cmpwc");
    let agent = w.agent();
    let mut ts = vec![
        tenant(
            &w,
            "s30",
            &["--compute", "30"],
            &[
                "launch-for",
                "3000",
                "sleep_1000us",
                "launch-for",
                "3000",
                "sleep_1000us",
            ],
        ),
        tenant(
            &w,
            "s70",
            &["--compute", "70"],
            &["launch-for", "3000", "sleep_1000us"],
        ),
    ];
    let (results, _) = run_together(&w, &agent, &mut ts, 100);
    let (both, alone) = (share(&results[0][0]), share(&results[0][1]));
    let other = share(&results[1][0]);
    println!(
        "work-conserving: 30% share next to a busy 70% tenant {both:.1}% (neighbour {other:.1}%), \
         after the neighbour stopped {alone:.1}%"
    );
    let ctx = format!("{results:#?}\nagent log:\n{}", agent.log_text());
    assert!((both - 30.0).abs() <= 4.0, "{ctx}");
    assert!(alone >= 90.0, "{ctx}");

    let mut ts = vec![tenant(
        &w,
        "c30",
        &["--compute-cap", "30"],
        &["launch-for", "5000", "sleep_1000us"],
    )];
    let (results, _) = run_together(&w, &agent, &mut ts, 100);
    let capped = share(&results[0][0]);
    println!("cap 30% alone on the device: {capped:.1}%");
    let ctx = format!("{results:#?}\nagent log:\n{}", agent.log_text());
    assert!((26.0..=32.0).contains(&capped), "{ctx}");
}

/// A changed setting reaches a running, gated process: a 30 % cap raised to 60 % while the
/// tenant runs.
#[test]
fn privileged_a_changed_cap_reaches_a_running_process() {
    if !privileged() {
        return;
    }
    let _one = measuring();
    let w = AgentWorld::new("cmpchg");
    let agent = w.agent();
    let mut ts = vec![tenant(
        &w,
        "chg",
        &["--compute-cap", "30"],
        &[
            "launch-for",
            "2000",
            "sleep_1000us",
            "launch-for",
            "3000",
            "sleep_1000us",
        ],
    )];
    let cg = ts[0].cg.path.clone();
    let setter = set_later(&w, cg, 2300, &["--compute-cap", "60"]);
    let (results, _) = run_together(&w, &agent, &mut ts, 100);
    assert!(setter.join().unwrap(), "fgpu limit set failed");
    let (before, after) = (share(&results[0][0]), share(&results[0][1]));
    println!("cap 30% raised to 60% while running: {before:.1}% then {after:.1}%");
    let ctx = format!("{results:#?}\nagent log:\n{}", agent.log_text());
    assert!((25.0..=33.0).contains(&before), "{ctx}");
    assert!((50.0..=63.0).contains(&after), "{ctx}");
}

/// A cap set on a running process that was not gated (its launches took the fast path)
/// reaches it within a fraction of a second: 100 % before, about 30 % after.
#[test]
fn privileged_a_cap_set_later_reaches_an_ungated_running_process() {
    if !privileged() {
        return;
    }
    let _one = measuring();
    let w = AgentWorld::new("cmplate");
    let agent = w.agent();
    let mut ts = vec![tenant(
        &w,
        "late",
        &[],
        &[
            "launch-for",
            "1000",
            "sleep_1000us",
            "launch-for",
            "3000",
            "sleep_1000us",
        ],
    )];
    let cg = ts[0].cg.path.clone();
    let setter = set_later(&w, cg, 1200, &["--compute-cap", "30"]);
    let (results, _) = run_together(&w, &agent, &mut ts, 100);
    assert!(setter.join().unwrap(), "fgpu limit set failed");
    let (before, after) = (share(&results[0][0]), share(&results[0][1]));
    println!("no limit, then a 30% cap set while running: {before:.1}% then {after:.1}%");
    let ctx = format!("{results:#?}\nagent log:\n{}", agent.log_text());
    // Ungated: the whole device, less the host's own gaps (which grow on a loaded CI
    // machine); anything near the cap would mean it was gated from the start.
    assert!(before >= 70.0, "{ctx}");
    // 0.2 s at 100 %, then 2.8 s at 30 %: about 35 %.
    assert!((28.0..=42.0).contains(&after), "{ctx}");
}
