//! End-to-end: per-GPU memory limits (`fgpu limit set TARGET --memory SIZE --gpu X`) on a
//! simulated node of two GPUs. The shim stops at each GPU's own limit with
//! CUDA_ERROR_OUT_OF_MEMORY and reports it as the GPU's total, whatever the process's
//! `CUDA_VISIBLE_DEVICES`; a parent's plain limit and a child's per-GPU values combine as
//! the lowest on each GPU; bad `--gpu` values change nothing; the values survive an agent
//! restart; the backstop kills a bypasser over its limit on one GPU while under it in all.
//!
//! Real agent, eBPF and cgroups; every workload in its own PID namespace. The agent and the
//! workloads share one simulator state file, given through the environment: this file
//! holds one test so that nothing else in the process reads the environment meanwhile.

mod common;

use std::time::Duration;

use common::{Agent, Cgroup, Load, SimState, privileged, unique};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const PHYSICAL: u64 = 16 * GIB;
const UUID0: &str = "GPU-5e1a0000-0000-0000-0000-000000000000";
const UUID1: &str = "GPU-5e1a0000-0000-0000-0000-000000000001";

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "fgpu failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_str(&ok(out)).expect("JSON from fgpu")
}

/// `fgpu-sim-load ARGS` in `cg` (context overhead 0, so that limits are exact): [`common::spawn_sim_load`].
fn spawn(
    cg: &Cgroup,
    state: &SimState,
    agent: Option<&Agent>,
    visible: Option<&str>,
    args: &[&str],
) -> Load {
    common::spawn_sim_load(cg, state, agent, visible, "0", args)
}

/// Runs a shim workload to its end (`hold` last: the caller checks status meanwhile) and
/// returns (the rc of each allocation, (free, total) of each `info`).
fn results(load: &Load) -> (Vec<i32>, Vec<(u64, u64)>) {
    let field = |l: &str, name: &str| -> u64 {
        l.split_whitespace()
            .find_map(|t| t.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {l}"))
            .parse()
            .unwrap()
    };
    let rcs = load
        .lines
        .iter()
        .filter(|l| l.starts_with("alloc "))
        .map(|l| field(l, "rc=") as i32)
        .collect();
    let infos = load
        .lines
        .iter()
        .filter(|l| l.starts_with("info free="))
        .map(|l| (field(l, "free="), field(l, "total=")))
        .collect();
    (rcs, infos)
}

/// Runs `args` (ending in `hold`) under the shim until `ready`; returns the load.
fn run(cg: &Cgroup, state: &SimState, agent: &Agent, visible: Option<&str>, args: &[&str]) -> Load {
    let mut load = spawn(cg, state, Some(agent), visible, args);
    load.expect_line("ready");
    load
}

/// The cgroup's per-device limits as `fgpu status --json` shows them: (device, uuid, limit).
fn status_limits(agent: &Agent, cg: &Cgroup) -> Vec<(u64, String, Option<u64>)> {
    let row = agent.cgroup_status(cg).expect("a status row");
    row["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["device"].as_u64().unwrap(),
                d["uuid"].as_str().unwrap_or("-").to_string(),
                d["limit_bytes"].as_u64(),
            )
        })
        .collect()
}

#[test]
fn privileged_per_gpu_memory_limits_stop_at_each_gpus_own_limit() {
    if !privileged() {
        return;
    }
    let (state, agent) = common::sim_node(2);

    // 1. 1 GiB on GPU 1 only, by index.
    let one = Cgroup::new(&unique("fgpu-e2e-pergpu-one"));
    ok(&agent.cli(&["limit", "set", &one.path, "--memory", "1GiB", "--gpu", "1"]));
    let entry = json(&agent.cli(&["limit", "get", &one.path, "--json"]));
    assert_eq!(entry["own"]["memory_gpus"][UUID1], GIB, "{entry}");
    assert!(entry["own"]["memory_bytes"].is_null(), "{entry}");
    let table = ok(&agent.cli(&["limit", "get", &one.path]));
    assert!(
        table
            .lines()
            .any(|l| l.contains("1GiB") && l.contains(UUID1)),
        "{table}"
    );

    // Through CUDA_VISIBLE_DEVICES=1: the process's ordinal 0 is GPU 1.
    let load = run(
        &one,
        &state,
        &agent,
        Some("1"),
        &[
            "info", "alloc", "512MiB", "alloc", "512MiB", "alloc", "1MiB", "info", "hold",
        ],
    );
    assert_eq!(
        results(&load),
        (vec![0, 0, 2], vec![(GIB, GIB), (0, GIB)]),
        "{:?}",
        load.lines
    );
    // `fgpu status`: GPU 1's limit is 1 GiB, GPU 0 has none.
    agent.wait_for(&one, "the 1 GiB on GPU 1", Duration::from_secs(5), |r| {
        r.is_some_and(|r| r["memory_used_bytes"] == GIB)
    });
    assert_eq!(
        status_limits(&agent, &one),
        [(0, UUID0.into(), None), (1, UUID1.into(), Some(GIB))]
    );
    let row = agent.cgroup_status(&one).unwrap();
    assert_eq!(row["memory_limit_gpus"][UUID1], GIB, "{row}");
    assert!(row["memory_limit_bytes"].is_null(), "{row}");
    let table = ok(&agent.cli(&["status"]));
    let at = table
        .lines()
        .position(|l| l.starts_with(&one.path))
        .unwrap_or_else(|| panic!("{table}"));
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[at].contains("per GPU"), "{table}");
    assert!(
        lines[at + 2].starts_with("  GPU 1")
            && lines[at + 2].contains(UUID1)
            && lines[at + 2].trim_end().ends_with("1GiB"),
        "{table}"
    );
    load.finish();

    // By index, no CUDA_VISIBLE_DEVICES: GPU 1 stops at 1 GiB, GPU 0 is unlimited.
    let load = run(
        &one,
        &state,
        &agent,
        None,
        &[
            "device", "1", "info", "alloc", "1GiB", "alloc", "1MiB", "device", "0", "info",
            "alloc", "2GiB", "hold",
        ],
    );
    let (rcs, infos) = results(&load);
    assert_eq!(rcs, [0, 2, 0], "{:?}", load.lines);
    assert_eq!(infos[0], (GIB, GIB), "{:?}", load.lines);
    assert_eq!(
        infos[1].1, PHYSICAL,
        "GPU 0: the driver's own figures: {:?}",
        load.lines
    );
    load.finish();

    // The agent's denial line names the per-GPU limit.
    let want = format!("refused at the - (1GiB on {UUID1}) limit");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !agent.log_text().contains(&want) {
        assert!(
            std::time::Instant::now() < deadline,
            "no '{want}' in the agent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // 2. Different values on GPU 0 (by index) and GPU 1 (by full UUID), set one at a time:
    //    setting GPU 1 keeps GPU 0's value.
    let two = Cgroup::new(&unique("fgpu-e2e-pergpu-two"));
    ok(&agent.cli(&["limit", "set", &two.path, "--memory", "2GiB", "--gpu", "0"]));
    ok(&agent.cli(&[
        "limit", "set", &two.path, "--memory", "1GiB", "--gpu", UUID1,
    ]));
    let entry = json(&agent.cli(&["limit", "get", &two.path, "--json"]));
    assert_eq!(
        entry["own"]["memory_gpus"],
        serde_json::json!({ UUID0: 2 * GIB, UUID1: GIB }),
        "{entry}"
    );
    let load = run(
        &two,
        &state,
        &agent,
        None,
        &[
            "alloc", "2GiB", "alloc", "1MiB", "info", "device", "1", "alloc", "1GiB", "alloc",
            "1MiB", "info", "hold",
        ],
    );
    assert_eq!(
        results(&load),
        (vec![0, 2, 0, 2], vec![(0, 2 * GIB), (0, GIB)]),
        "{:?}",
        load.lines
    );
    load.finish();

    // 3. A parent's plain limit and a child's per-GPU values: the lowest on each GPU.
    let parent = Cgroup::new(&unique("fgpu-e2e-pergpu-parent"));
    let child = Cgroup::new(&format!("{}/job", parent.path.trim_start_matches('/')));
    ok(&agent.cli(&["limit", "set", &parent.path, "--memory", "2GiB"]));
    ok(&agent.cli(&[
        "limit",
        "set",
        &child.path,
        "--memory",
        "4GiB",
        "--gpu",
        "0",
    ]));
    ok(&agent.cli(&[
        "limit",
        "set",
        &child.path,
        "--memory",
        "512MiB",
        "--gpu",
        "1",
    ]));
    let entry = json(&agent.cli(&["limit", "get", &child.path, "--json"]));
    assert_eq!(
        entry["effective"]["memory_gpus"],
        serde_json::json!({ UUID0: 2 * GIB, UUID1: 512 * MIB }),
        "{entry}"
    );
    assert_eq!(entry["effective"]["memory_bytes"], 2 * GIB, "{entry}");
    let load = run(
        &child,
        &state,
        &agent,
        Some("1,0"),
        &[
            "info", "alloc", "512MiB", "alloc", "1MiB", "device", "1", "info", "alloc", "2GiB",
            "alloc", "1MiB", "hold",
        ],
    );
    assert_eq!(
        results(&load),
        (
            vec![0, 2, 0, 2],
            vec![(512 * MIB, 512 * MIB), (2 * GIB, 2 * GIB)]
        ),
        "ordinal 0 is GPU 1 (512 MiB), ordinal 1 is GPU 0 (the parent's 2 GiB): {:?}",
        load.lines
    );
    load.finish();

    // 4. Bad --gpu values: one clear line, a non-zero exit, nothing changed.
    let before = json(&agent.cli(&["limit", "ls", "--json"]));
    for (gpu, says) in [
        ("5", "no GPU of index 5"),
        (
            "MIG-5e1a0000-0000-0000-0000-000000000001",
            "MIG instances are not supported",
        ),
        ("GPU-5e1a", "is ambiguous"),
        ("GPU-ffff", "no GPU has this UUID"),
    ] {
        for target in [&one.path, &two.path] {
            let out = agent.cli(&["limit", "set", target, "--memory", "3GiB", "--gpu", gpu]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "--gpu {gpu} was accepted: {err}");
            assert!(err.contains(says), "--gpu {gpu}: {err}");
            assert!(
                err.contains(UUID0) && err.contains(UUID1),
                "names the GPUs: {err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        }
    }
    let out = agent.cli(&[
        "limit", "set", &one.path, "--memory", "3GiB", "--gpu", "0", "--gpu", "7",
    ]);
    assert!(!out.status.success(), "a bad GPU among good ones");
    let out = agent.cli(&["limit", "set", &one.path, "--gpu", "0"]);
    assert!(!out.status.success(), "--gpu without a value");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--memory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        json(&agent.cli(&["limit", "ls", "--json"])),
        before,
        "nothing changed"
    );

    // 5. Removing one GPU's value keeps the other's.
    ok(&agent.cli(&["limit", "rm", &two.path, "--gpu", "0"]));
    let entry = json(&agent.cli(&["limit", "get", &two.path, "--json"]));
    assert_eq!(
        entry["own"]["memory_gpus"],
        serde_json::json!({ UUID1: GIB }),
        "{entry}"
    );
    let out = agent.cli(&["limit", "clear", &two.path, "--gpu", "0"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no limit of its own on GPU 0"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // 6. The values survive an agent restart, and apply again.
    let saved = json(&agent.cli(&["limit", "ls", "--json"]));
    let state_dir = agent.state_dir.clone();
    drop(agent);
    let agent = Agent::start_in(&state_dir, &[]);
    assert_eq!(json(&agent.cli(&["limit", "ls", "--json"])), saved);
    let load = run(
        &two,
        &state,
        &agent,
        Some(UUID1),
        &["info", "alloc", "1GiB", "alloc", "1MiB", "hold"],
    );
    assert_eq!(
        results(&load),
        (vec![0, 2], vec![(GIB, GIB)]),
        "{:?}",
        load.lines
    );
    load.finish();

    // 7. The backstop per GPU: 4 GiB on GPU 0 and 1 GiB on GPU 1 (5 GiB in the kernel).
    //    A bypasser holding 1.5 GiB on GPU 1 is under 5 GiB in all, over on GPU 1: killed;
    //    one of the same cgroup holding 3 GiB on GPU 0, under its limit there, is not.
    let kill = Cgroup::new(&unique("fgpu-e2e-pergpu-kill"));
    ok(&agent.cli(&["limit", "set", &kill.path, "--memory", "4GiB", "--gpu", "0"]));
    ok(&agent.cli(&["limit", "set", &kill.path, "--memory", "1GiB", "--gpu", "1"]));
    let mut stays = spawn(&kill, &state, None, None, &["alloc", "3GiB", "hold"]);
    stays.expect_line("ready");
    let mut over = spawn(
        &kill,
        &state,
        None,
        None,
        &["device", "1", "alloc", "1GiB", "alloc", "512MiB", "hold"],
    );
    over.expect_line("ready");
    assert_eq!(
        over.lines
            .iter()
            .filter(|l| l.starts_with("alloc ok"))
            .count(),
        2,
        "the kernel lets it through: {:?}",
        over.lines
    );
    // Only the holder under its limit is left (bounded wait: a bypasser not killed fails
    // here rather than holding forever).
    let three =
        |r: Option<&serde_json::Value>| r.is_some_and(|r| r["memory_used_bytes"] == 3 * GIB);
    agent.wait_for(
        &kill,
        "the bypasser over its GPU 1 limit killed and its memory released",
        Duration::from_secs(10),
        three,
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
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        three(agent.cgroup_status(&kill).as_ref()),
        "the holder under its GPU 0 limit lives on: {:?}; agent log:\n{}",
        agent.cgroup_status(&kill),
        agent.log_text()
    );
    stays.finish();
}
