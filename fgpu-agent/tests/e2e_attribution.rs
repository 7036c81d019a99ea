//! End-to-end: the agent on the simulated driver attributes GPU memory to the cgroup of
//! the process that allocated it, with the workload in its own PID namespace.

mod common;

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Agent, Cgroup, Load, SimState, fgpu, privileged, unique};

const MIB_256: u64 = 256 << 20;

#[test]
fn privileged_status_shows_bytes_of_exactly_the_allocating_cgroup() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-e2e-job"));
    let idle = Cgroup::new(&unique("fgpu-e2e-idle"));

    let mut load = Load::spawn(
        &cg,
        &state.0,
        &[
            "alloc", "256MiB", "alloc", "256MiB", "alloc", "256MiB", "hold",
        ],
    );
    load.expect_line("ready");

    let row = agent
        .wait_for(&cg, "3 × 256 MiB charged", Duration::from_secs(5), |s| {
            s.is_some_and(|s| s["memory_used_bytes"] == 805_306_368u64)
        })
        .unwrap();
    assert_eq!(row["memory_used_bytes"], 805_306_368u64);
    assert_eq!(row["cgroup_id"], cg.id());
    assert_eq!(row["memory_limit_bytes"], serde_json::Value::Null);
    assert_eq!(row["alloc_denied"], 0);
    // The one process holding the memory, by its host PID, though it is PID 1 in its namespace.
    let pids: Vec<u64> = row["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 1, "{row}");
    assert!(
        cg.procs().contains(&(pids[0] as u32)),
        "pid {} not in {:?}",
        pids[0],
        cg.procs()
    );
    assert_eq!(row["devices"][0]["allocs"], 3);

    // Nothing is charged anywhere else: not the idle sibling, not the parent.
    let status = agent.status();
    let charged_here: u64 = status
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["pids"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p.as_u64() == Some(pids[0]))
        })
        .map(|e| e["memory_used_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(charged_here, 805_306_368, "{status}");
    assert!(
        agent.cgroup_status(&idle).is_none(),
        "idle cgroup has a row: {status}"
    );

    // The table a person reads says the same.
    let out = fgpu(&["status", "--socket", agent.socket.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let line = table
        .lines()
        .find(|l| l.starts_with(&cg.path))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains("768MiB"), "{line}");
    assert!(line.contains(&pids[0].to_string()), "{line}");

    assert!(load.finish().success());
}

#[test]
fn privileged_frees_subtract_and_a_killed_process_is_released_within_1s() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-e2e-free"));
    let mut load = Load::spawn(
        &cg,
        &state.0,
        &[
            "alloc", "256MiB", "alloc", "256MiB", "alloc", "256MiB", "free", "1", "hold",
        ],
    );
    load.expect_line("ready");
    agent.wait_for(
        &cg,
        "two allocations left after one free",
        Duration::from_secs(5),
        |s| {
            s.is_some_and(|s| {
                s["memory_used_bytes"] == 2 * MIB_256 && s["devices"][0]["frees"] == 1
            })
        },
    );

    let killed = Instant::now();
    load.kill();
    agent.wait_for(&cg, "release after SIGKILL", Duration::from_secs(1), |s| {
        s.is_none()
    });
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(1), "release took {took:?}");
    assert!(
        agent
            .log_text()
            .contains("process exited holding GPU memory"),
        "{}",
        agent.log_text()
    );
}

#[test]
fn privileged_agent_refuses_to_start_without_root() {
    if !privileged() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["agent", "--sim", "--socket", "/tmp/fgpu-nonroot.sock"])
        .env("FGPU_SIM_DIR", common::sim_dir())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("must run as root"), "{err}");
}

#[test]
fn status_without_an_agent_says_so() {
    let out = fgpu(&["status", "--socket", "/nonexistent/fgpu.sock"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("agent is not running"), "{err}");
}
