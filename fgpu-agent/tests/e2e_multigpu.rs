//! End-to-end on simulated nodes of two and four GPUs (issue 14): the kernel's figures land on the
//! physical GPU the memory is on, whatever the process's `CUDA_VISIBLE_DEVICES`; budgets
//! and the backstop act per GPU.
//!
//! Real agent, eBPF and cgroups; every workload in its own PID namespace. The agent's NVML
//! must see the workloads' simulated devices, so the agent and the workloads share one
//! simulator state file, given through the environment: this file holds one test so that
//! nothing else in the process reads the environment meanwhile.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Agent, Cgroup, Load, SimState, privileged, unique};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const UUID1: &str = "GPU-5e1a0000-0000-0000-0000-000000000001";
const UUID3: &str = "GPU-5e1a0000-0000-0000-0000-000000000003";

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "fgpu failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A cgroup's kernel figures by GPU, as `fgpu status --json` shows them (zeros left out).
fn by_gpu(row: Option<&serde_json::Value>) -> BTreeMap<u64, u64> {
    row.and_then(|r| r["devices"].as_array())
        .map(|ds| {
            ds.iter()
                .map(|d| {
                    (
                        d["device"].as_u64().unwrap(),
                        d["memory_used_bytes"].as_u64().unwrap(),
                    )
                })
                .filter(|(_, b)| *b > 0)
                .collect()
        })
        .unwrap_or_default()
}

/// `fgpu-sim-load ARGS` in `cg` (context overhead 300 MiB): [`common::spawn_sim_load`].
fn spawn(
    cg: &Cgroup,
    state: &SimState,
    agent: Option<&Agent>,
    visible: Option<&str>,
    args: &[&str],
) -> Load {
    common::spawn_sim_load(cg, state, agent, visible, "300MiB", args)
}

fn alloc_lines(load: &Load) -> Vec<String> {
    load.lines
        .iter()
        .filter(|l| l.starts_with("alloc "))
        .cloned()
        .collect()
}

#[test]
fn privileged_two_and_four_gpus_figures_budgets_and_backstop_land_on_the_right_gpu() {
    if !privileged() {
        return;
    }
    for gpus in [2, 4] {
        node_of(gpus);
    }
}

/// Every check on a node of `gpus` simulated GPUs, with an agent and state file of its own.
fn node_of(gpus: u32) {
    let (state, agent) = common::sim_node(gpus);

    // 1. Bypassing processes: every kernel-probed allocation path, under the CUDA ordinals
    //    of `CUDA_VISIBLE_DEVICES`, lands on the physical GPU (NVML index) it is on.
    let uuid3 = format!("2,{UUID3}");
    let mut cases: Vec<(Option<&str>, &[&str], u64)> = vec![
        (None, &["device", "1", "alloc", "1GiB"], 1),
        (
            Some("1"),
            &["alloc-api", "vmm", "512MiB", "alloc", "512MiB"],
            1,
        ),
        (
            Some("1,0"),
            &["device", "1", "alloc-api", "pitch", "1GiB"],
            0,
        ),
        (Some(UUID1), &["alloc-api", "pool", "1GiB"], 1),
        (
            Some("1,0"),
            &["alloc-api", "async", "512MiB", "alloc-api", "vmm", "512MiB"],
            1,
        ),
    ];
    if gpus == 4 {
        cases.push((
            Some("3,1"),
            &["device", "1", "alloc-api", "pool", "1GiB"],
            1,
        ));
        cases.push((Some(&uuid3), &["device", "1", "alloc", "1GiB"], 3));
        cases.push((None, &["device", "3", "alloc-api", "vmm", "1GiB"], 3));
    }
    for (visible, args, gpu) in cases {
        let cg = Cgroup::new(&unique("fgpu-e2e-mg"));
        let mut all = args.to_vec();
        all.push("hold");
        let mut load = spawn(&cg, &state, None, visible, &all);
        load.expect_line("ready");
        let want = BTreeMap::from([(gpu, GIB)]);
        agent.wait_for(
            &cg,
            &format!("{gpus} GPUs, {visible:?} {args:?}: 1 GiB on GPU {gpu}"),
            Duration::from_secs(5),
            |s| by_gpu(s) == want,
        );
        load.finish();
    }

    // 2. Budgets per GPU: a 2 GiB limit; a bypassing process holds 1 GiB on GPU 1 only.
    //    A shim process of the same cgroup still gets its full 2 GiB on GPU 0, and on GPU 1
    //    what the bypasser left, then OUT_OF_MEMORY.
    let cg = Cgroup::new(&unique("fgpu-e2e-mg-limit"));
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "2GiB"]));
    let mut bypass = spawn(&cg, &state, None, Some("1"), &["alloc", "1GiB", "hold"]);
    bypass.expect_line("ready");
    agent.wait_for(
        &cg,
        "the bypasser's 1 GiB on GPU 1",
        Duration::from_secs(5),
        |s| by_gpu(s) == BTreeMap::from([(1, GIB)]),
    );
    let mut shim = spawn(
        &cg,
        &state,
        Some(&agent),
        None,
        &[
            "alloc", "1GiB", "alloc", "512MiB", "info", "device", "1", "alloc", "1GiB", "alloc",
            "512MiB", "info", "hold",
        ],
    );
    shim.expect_line("ready");
    let allocs = alloc_lines(&shim);
    let rcs: Vec<&str> = allocs
        .iter()
        .map(|l| l.split_whitespace().find(|t| t.starts_with("rc=")).unwrap())
        .collect();
    // GPU 0: 300 MiB context + 1.5 GiB = 1.8 GiB of 2; GPU 1: 1 GiB bypass + 300 MiB
    // context + 1 GiB is over (CUDA_ERROR_OUT_OF_MEMORY), + 512 MiB fits.
    assert_eq!(rcs, ["rc=0", "rc=0", "rc=2", "rc=0"], "{:?}", shim.lines);
    let free: Vec<u64> = shim
        .lines
        .iter()
        .filter(|l| l.starts_with("info free="))
        .map(|l| {
            l["info free=".len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(
        free,
        [
            2 * GIB - 300 * MIB - 1536 * MIB,
            2 * GIB - GIB - 300 * MIB - 512 * MIB
        ],
        "cuMemGetInfo per GPU: {:?}",
        shim.lines
    );
    shim.finish();
    bypass.finish();

    // 3. The backstop per GPU: 2.5 GiB on GPU 1 under a 2 GiB limit is under 2 × 2 GiB in
    //    all, so the kernel lets it through; the agent, which knows the GPU, kills it.
    let cg = Cgroup::new(&unique("fgpu-e2e-mg-kill"));
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "2GiB"]));
    let mut over = spawn(
        &cg,
        &state,
        None,
        None,
        &[
            "device", "1", "alloc", "1GiB", "alloc", "1GiB", "alloc", "512MiB", "hold",
        ],
    );
    over.expect_line("ready");
    assert_eq!(
        alloc_lines(&over)
            .iter()
            .filter(|l| l.starts_with("alloc ok"))
            .count(),
        3,
        "{:?}",
        over.lines
    );
    let exit = over.expect_line("exit=");
    assert_eq!(
        exit,
        "exit=137",
        "SIGKILLed; agent log:\n{}",
        agent.log_text()
    );
    let log = agent.log_text();
    assert!(
        log.contains("killed the largest holder on GPU 1"),
        "agent log:\n{log}"
    );
}
