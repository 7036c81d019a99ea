//! End-to-end: the synchronous kernel backstop and hierarchical limits (issue 11).
//!
//! Real agent on the simulated driver, real cgroups in the v2 hierarchy, every workload in
//! its own PID namespace with its own /proc.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    Agent, Cgroup, Load, SimState, exit_status, log_lines, ok, privileged, spawn_bypass, unique,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// What `Load::spawn_with_shim` tells the shim a context costs.
const OVERHEAD: u64 = 300 * MIB;

/// `alloc SIZE` `n` times.
fn allocs(n: usize, size: &str) -> Vec<&str> {
    std::iter::repeat_n(["alloc", size], n).flatten().collect()
}

/// Output lines of successful allocations.
fn held(lines: &[String]) -> u64 {
    lines.iter().filter(|l| l.starts_with("alloc ok")).count() as u64
}

/// Busy loops on every core, outside the test's cgroups, killed on drop.
struct Spinners(Vec<Child>);

impl Spinners {
    fn start() -> Self {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get()) * 2;
        Self(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("starting a spinner")
                })
                .collect(),
        )
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn privileged_a_bypassing_process_is_killed_at_the_crossing_allocation_every_time_under_load() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let _spin = Spinners::start();
    const RUNS: usize = 20;
    let mut killed_at = Vec::new();
    for run in 0..RUNS {
        let state = SimState::new();
        let cg = Cgroup::new(&unique("fgpu-e2e-bypass"));
        ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "1GiB"]));
        // 40 × 256 MiB as fast as the process can; 4 fit the 1 GiB limit exactly. (A process
        // that is not stopped ends by itself after the sleep.)
        let mut args = allocs(40, "256MiB");
        args.extend(["sleep", "2000"]);
        let mut load = spawn_bypass(&cg, &state, &args);
        load.expect_line("init rc=0");
        let status = exit_status(&mut load);
        assert_eq!(
            status,
            128 + libc::SIGKILL,
            "run {run}: not killed: {:?}",
            load.lines
        );
        let n = held(&load.lines);
        assert_eq!(
            n, 4,
            "run {run}: the process saw {n} allocations succeed, not the 4 that fit: {:?}",
            load.lines
        );
        // The kernel's records name the cgroup whose limit was crossed.
        let needle = format!("cgroup=\"{}\"", cg.path);
        let records = log_lines(&agent, &["over limit", &needle], 1);
        assert_eq!(
            records.len(),
            1,
            "run {run}: one kernel record of the crossing allocation: {records:?}\n{}",
            agent.log_text()
        );
        let r = &records[0];
        assert!(
            r.contains("allocation of 256MiB")
                && r.contains(&format!("({} bytes)", 5 * 256 * MIB))
                && r.contains("killed by the kernel"),
            "run {run}: {r}"
        );
        let row = agent
            .wait_for(&cg, "the kill counted", Duration::from_secs(3), |s| {
                s.is_none_or(|s| s["memory_used_bytes"] == 0)
            })
            .map(|r| r["memory_used_bytes"].clone());
        assert!(
            row.clone().is_none_or(|b| b == 0),
            "released at exit: {row:?}"
        );
        killed_at.push(n + 1);
    }
    let detail = agent.detail();
    assert!(
        detail["counters"]["killed"].as_u64().unwrap() >= RUNS as u64,
        "{detail}"
    );
    eprintln!(
        "{RUNS}/{RUNS} runs killed at the crossing allocation (allocation number {:?}) with every core busy",
        killed_at
    );
}

#[test]
fn privileged_bypassing_children_of_a_pod_are_held_by_the_pods_limit_together() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let pod = Cgroup::new(&unique("fgpu-e2e-pod"));
    ok(&agent.cli(&["limit", "set", &pod.path, "--memory", "8GiB"]));
    // Created after the limit was set: they share it.
    let a = Cgroup::new(&format!("{}/a", pod.path.trim_start_matches('/')));
    let b = Cgroup::new(&format!("{}/b", pod.path.trim_start_matches('/')));
    let out = ok(&agent.cli(&["limit", "get", &b.path, "--json"]));
    let entry: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(entry["effective"]["memory_bytes"], 8 * GIB, "{entry}");
    assert_eq!(entry["memory_limit_from"], pod.path.as_str(), "{entry}");

    let mut first = allocs(20, "256MiB"); // 5 GiB
    first.push("hold");
    let mut one = Load::spawn(&a, &state.0, &first);
    one.expect_line("ready");
    // 5 GiB held by the first: the second may add 3 GiB (12 × 256 MiB), killed at the 13th.
    let mut args = allocs(20, "256MiB");
    args.extend(["sleep", "2000"]);
    let mut two = spawn_bypass(&b, &state, &args);
    let status = exit_status(&mut two);
    assert_eq!(status, 128 + libc::SIGKILL, "{:?}", two.lines);
    assert_eq!(held(&two.lines), 12, "{:?}", two.lines);
    let records = log_lines(&agent, &["over limit"], 1);
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(
        records[0].contains(&format!("cgroup=\"{}\"", pod.path)),
        "the pod's limit was crossed: {records:?}"
    );
    assert!(
        records[0].contains(&format!("({} bytes)", 33 * 256 * MIB)),
        "{records:?}"
    );
    let row = agent
        .wait_for(&pod, "the pod's row", Duration::from_secs(3), |s| {
            s.is_some_and(|s| s["memory_subtree_bytes"] == 5 * GIB)
        })
        .unwrap();
    assert_eq!(row["memory_limit_bytes"], 8 * GIB, "{row}");
    assert_eq!(row["kernel_kills"], 1, "{row}");
    let child = agent.cgroup_status(&a).unwrap();
    assert_eq!(child["memory_limit_from"], pod.path.as_str(), "{child}");
    assert!(one.finish().success());
    drop((a, b));
}

#[test]
fn privileged_children_of_a_pod_share_one_budget_through_the_shim_and_a_lower_child_limit_holds() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let pod = Cgroup::new(&unique("fgpu-e2e-pod-shim"));
    ok(&agent.cli(&["limit", "set", &pod.path, "--memory", "8GiB"]));
    let sub = |n: &str| Cgroup::new(&format!("{}/{n}", pod.path.trim_start_matches('/')));
    let (c, d, small) = (sub("c"), sub("d"), sub("small"));
    ok(&agent.cli(&["limit", "set", &small.path, "--memory", "2GiB"]));

    // Both with the shim, at the same time, each trying for 7 GiB.
    let mut args = allocs(28, "256MiB");
    args.push("hold");
    let mut one = Load::spawn_with_shim(&c, &state.0, &agent, &args);
    let mut two = Load::spawn_with_shim(&d, &state.0, &agent, &args);
    one.expect_line("ready");
    two.expect_line("ready");
    let (h1, h2) = (held(&one.lines), held(&two.lines));
    let together = (h1 + h2) * 256 * MIB + 2 * OVERHEAD;
    assert!(
        together <= 8 * GIB,
        "{h1} + {h2} chunks and two contexts: {together} bytes, over the pod's 8 GiB"
    );
    assert_eq!(
        h1 + h2,
        (8 * GIB - 2 * OVERHEAD) / (256 * MIB),
        "the shared budget is used up to the last chunk that fits: {h1} + {h2}"
    );
    // Whichever did not get its 7 GiB was refused with CUDA_ERROR_OUT_OF_MEMORY (2), and
    // nothing else.
    for (name, l) in [("c", &one), ("d", &two)] {
        let refused = l
            .lines
            .iter()
            .filter(|x| x.starts_with("alloc fail"))
            .collect::<Vec<_>>();
        assert_eq!(
            held(&l.lines) + refused.len() as u64,
            28,
            "{name}: {:?}",
            l.lines
        );
        assert!(
            refused.iter().all(|x| x.contains("rc=2")),
            "{name}: refused with CUDA_ERROR_OUT_OF_MEMORY (2): {:?}",
            l.lines
        );
    }
    let row = agent
        .wait_for(&c, "c's row", Duration::from_secs(3), |s| s.is_some())
        .unwrap();
    assert_eq!(row["ledger"], pod.path.as_str(), "{row}");
    assert_eq!(row["memory_limit_from"], pod.path.as_str(), "{row}");
    one.finish();
    two.finish();

    // A child with a lower limit of its own stops at it: 2 GiB less its context's 300 MiB
    // is 6 × 256 MiB.
    let out = ok(&agent.cli(&["limit", "get", &small.path, "--json"]));
    let entry: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(entry["effective"]["memory_bytes"], 2 * GIB, "{entry}");
    assert_eq!(entry["memory_limit_from"], small.path.as_str(), "{entry}");
    let mut args = allocs(28, "256MiB");
    args.push("hold");
    let mut three = Load::spawn_with_shim(&small, &state.0, &agent, &args);
    three.expect_line("ready");
    assert_eq!(held(&three.lines), 6, "{:?}", three.lines);
    assert!(
        three.lines[three.lines.len() - 2].contains("fail rc=2"),
        "{:?}",
        three.lines
    );
    // And a bypassing process there is killed at its own limit, not the pod's.
    let raw = Cgroup::new(&format!("{}/raw", small.path.trim_start_matches('/')));
    let mut args = allocs(20, "256MiB");
    args.extend(["sleep", "2000"]);
    let mut four = spawn_bypass(&raw, &state, &args);
    let status = exit_status(&mut four);
    assert_eq!(status, 128 + libc::SIGKILL, "{:?}", four.lines);
    // 1536 MiB held by the shim's process above it (the kernel does not see contexts): 2
    // more fit in /small's 2 GiB.
    assert_eq!(held(&four.lines), 2, "{:?}", four.lines);
    assert!(three.finish().success());
    drop((raw, c, d, small));
}

#[test]
fn privileged_a_shim_process_and_a_bypassing_one_in_a_pod_never_hold_more_than_its_limit() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let pod = Cgroup::new(&unique("fgpu-e2e-pod-mixed"));
    ok(&agent.cli(&["limit", "set", &pod.path, "--memory", "8GiB"]));
    let raw = Cgroup::new(&format!("{}/raw", pod.path.trim_start_matches('/')));
    let shim = Cgroup::new(&format!("{}/shim", pod.path.trim_start_matches('/')));
    let mut args = allocs(28, "256MiB"); // 7 GiB, no shim
    args.push("hold");
    let mut bypass = Load::spawn(&raw, &state.0, &args);
    bypass.expect_line("ready");
    agent.wait_for(&pod, "the pod's 7 GiB", Duration::from_secs(3), |s| {
        s.is_some_and(|s| s["memory_subtree_bytes"] == 7 * GIB)
    });
    // The shim, as fast as it can: what bypasses it (7 GiB) comes off the pod's budget, so
    // its process has 1 GiB, its 300 MiB context included: 2 × 256 MiB, then refusals
    // (CUDA_ERROR_OUT_OF_MEMORY), not a kill.
    let mut args = allocs(28, "256MiB");
    args.push("hold");
    let mut with = Load::spawn_with_shim(&shim, &state.0, &agent, &args);
    with.expect_line("ready");
    let h = held(&with.lines);
    assert_eq!(h, 2, "1 GiB - 300 MiB = 2 chunks: {:?}", with.lines);
    let refused: Vec<&String> = with
        .lines
        .iter()
        .filter(|l| l.starts_with("alloc fail"))
        .collect();
    assert!(
        refused.len() == 26 && refused.iter().all(|l| l.contains("rc=2")),
        "{:?}",
        with.lines
    );
    let row = agent.cgroup_status(&pod).unwrap();
    assert!(
        row["memory_subtree_bytes"].as_u64().unwrap() <= 8 * GIB,
        "{row}"
    );
    assert!(bypass.finish().success());
    assert!(with.finish().success());
    drop((raw, shim));
}

#[test]
fn privileged_a_tenant_that_fills_the_tracking_maps_meets_its_bound_and_others_stay_attributed() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let greedy = Cgroup::new(&unique("fgpu-e2e-greedy"));
    ok(&agent.cli(&["limit", "set", &greedy.path, "--memory", "1GiB"]));
    // FGPU_TENANT_MAX_ALLOCS (16384) live allocations are tracked; the next one is past
    // the tenant's bound: not tracked, and the policy (kill) applies to it.
    const BOUND: usize = 16384;
    let mut args = allocs(BOUND + 16, "4096");
    args.extend(["sleep", "2000"]);
    let mut load = spawn_bypass(&greedy, &state, &args);
    let status = exit_status(&mut load);
    assert_eq!(status, 128 + libc::SIGKILL, "{:?}", load.lines.last());
    assert_eq!(held(&load.lines), BOUND as u64);
    let records = log_lines(&agent, &["over bound"], 1);
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(
        records[0].contains("killed by the kernel")
            && records[0].contains(&format!("tenant=\"{}\"", greedy.path)),
        "{records:?}"
    );
    let detail = agent.detail();
    assert_eq!(detail["counters"]["over_bound"], 1, "{detail}");
    // Another tenant is still attributed, to the byte.
    let other = Cgroup::new(&unique("fgpu-e2e-other"));
    let mut two = Load::spawn(&other, &state.0, &["alloc", "256MiB", "hold"]);
    two.expect_line("ready");
    let row = agent
        .wait_for(
            &other,
            "the other tenant's row",
            Duration::from_secs(3),
            |s| s.is_some(),
        )
        .unwrap();
    assert_eq!(row["memory_used_bytes"], 256 * MIB, "{row}");
    assert!(two.finish().success());
}

#[test]
fn privileged_reconcile_reports_an_overrun_without_a_kernel_record_and_kills_its_largest_holder() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-e2e-reconcile"));
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "1GiB"]));
    let mut args = allocs(3, "256MiB");
    args.extend(["sleep", "100", "sleep", "10000"]);
    let mut load = spawn_bypass(&cg, &state, &args);
    load.expect_line("sleep ok");
    // No allocation crosses: the limit is lowered below what is held. Only the agent's
    // reconcile pass can see it; with `kill` it takes the largest holder a pass later.
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "512MiB"]));
    let start = Instant::now();
    let status = exit_status(&mut load);
    assert_eq!(status, 128 + libc::SIGKILL, "{:?}", load.lines);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(5), "killed after {took:?}");
    let reported = log_lines(&agent, &["reconcile:", "over the"], 1);
    assert_eq!(reported.len(), 1, "{reported:?}");
    let killed = log_lines(&agent, &["reconcile: killed the largest holder"], 1);
    assert_eq!(killed.len(), 1, "{}", agent.log_text());
    assert!(killed[0].contains("(768MiB)"), "{killed:?}");
}

/// A process of a pod SIGKILLed while it holds a share of the pod's limit (its slot's
/// reservation and the memory): a child with a limit of its own (a ledger of its own, whose
/// budget is derived from the pod's) whose first process starts right after gets its whole
/// share, not a budget still counting the dead process's reservation.
#[test]
fn privileged_a_holder_killed_mid_share_leaves_the_whole_share_to_a_new_sibling() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let pod = Cgroup::new(&unique("fgpu-e2e-killed-share"));
    ok(&agent.cli(&["limit", "set", &pod.path, "--memory", "4GiB"]));
    let sub = |n: &str| Cgroup::new(&format!("{}/{n}", pod.path.trim_start_matches('/')));
    let (a, b) = (sub("a"), sub("b"));
    ok(&agent.cli(&["limit", "set", &b.path, "--memory", "3584MiB"]));
    let mut args = allocs(12, "256MiB");
    args.push("hold");
    let mut one = Load::spawn_with_shim(&a, &state.0, &agent, &args);
    one.expect_line("ready");
    assert_eq!(held(&one.lines), 12, "{:?}", one.lines);
    one.kill();
    // Dead for the kernel (its memory released): its slot is the ledger's only trace of it.
    agent.wait_for(
        &pod,
        "the pod's memory released",
        Duration::from_secs(5),
        |row| row.is_none_or(|r| r["memory_used_bytes"] == 0),
    );
    let mut two = Load::spawn_with_shim(&b, &state.0, &agent, &args);
    two.expect_line("ready");
    assert_eq!(held(&two.lines), 12, "{:?}", two.lines);
    two.finish();
}
