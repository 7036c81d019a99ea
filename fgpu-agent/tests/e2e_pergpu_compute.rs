//! Per-GPU compute settings on a simulated node of two GPUs (issue 14): `fgpu limit set
//! --compute P --gpu X` gates that GPU only. Two tenants at 30 / 70 on GPU 1 get those shares
//! there (each ±3 points of the work done there, the GPU ≥ 90% busy: `fgpu_testkit::shares`);
//! a process of the 30% tenant on GPU 0 is not gated at all. `privileged_*`: the real
//! agent, needs root. Shares are GPU time over wall time (exact on the simulator's per-device
//! timeline: 1 ms kernels).

mod common;

use common::*;
use fgpu_testkit::shares::{CpuMeter, Measured, assert_shares};
use fgpu_testkit::{Cgroup, privileged, unique};

const UUID1: &str = "GPU-5e1a0000-0000-0000-0000-000000000001";

fn field(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in '{line}'"))
}

/// Percent of the device's time the `launch-for` line's 1 ms kernels took.
fn share(line: &str) -> f64 {
    100.0 * field(line, "n") / field(line, "elapsed_ms")
}

#[test]
fn privileged_per_gpu_compute_shares_gate_their_gpu_only() {
    if !privileged() {
        return;
    }
    let (state, agent) = common::sim_node(2);
    let a = Cgroup::new(&unique("fgpu-e2e-pgc-a"));
    let b = Cgroup::new(&unique("fgpu-e2e-pgc-b"));
    ok(&agent.cli(&["limit", "set", &a.path, "--compute", "30", "--gpu", "1"]));
    ok(&agent.cli(&["limit", "set", &b.path, "--compute", "70%", "--gpu", UUID1]));
    let out = agent.cli(&["limit", "get", &a.path, "--json"]);
    let entry: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(entry["own"]["compute_gpus"][UUID1], 30, "{entry}");
    assert!(
        entry["own"]["compute_pct"].is_null(),
        "no plain share: {entry}"
    );
    let table = ok(&agent.cli(&["limit", "get", &a.path]));
    assert!(
        table.contains(&format!("30%         -  on {UUID1}")),
        "{table}"
    );
    // Out of range per GPU, like the plain value: refused, nothing changed.
    let out = agent.cli(&["limit", "set", &a.path, "--compute-cap", "0", "--gpu", "1"]);
    assert!(!out.status.success());

    let run = |cg: &Cgroup, args: &[&str]| {
        let mut l = Load::spawn_with_shim(cg, &state.0, &agent, args);
        l.expect_line("ready");
        l
    };
    let k = ["launch-for", "6000", "sleep_1000us"];
    let mut a1 = run(&a, &[&["hold", "device", "1"][..], &k].concat());
    let mut b1 = run(&b, &[&["hold", "device", "1"][..], &k].concat());
    let mut a0 = run(&a, &["hold", "launch-for", "3000", "sleep_1000us"]);
    let cpu = CpuMeter::start();
    for l in [&mut a1, &mut b1, &mut a0] {
        l.release();
    }
    let (ra1, rb1, ra0) = (
        a1.expect_line("launch-for ok"),
        b1.expect_line("launch-for ok"),
        a0.expect_line("launch-for ok"),
    );
    let status = agent.status();
    let (sa1, sb1, sa0) = (share(&ra1), share(&rb1), share(&ra0));
    eprintln!("GPU 1: a {sa1:.1}% (30), b {sb1:.1}% (70); GPU 0: a {sa0:.1}% (ungated)");
    let ctx = format!("{ra1}\n{rb1}\n{ra0}\nagent log:\n{}", agent.log_text());
    assert_shares(
        "GPU 1 at 30/70",
        &[Measured::new("a", sa1, 30.0), Measured::new("b", sb1, 70.0)],
        3.0,
        &cpu,
        &ctx,
    );
    // Ungated, its rate is its launch loop's: a host that steals CPU slows it (the floor
    // gives way by half the steal, as the busy floor does); a gate would hold it near 30.
    let floor = fgpu_testkit::shares::lowered(95.0, cpu.stolen_pct());
    assert!(
        sa0 >= floor,
        "a on GPU 0 is not gated: {sa0:.1} (want >= {floor:.1})\n{ctx}"
    );
    // `fgpu status --json` carries the per-GPU setting.
    let row = status
        .as_array()
        .and_then(|r| r.iter().find(|r| r["cgroup"] == a.path.as_str()))
        .cloned()
        .unwrap_or_else(|| panic!("no row for {}: {status}", a.path));
    assert_eq!(row["compute_share_gpus"][UUID1], 30, "{row}");
    for l in [a1, b1, a0] {
        assert!(l.finish().success());
    }
}
