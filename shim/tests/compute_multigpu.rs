//! Compute shares on a simulated node of two GPUs (issue 14): a process that drives both
//! GPUs at once (a thread per GPU) under a 50% share on each, beside one 50% tenant on each
//! GPU. The controller schedules each GPU on its own; nothing aligns the two GPUs' turns, and
//! the two-GPU process must neither deadlock nor lose its share on either GPU.
//!
//! Shares are GPU time over wall time per device, exact in the simulator (one kernel at a
//! time per device timeline). `privileged_*`: runs the real agent, needs root.

mod common;

use common::agent::*;
use common::field;
use fgpu_testkit::{Cgroup, privileged, unique};

const MS: &str = "6000";
const KERNEL: &str = "sleep_1000us";

fn elapsed_ms(line: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("elapsed_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed_ms in '{line}'"))
}

/// Percent of the device's time the `launch-for` line's 1 ms kernels took.
fn share(line: &str) -> f64 {
    100.0 * field(line, "n") as f64 / elapsed_ms(line)
}

#[test]
fn privileged_a_two_gpu_process_keeps_its_share_on_both_gpus_and_finishes() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("cmpmg");
    let agent = w.agent();
    let env = [("FGPU_SIM_DEVICES", "2"), ("FGPU_LOG", "info")];
    let tenants: [(&str, Vec<&str>); 3] = [
        ("both", vec!["hold", "launch-for-each", MS, KERNEL]),
        ("gpu0", vec!["hold", "launch-for", MS, KERNEL]),
        (
            "gpu1",
            vec!["hold", "device", "1", "launch-for", MS, KERNEL],
        ),
    ];
    let mut procs = Vec::new();
    for (name, args) in &tenants {
        let cg = Cgroup::new(&unique(&format!("fgpu-cmpmg-{name}")));
        w.set_limits(&cg, &["--compute", "50"]);
        let mut p = w.load(&cg, &env, args);
        p.expect("ready");
        procs.push((name, cg, p));
    }
    for (_, _, p) in &mut procs {
        p.release();
    }
    let mut shares = Vec::new();
    for (name, cg, p) in procs {
        let f = p.finish();
        let ctx = format!(
            "tenant {name} ({}):\n{:#?}\n{}\nagent log:\n{}",
            cg.path,
            f.lines,
            f.stderr,
            agent.log_text()
        );
        assert_eq!(f.code, Some(0), "finished: {ctx}");
        assert!(
            !f.stderr.contains("capping at"),
            "the agent's controller was there all along: {ctx}"
        );
        let results: Vec<&String> = f
            .lines
            .iter()
            .filter(|l| l.starts_with("launch-for ok"))
            .collect();
        let want = if *name == "both" { 2 } else { 1 };
        assert_eq!(results.len(), want, "{ctx}");
        for r in results {
            let s = share(r);
            println!("{name}: {r} -> {s:.1}%");
            shares.push((name.to_string(), s, ctx.clone()));
        }
    }
    for (name, s, ctx) in &shares {
        // 50% each of a saturated device; the two-GPU process keeps its share on both.
        assert!((s - 50.0).abs() <= 8.0, "{name}: {s:.1}%\n{ctx}");
    }
}
