//! The compute-class tests' tenants and workloads (compute_classes.rs, compute_hostile.rs):
//! `fgpu-sim-load steps-for` loops of several shapes, a tenant = a cgroup with a compute
//! setting and its processes held at the start line until [`go`], and their rates.

use super::agent::{Agent, AgentWorld, Cgroup, Finished, Proc, unique};
use super::field;

/// 10 × 1 ms kernels and a sync per step, no host time: saturating.
pub fn saturating(ms: u64) -> Vec<String> {
    steps(ms, 10, 0)
}

/// 10 × 1 ms kernels, a sync and 2 ms of host time per step (the GPU idles 1/6 of a step).
pub fn gapped(ms: u64) -> Vec<String> {
    steps(ms, 10, 2000)
}

/// One 1 ms kernel, a sync and 4 ms of host time per step (a decoder streaming tokens, a
/// small-batch inference server).
pub fn latency_bound(ms: u64) -> Vec<String> {
    steps(ms, 1, 4000)
}

/// 200 launches of 20 µs kernels per step, each after 25 µs of host work, then a sync: the
/// launching thread, not the device, is the bottleneck (a framework's Python between
/// kernels).
pub fn cpu_bound(ms: u64) -> Vec<String> {
    let mut v = vec![
        "steps-for".into(),
        ms.to_string(),
        "200".into(),
        "sleep_20us".into(),
        "0".into(),
    ];
    v.push("25".into());
    v
}

/// `saturating` on `threads` threads of one process, each on a stream of its own.
pub fn threaded(ms: u64, threads: u64) -> Vec<String> {
    [
        "steps-threads",
        &ms.to_string(),
        &threads.to_string(),
        "10",
        "sleep_1000us",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

pub fn steps(ms: u64, k: u64, gap_us: u64) -> Vec<String> {
    vec![
        "steps-for".into(),
        ms.to_string(),
        k.to_string(),
        "sleep_1000us".into(),
        gap_us.to_string(),
    ]
}

/// A tenant: its cgroup (with a compute setting, or none) and its processes, held at the
/// start line until [`go`].
pub struct Tenant {
    pub name: String,
    pub cg: Cgroup,
    pub procs: Vec<Proc>,
}

pub fn tenant(w: &AgentWorld, name: &str, options: &[&str], work: &[Vec<String>]) -> Tenant {
    let cg = Cgroup::new(&unique(&format!("fgpu-cls-{name}")));
    if !options.is_empty() {
        w.set_limits(&cg, options);
    }
    let procs = work.iter().map(|wk| start(w, &cg, wk)).collect();
    Tenant {
        name: name.into(),
        cg,
        procs,
    }
}

/// One process in `cg` running `work` once released.
pub fn start(w: &AgentWorld, cg: &Cgroup, work: &[String]) -> Proc {
    let mut args = vec!["hold"];
    args.extend(work.iter().map(String::as_str));
    let mut p = w.load(cg, &[("FGPU_LOG", "info")], &args);
    p.expect("ready");
    p
}

/// Releases every process of every tenant at once.
pub fn go(tenants: &mut [Tenant]) {
    for t in tenants.iter_mut() {
        for p in &mut t.procs {
            p.release();
        }
    }
}

/// Steps per second of a finished `steps-for`.
pub fn rate(f: &Finished) -> f64 {
    let line = f.line("steps-for ok");
    let elapsed: f64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("elapsed_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed_ms in {line}"));
    field(line, "steps") as f64 * 1000.0 / elapsed
}

/// Each process's rate, per tenant (all processes run to their end).
pub fn finish(tenants: Vec<Tenant>, agent: &Agent) -> Vec<Vec<f64>> {
    tenants
        .into_iter()
        .map(|mut t| {
            t.procs
                .drain(..)
                .map(|p| {
                    let f = p.finish();
                    assert_eq!(
                        f.code,
                        Some(0),
                        "tenant {} ({}): {f}\nagent log:\n{}",
                        t.name,
                        t.cg.path,
                        agent.log_text()
                    );
                    rate(&f)
                })
                .collect()
        })
        .collect()
}

/// The rate of `work` alone (no compute setting), as a reference.
pub fn solo(w: &AgentWorld, agent: &Agent, work: Vec<String>) -> f64 {
    let mut t = vec![tenant(w, "solo", &[], &[work])];
    go(&mut t);
    finish(t, agent)[0][0]
}

pub fn within(got: f64, want: f64, tol: f64, what: &str, ctx: &str) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: {got:.1}% (want {want} ± {tol})\n{ctx}"
    );
}

/// The workload process of a tenant (in its cgroup, not the `unshare` that started it).
pub fn workload_pid(t: &Tenant) -> u32 {
    workload_pids(t)[0]
}

/// The workload process of each of a tenant's processes (the child of its `unshare`).
pub fn workload_pids(t: &Tenant) -> Vec<u32> {
    t.procs
        .iter()
        .map(|p| {
            let pid = p.pid();
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .ok()
                .and_then(|c| c.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("no workload process under {pid} in {}", t.cg.path))
        })
        .collect()
}
