//! End-to-end: `fgpu run` puts a command in a fresh cgroup with limits and the shim, passes
//! signals and the exit status through, and leaves no cgroup behind.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Agent, SimState, cgroup2_mount, privileged, sim_dir, unique};

/// `fgpu run` asking the agent at `admin` for limits, its shim saying Hello on `shim`.
fn fgpu_run(admin: &str, shim: &str, state: &SimState, name: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fgpu"));
    cmd.args([
        "run",
        "--socket",
        admin,
        "--shim-socket",
        shim,
        "--name",
        name,
    ])
    .args(args)
    .env("LD_LIBRARY_PATH", sim_dir())
    .env("FGPU_SIM_STATE", &state.0);
    cmd
}

#[test]
fn privileged_without_an_agent_fgpu_run_falls_back_to_standalone_and_cleans_up() {
    if !privileged() {
        return;
    }
    let state = SimState::new();
    let name = unique("e2e-run");
    let load = sim_dir().join("fgpu-sim-load");
    let out = fgpu_run(
        "/nonexistent/fgpu.sock",
        "/nonexistent/fgpu.sock",
        &state,
        &name,
        &["--memory", "1GiB", "--"],
    )
    .arg(&load)
    .args(["alloc", "512MiB", "alloc", "512MiB", "info"])
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("falling back to standalone limits"),
        "{stderr}"
    );
    // 1 GiB covers the context (300 MiB in the sim) and one 512 MiB allocation, not two.
    assert!(stdout.contains("alloc ok"), "{stdout}");
    assert!(stdout.contains("alloc fail rc=2"), "{stdout}");
    assert!(stdout.contains("total=1073741824"), "{stdout}");
    assert!(
        !cgroup2_mount().join("fgpu").join(&name).exists(),
        "the run's cgroup was left behind"
    );
}

#[test]
fn privileged_fgpu_run_passes_exit_status_and_signals_through() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let sock = agent.socket.to_str().unwrap().to_string();
    let admin = agent.admin.to_str().unwrap().to_string();

    let name = unique("e2e-exit");
    let status = fgpu_run(&admin, &sock, &state, &name, &["--", "sh", "-c", "exit 7"])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7));

    let name = unique("e2e-signal");
    let mut child = fgpu_run(
        &admin,
        &sock,
        &state,
        &name,
        &[
            "--",
            "sh",
            "-c",
            "trap 'exit 42' TERM; echo started; while :; do sleep 0.05; done",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "started");
    let inside = cgroup2_mount()
        .join("fgpu")
        .join(&name)
        .join("cgroup.procs");
    assert!(
        !std::fs::read_to_string(&inside).unwrap().trim().is_empty(),
        "the command runs in fgpu/{name}"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(42),
        "SIGTERM reached the command, its status came back"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert!(!cgroup2_mount().join("fgpu").join(&name).exists());
}

#[test]
fn privileged_fgpu_run_with_an_agent_is_limited_and_leaves_nothing_behind() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let sock = agent.socket.to_str().unwrap().to_string();
    let admin = agent.admin.to_str().unwrap().to_string();
    let name = unique("e2e-run-agent");
    let load = sim_dir().join("fgpu-sim-load");
    let out = fgpu_run(&admin, &sock, &state, &name, &["--memory", "1GiB", "--"])
        .env("FGPU_CONTEXT_OVERHEAD", "300MiB")
        .arg(&load)
        .args([
            "info", "alloc", "512MiB", "alloc", "512MiB", "alloc", "212MiB", "alloc", "1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        !stderr.contains("falling back"),
        "the agent was there: {stderr}"
    );
    assert!(stdout.contains("total=1073741824"), "{stdout}");
    let allocs: Vec<&str> = stdout.lines().filter(|l| l.starts_with("alloc")).collect();
    assert!(allocs[0].starts_with("alloc ok"), "{stdout}");
    assert!(allocs[1].contains("fail rc=2"), "{stdout}");
    assert!(
        allocs[2].starts_with("alloc ok"),
        "exactly the limit fits: {stdout}"
    );
    assert!(allocs[3].contains("fail rc=2"), "{stdout}");
    assert!(
        !cgroup2_mount().join("fgpu").join(&name).exists(),
        "cgroup left behind"
    );
    let ls = agent.cli(&["limit", "ls", "--json"]);
    assert!(
        !String::from_utf8_lossy(&ls.stdout).contains(&name),
        "limit left behind"
    );
}

/// GPU-time share of a `launch-for ... sleep_1000us` result line (n × 1 ms / elapsed).
fn launch_for_share(stdout: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("launch-for ok"))
        .unwrap_or_else(|| panic!("no launch-for line in {stdout}"));
    let field = |k: &str| -> f64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {line}"))
    };
    100.0 * field("n=") / field("elapsed_ms=")
}

#[test]
fn privileged_fgpu_run_compute_cap_with_and_without_an_agent() {
    if !privileged() {
        return;
    }
    let load = sim_dir().join("fgpu-sim-load");
    let work = ["launch-for", "3000", "sleep_1000us"];

    // With the agent: the cap goes into the run's cgroup, the controller holds it.
    let agent = Agent::start();
    let state = SimState::new();
    let sock = agent.socket.to_str().unwrap().to_string();
    let admin = agent.admin.to_str().unwrap().to_string();
    let name = unique("e2e-run-cap");
    let cpu = fgpu_testkit::shares::CpuMeter::start();
    let out = fgpu_run(&admin, &sock, &state, &name, &["--compute-cap", "30", "--"])
        .arg(&load)
        .args(work)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(!stderr.contains("falling back"), "{stderr}");
    let share = launch_for_share(&stdout);
    // The floor, not the cap, gives way to a host that steals CPU from the launch loop
    // (as `fgpu_testkit::shares` lowers its busy floor): a cap is never exceeded.
    let stolen = cpu.stolen_pct();
    let floor = fgpu_testkit::shares::lowered(25.0, stolen);
    println!(
        "fgpu run --compute-cap 30 with the agent: {share:.1}% (host stole {stolen:.1}% of the CPU)"
    );
    assert!(
        (floor..=33.0).contains(&share),
        "{share:.1}% (want {floor:.1}-33): {stdout}{stderr}"
    );

    // Without: a share becomes a ceiling in the shim, said so.
    let state = SimState::new();
    let name = unique("e2e-run-share");
    let out = fgpu_run(
        "/nonexistent/fgpu.sock",
        "/nonexistent/fgpu.sock",
        &state,
        &name,
        &["--compute", "40", "--"],
    )
    .arg(&load)
    .args(work)
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("compute 40% (as a ceiling)"), "{stderr}");
    let share = launch_for_share(&stdout);
    println!("fgpu run --compute 40 without an agent: {share:.1}%");
    assert!(
        (35.0..=43.0).contains(&share),
        "{share:.1}%: {stdout}{stderr}"
    );
}
