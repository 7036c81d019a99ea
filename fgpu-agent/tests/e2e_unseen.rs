//! End-to-end: memory that no probed allocation call shows is held to the limit by the
//! driver's own count (agent/unseen.rs).
//!
//! Real agent on the simulated driver, real cgroups, each workload in its own PID namespace.
//! The simulator's NVML lists host PIDs with each process's device memory, contexts, CUDA
//! arrays (not probed) and local memory grown by launches (a kernel named `lmem_<N>mib`)
//! included, as the real NVML does.

mod common;

use std::time::{Duration, Instant};

use common::{
    Agent, Cgroup, Load, SimState, exit_status, lines_now, log_lines, ok, privileged, sim_node,
    spawn_sim_load, unique,
};

/// The workloads of one run: who should be killed, who should be left alone.
struct Case {
    what: &'static str,
    cg: Cgroup,
    load: Load,
    killed: bool,
}

fn start(agent: &Agent, state: &SimState, on_exceed_kill: bool) -> Vec<Case> {
    let case = |what, limit: Option<&str>, args: &[&str], shim: bool, killed: bool| {
        let cg = Cgroup::new(&unique("fgpu-e2e-unseen"));
        if let Some(l) = limit {
            ok(&agent.cli(&["limit", "set", &cg.path, "--memory", l]));
        }
        let mut all = args.to_vec();
        all.extend(["hold"]);
        let load = spawn_sim_load(&cg, state, shim.then_some(agent), None, "300MiB", &all);
        Case {
            what,
            cg,
            load,
            killed: killed && on_exceed_kill,
        }
    };
    // 15.5 GiB in all, contexts included: the simulated device has 16.
    vec![
        // Without the shim: 1 GiB the probes see, 3 GiB of CUDA arrays they do not.
        case(
            "arrays past the limit, no shim",
            Some("2GiB"),
            &["alloc", "1GiB", "alloc-api", "array", "3GiB"],
            false,
            true,
        ),
        // With the shim (which cannot see inside a launch): local memory grown by a kernel.
        case(
            "local memory past the limit, with the shim",
            Some("2GiB"),
            &["alloc", "512MiB", "launch", "1", "lmem_3072mib", "sync"],
            true,
            true,
        ),
        // At the limit the probes hold, its context and some local memory on top: within
        // the tolerance.
        case(
            "at the limit, context and 512 MiB of local memory on top",
            Some("2GiB"),
            &["alloc", "2GiB", "launch", "1", "lmem_512mib", "sync"],
            false,
            false,
        ),
        // Far under a larger limit.
        case(
            "2 GiB of local memory under an 8 GiB limit",
            Some("8GiB"),
            &["launch", "1", "lmem_2048mib", "sync"],
            false,
            false,
        ),
        // No limit: nothing to hold it to.
        case(
            "2 GiB of arrays and no limit",
            None,
            &["alloc-api", "array", "2GiB"],
            false,
            false,
        ),
    ]
}

/// Runs the cases under an agent with `--on-exceed on_exceed`: the ones to be killed are
/// killed within two reconcile passes and some slack, the others are still running 2.5 s
/// after. Returns the cases (still holding the survivors) for the caller's checks.
fn run(agent: &Agent, state: &SimState, on_exceed: &str) -> Vec<Case> {
    let mut cases = start(agent, state, on_exceed == "kill");
    for c in &mut cases {
        c.load.expect_line("ready");
        assert!(
            !c.load.lines.iter().any(|l| l.contains(" fail ")),
            "{}: every step succeeds: {:?}",
            c.what,
            c.load.lines
        );
    }
    let deadline = Instant::now() + Duration::from_secs(6);
    for c in cases.iter_mut().filter(|c| c.killed) {
        // The kill is logged right after kill(2); only then is the status read (a load left
        // alone would never print one).
        while log_lines(agent, &["unseen_kill", &c.cg.path], 1).is_empty() {
            assert!(
                Instant::now() < deadline,
                "{} was not killed within 6 s:\n{}",
                c.what,
                agent.log_text()
            );
        }
        assert_eq!(exit_status(&mut c.load), 137, "{} ends by SIGKILL", c.what);
    }
    std::thread::sleep(Duration::from_millis(2500));
    for c in cases.iter().filter(|c| !c.killed) {
        assert!(!c.cg.procs().is_empty(), "{} is left running", c.what);
    }
    cases
}

/// One test (the simulator's state goes through this process's environment, see
/// `common::sim_node`): the kill policy, then the report-only one on the same device.
#[test]
fn privileged_memory_no_allocation_call_shows_is_held_to_the_limit_by_the_drivers_count() {
    if !privileged() {
        return;
    }
    let (state, agent) = sim_node(1);
    let cases = run(&agent, &state, "kill");
    for c in &cases {
        let found = lines_now(&agent, &["unseen_over_limit", &c.cg.path]);
        let kills = lines_now(&agent, &["unseen_kill", &c.cg.path]);
        if c.killed {
            assert_eq!(found.len(), 1, "{}: reported once: {found:?}", c.what);
            assert_eq!(kills.len(), 1, "{}: one kill: {kills:?}", c.what);
            assert!(kills[0].contains("GPU 0"), "{kills:?}");
        } else {
            assert!(
                found.is_empty() && kills.is_empty(),
                "{}: {found:?} {kills:?}",
                c.what
            );
        }
    }
    let report = lines_now(&agent, &["unseen_over_limit", &cases[0].cg.path]);
    assert!(
        report[0].contains("over its 2GiB limit") && report[0].contains("4.3GiB"),
        "the report names the limit and the driver's figure (1 GiB + 3 GiB + the context): \
         {report:?}"
    );
    drop(cases);
    drop(agent);

    // `--on-exceed deny`: the same overruns are reported, and nothing is killed.
    let agent = Agent::start_with(&["--on-exceed", "deny"]);
    let cases = run(&agent, &state, "deny");
    for c in &cases[..2] {
        let found = lines_now(&agent, &["unseen_over_limit", &c.cg.path]);
        assert_eq!(found.len(), 1, "{}: reported: {found:?}", c.what);
    }
    for c in &cases[2..] {
        assert!(
            lines_now(&agent, &[&c.cg.path, "unseen_"]).is_empty(),
            "{}",
            c.what
        );
    }
    assert!(lines_now(&agent, &["unseen_kill"]).is_empty());
}
