//! HIP with the real agent (`fgpu agent --sim`) on the simulated HIP runtime: a limit set
//! with `fgpu limit set` reaches HIP processes (their devices bound by HIP UUID to the same
//! ledger records as CUDA's), the probes attach to the simulator's `libamdhip64.so` and
//! attribute its allocations to the cgroup, and without the shim's HIP enforcement the kernel
//! backstop kills the allocation that goes over. No AMD GPU is involved (docs/amd.md).
//!
//! `privileged_*` tests need root (eBPF, cgroups, PID namespaces).

mod common;

use common::agent::*;
use common::{GIB, MIB, field};
use std::time::{Duration, Instant};

/// The cgroup's row of `fgpu status --json`, once `done` holds (within 5 s).
fn wait_row(
    w: &AgentWorld,
    cg: &Cgroup,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, out) = w.fgpu(&["status", "--json"]);
        let rows: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let row = rows
            .as_array()
            .and_then(|a| a.iter().find(|r| r["cgroup"] == cg.path.as_str()).cloned());
        if let Some(r) = row.filter(|r| done(r)) {
            return r;
        }
        assert!(Instant::now() < deadline, "{what}: {out}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn privileged_agent_limits_reach_hip_processes_and_the_kernel_attributes_them() {
    if !privileged() {
        return;
    }
    let (w, bin) = hip_world("hip-agent");
    let agent = w.agent();
    let cg = Cgroup::new(&unique("fgpu-hip-agent"));
    w.set_limit(&cg, "1GiB");
    // The first step gives the agent's watcher time to attach to the freshly mapped library.
    // The harness sets FGPU_CONTEXT_OVERHEAD=300MiB, charged at the first HIP use: 724 MiB
    // are left to allocate.
    let args = "sleep 1500 info alloc-api malloc 512MiB alloc-api async 112MiB \
                alloc-api vmm 100MiB alloc-api malloc 1 info smi hold";
    let args: Vec<&str> = args.split_whitespace().collect();
    let mut p = Proc::start(w.command(&cg, &[], &bin, &args));
    p.expect("ready");
    let row = wait_row(&w, &cg, "the kernel sees the HIP allocations", |r| {
        r["memory_used_bytes"] == 724 * MIB
    });
    let (_, libs) = w.fgpu(&["status", "--json", "--detail"]);
    p.release();
    let f = p.finish();
    let ctx = format!("{f}\nrow {row}\nagent log:\n{}", agent.log_text());
    assert_eq!(
        f.allocs(),
        vec![Ok(512 * MIB), Ok(112 * MIB), Ok(100 * MIB), Err(2)],
        "{ctx}"
    );
    let infos: Vec<&String> = f.lines.iter().filter(|l| l.starts_with("info ")).collect();
    assert_eq!(
        field(infos[0], "total"),
        GIB,
        "hipMemGetInfo answers the agent's limit: {ctx}"
    );
    assert_eq!(
        field(infos[0], "free"),
        GIB - 300 * MIB,
        "the context is charged: {ctx}"
    );
    assert_eq!(field(infos[1], "free"), 0, "{ctx}");
    assert_eq!(field(f.line("smi device=0"), "total"), GIB, "{ctx}");
    assert_eq!(field(f.line("smi device=0"), "used"), GIB, "{ctx}");
    assert!(
        libs.contains("libamdhip64.so"),
        "probes on the sim's libamdhip64: {libs}"
    );
    assert!(
        row["alloc_denied"].as_u64().unwrap_or(0) >= 1,
        "the refusal is counted: {row}"
    );
}

#[test]
fn privileged_without_hip_enforcement_the_kernel_backstop_kills_the_allocation_over_the_limit() {
    if !privileged() {
        return;
    }
    let (w, bin) = hip_world("hip-backstop");
    let agent = w.agent();
    let cg = Cgroup::new(&unique("fgpu-hip-backstop"));
    w.set_limit(&cg, "1GiB");
    let args = [
        "sleep",
        "1500",
        "alloc-api",
        "malloc",
        "512MiB",
        "alloc-api",
        "malloc",
        "512MiB",
        "alloc-api",
        "malloc",
        "512MiB",
        "alloc-api",
        "malloc",
        "512MiB",
    ];
    let killed = |w: &AgentWorld| {
        let (_, d) = w.fgpu(&["status", "--json", "--detail"]);
        let v: serde_json::Value = serde_json::from_str(&d).unwrap_or_default();
        v["counters"]["killed"].as_u64().unwrap_or(0)
    };
    let before = killed(&w);
    let p = Proc::start(w.command(&cg, &[("FGPU_HIP", "off")], &bin, &args));
    let f = p.finish();
    let ctx = format!("{f}\nagent log:\n{}", agent.log_text());
    assert_eq!(
        f.allocs(),
        vec![Ok(512 * MIB), Ok(512 * MIB)],
        "the third 512 MiB takes the cgroup over 1 GiB: killed before it returns: {ctx}"
    );
    assert_ne!(f.code, Some(0), "killed: {ctx}");
    // The exit releases everything: the cgroup's row goes (or shows 0).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, out) = w.fgpu(&["status", "--json"]);
        let rows: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let used = rows.as_array().and_then(|a| {
            a.iter()
                .find(|r| r["cgroup"] == cg.path.as_str())
                .map(|r| r["memory_used_bytes"].as_u64().unwrap_or(u64::MAX))
        });
        if used.unwrap_or(0) == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not released: {out}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(killed(&w), before + 1, "one kernel kill: {ctx}");
}
