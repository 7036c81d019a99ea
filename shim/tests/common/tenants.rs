//! Compute tenants for the agent tests (CUDA and HIP alike): a workload in a cgroup of its
//! own with a compute setting, held at its start line until all are released together, and
//! the shares they report.

use super::agent::{Agent, AgentWorld, Cgroup, Proc, unique};
use super::field;
use std::path::Path;

/// `elapsed_ms=` of a workload's result line.
pub fn elapsed_ms(line: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("elapsed_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed_ms in '{line}'"))
}

/// The device share a `launch-for` (n × 1 ms kernels) or `graph-for` (replays of 10 ms)
/// result line achieved, percent of its wall time.
pub fn share(line: &str) -> f64 {
    let gpu_ms = if line.starts_with("graph-for") {
        field(line, "replays") as f64 * 10.0
    } else {
        field(line, "n") as f64
    };
    100.0 * gpu_ms / elapsed_ms(line)
}

pub struct Tenant {
    pub name: String,
    pub cg: Cgroup,
    pub proc: Option<Proc>,
}

/// `program` (`hold` then `work`) in a new cgroup `fgpu-PREFIX-NAME-…` with the limit
/// `options`, waiting at its start line.
pub fn tenant_of(
    w: &AgentWorld,
    program: &Path,
    prefix: &str,
    name: &str,
    options: &[&str],
    work: &[&str],
) -> Tenant {
    let cg = Cgroup::new(&unique(&format!("fgpu-{prefix}-{name}")));
    if !options.is_empty() {
        w.set_limits(&cg, options);
    }
    let mut args = vec!["hold"];
    args.extend(work);
    let mut proc = Proc::start(w.command(&cg, &[("FGPU_LOG", "info")], program, &args));
    proc.expect("ready");
    Tenant {
        name: name.to_string(),
        cg,
        proc: Some(proc),
    }
}

/// Starts all tenants at once; returns each one's result lines (`launch-for ok` or
/// `graph-for ok`) in order, and the agent's `fgpu status --json` taken `status_after_ms` in.
pub fn run_together(
    w: &AgentWorld,
    agent: &Agent,
    tenants: &mut [Tenant],
    status_after_ms: u64,
) -> (Vec<Vec<String>>, String) {
    for t in tenants.iter_mut() {
        t.proc.as_mut().unwrap().release();
    }
    std::thread::sleep(std::time::Duration::from_millis(status_after_ms));
    let (_, status) = w.fgpu(&["status", "--json"]);
    let mut out = Vec::new();
    for t in tenants.iter_mut() {
        let f = t.proc.take().unwrap().finish();
        let ctx = format!(
            "tenant {} ({}):\n{:#?}\n{}\nagent log:\n{}",
            t.name,
            t.cg.path,
            f.lines,
            f.stderr,
            agent.log_text()
        );
        for l in f.stderr.lines().filter(|l| l.contains("compute gate")) {
            println!("  {}: {l}", t.name);
        }
        assert_eq!(f.code, Some(0), "{ctx}");
        assert!(
            !f.stderr.contains("capping at"),
            "the agent's controller was there all along: {ctx}"
        );
        let results: Vec<String> = f
            .lines
            .iter()
            .filter(|l| l.starts_with("launch-for ok") || l.starts_with("graph-for ok"))
            .cloned()
            .collect();
        assert!(!results.is_empty(), "{ctx}");
        out.push(results);
    }
    (out, status)
}

/// The compute figures of `cgroup` in a `fgpu status --json` report: (share, used %).
pub fn status_compute(status: &str, cgroup: &str) -> (Option<u64>, Option<f64>) {
    let v: serde_json::Value = serde_json::from_str(status).expect("status JSON");
    // `--json` prints the rows; `--json --detail` the whole report.
    let rows = v.as_array().or_else(|| v["cgroups"].as_array());
    let row = rows
        .and_then(|a| a.iter().find(|r| r["cgroup"] == cgroup))
        .unwrap_or_else(|| panic!("no row for {cgroup} in {status}"));
    (
        row["compute_share_pct"].as_u64(),
        row["compute_used_pct"].as_f64(),
    )
}
