//! End-to-end: limits set with the CLI, and the kernel backstop for processes that bypass
//! the shim.

mod common;

use std::time::Duration;

use common::{Agent, Cgroup, Load, SimState, ok, privileged, unique};

fn refused(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "expected a refusal: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn privileged_limits_persist_across_restarts_and_bad_input_changes_nothing() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let cg = Cgroup::new(&unique("fgpu-e2e-limits"));
    let child = Cgroup::new(&format!("{}/child", cg.path.trim_start_matches('/')));

    let out = ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "1GiB"]));
    assert!(out.contains("1GiB"), "{out}");
    let out = ok(&agent.cli(&["limit", "get", &child.path, "--json"]));
    let entry: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        entry["effective"]["memory_bytes"],
        1u64 << 30,
        "inherited: {entry}"
    );
    assert_eq!(entry["memory_limit_from"], cg.path.as_str());

    // Bad input: a clear message, a non-zero exit, and nothing changed.
    let before = ok(&agent.cli(&["limit", "ls", "--json"]));
    assert!(
        refused(&agent.cli(&["limit", "set", "/no-such-cgroup-here", "--memory", "1GiB"]))
            .contains("no such cgroup")
    );
    assert!(
        refused(&agent.cli(&["limit", "set", &cg.path, "--memory", "lots"])).contains("not a size")
    );
    assert!(
        refused(&agent.cli(&["limit", "set", &cg.path, "--memory", "1TiB"]))
            .contains("larger than the device")
    );
    assert!(
        refused(&agent.cli(&["limit", "set", &cg.path, "--memory", "0"])).contains("fgpu limit rm")
    );
    let nonroot = std::process::Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args([
            "limit",
            "set",
            &cg.path,
            "--memory",
            "2GiB",
            "--socket",
            agent.admin.to_str().unwrap(),
        ])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(refused(&nonroot).contains("permission denied"));
    assert_eq!(
        ok(&agent.cli(&["limit", "ls", "--json"])),
        before,
        "bad input changed the limits"
    );

    // A restart keeps the limit.
    let state_dir = agent.state_dir.clone();
    drop(agent);
    let agent = Agent::start_in(&state_dir, &[]);
    let out = ok(&agent.cli(&["limit", "get", &cg.path, "--json"]));
    let entry: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(entry["own"]["memory_bytes"], 1u64 << 30);
    ok(&agent.cli(&["limit", "rm", &cg.path]));
    assert!(refused(&agent.cli(&["limit", "rm", &cg.path])).contains("no limit of its own"));
    drop(child);
}

use std::os::unix::process::CommandExt;

#[test]
fn privileged_a_process_without_the_shim_that_crosses_the_limit_is_killed() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-e2e-backstop"));
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "1GiB"]));

    let mut load = Load::spawn(
        &cg,
        &state.0,
        &[
            "alloc", "512MiB", "alloc", "512MiB", "sleep", "200", "alloc", "256MiB", "sleep",
            "5000", "hold",
        ],
    );
    // The kernel cannot stop the call that crosses the limit (no shim here): the driver
    // returns it, and the process is killed right after, before it gets further.
    let first = load.expect_line("pid=");
    let status = load.wait();
    assert!(!status.success(), "not killed: {status:?} {:?}", load.lines);
    assert!(!load.lines.iter().any(|l| l == "ready"), "{:?}", load.lines);
    // The agent logs right after its kill(2): the process can be reaped before the line lands.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !agent.log_text().contains("killed") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = agent.log_text();
    assert!(log.contains("killed"), "{log}");
    assert_eq!(
        log.matches("killed").count(),
        1,
        "only the allocation that crossed: {log}"
    );
    assert!(log.contains("allocation of 256MiB"), "{log}");
    let _ = first;
    let row = agent.wait_for(
        &cg,
        "release of the killed process",
        Duration::from_secs(2),
        |s| s.is_some_and(|s| s["memory_used_bytes"] == 0) || s.is_none(),
    );
    assert!(row.is_none(), "{row:?}");
}

#[test]
fn privileged_deny_policy_reports_and_kills_nothing() {
    if !privileged() {
        return;
    }
    let agent = Agent::start_with(&["--on-exceed", "deny"]);
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-e2e-deny"));
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "1GiB"]));
    let mut load = Load::spawn(
        &cg,
        &state.0,
        &["alloc", "768MiB", "alloc", "512MiB", "hold"],
    );
    load.expect_line("ready");
    let row = agent
        .wait_for(&cg, "over-limit report", Duration::from_secs(3), |s| {
            s.is_some_and(|s| s["over_limit_actions"] == 1)
        })
        .unwrap();
    assert_eq!(row["memory_used_bytes"], 1280u64 << 20);
    assert_eq!(row["memory_limit_bytes"], 1u64 << 30);
    assert!(
        agent.log_text().contains("over limit"),
        "{}",
        agent.log_text()
    );
    assert!(load.finish().success(), "deny must not kill");
}

/// A client that says Hello like the shim, tries to raise its own limit, and watches the
/// limit page for a change. Prints JSON lines.
const LEDGER_CLIENT: &str = r#"
import json, mmap, os, socket, struct, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"FGPU" + struct.pack("<HHI", 1, 16, 8) + struct.pack("<II", 1, 0))
msg, fds, _, _ = socket.recv_fds(s, 65536, 4)
kind = struct.unpack_from("<H", msg, 6)[0]
if kind != 0x8010:
    print(json.dumps({"error": msg[12:].decode(errors="replace")}), flush=True)
    sys.exit(1)
limits, usage = fds
def attempt(f):
    try:
        f()
        return "allowed"
    except OSError as e:
        return "refused"
out = {
    "cgroup": msg[20:].decode(),
    "limits_size": os.fstat(limits).st_size,
    "usage_size": os.fstat(usage).st_size,
    "map_limits_writable": attempt(lambda: mmap.mmap(limits, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)),
    "write_limits": attempt(lambda: os.pwrite(limits, b"\xff" * 8, 40)),
    "reopen_and_map_writable": attempt(lambda: mmap.mmap(os.open("/proc/self/fd/%d" % limits, os.O_RDWR), 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)),
    "map_usage_writable": attempt(lambda: mmap.mmap(usage, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)),
}
page = mmap.mmap(limits, 4096, mmap.MAP_SHARED, mmap.PROT_READ)
first = struct.unpack_from("<Q", page, 40)[0]
out["limit"] = first
print(json.dumps(out), flush=True)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    now = struct.unpack_from("<Q", page, 40)[0]
    if now != first:
        print(json.dumps({"changed": now, "at_ns": time.monotonic_ns()}), flush=True)
        break
    time.sleep(0.0005)
sys.stdin.read()
"#;

#[test]
fn privileged_a_process_gets_its_cgroups_ledger_read_only_and_limit_changes_reach_it_within_100ms()
{
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-e2e-ledger"));
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "1GiB"]));
    let python = common::find_python();
    let sock = agent.socket.to_str().unwrap().to_string();
    let mut client = Load::spawn_program(&cg, &state.0, &python, &["-c", LEDGER_CLIENT, &sock]);
    let line = client.expect_line("{");
    let got: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        got["cgroup"],
        cg.path.as_str(),
        "the agent identified the cgroup from the peer's PID: {got}"
    );
    assert_eq!(got["limit"], 1u64 << 30, "{got}");
    assert_eq!(got["limits_size"], 4096, "{got}");
    assert_eq!(got["map_limits_writable"], "refused", "{got}");
    assert_eq!(got["write_limits"], "refused", "{got}");
    assert_eq!(got["reopen_and_map_writable"], "refused", "{got}");
    assert_eq!(got["map_usage_writable"], "allowed", "{got}");

    let before = common::mono_ns() as u128;
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "2GiB"]));
    let changed: serde_json::Value = serde_json::from_str(&client.expect_line("{")).unwrap();
    assert_eq!(changed["changed"], 2u64 << 30);
    let latency_ms =
        (changed["at_ns"].as_u64().unwrap() as u128).saturating_sub(before) as f64 / 1e6;
    assert!(
        latency_ms < 100.0,
        "a limit change took {latency_ms:.1} ms to reach the process"
    );
    eprintln!("limit change reached the process in {latency_ms:.2} ms (CLI round trip included)");
    client.finish();
}

#[test]
fn privileged_two_cgroups_each_see_and_stop_at_their_own_limit_and_status_agrees() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let mib = 1u64 << 20;
    let cases = [("1GiB", 1u64 << 30, 2u64), ("2GiB", 2u64 << 30, 6u64)];
    let mut runs = Vec::new();
    for (limit, bytes, fits) in cases {
        let cg = Cgroup::new(&unique(&format!("fgpu-e2e-two-{limit}")));
        ok(&agent.cli(&["limit", "set", &cg.path, "--memory", limit]));
        // 256 MiB at a time until refused, then exactly what is left (212 MiB: the 300 MiB
        // context overhead is charged too), then one byte more.
        let mut args: Vec<&str> = vec!["info", "nvml"];
        for _ in 0..=fits {
            args.extend(["alloc", "256MiB"]);
        }
        args.extend(["alloc", "212MiB", "alloc", "1", "info", "hold"]);
        let mut load = Load::spawn_with_shim(&cg, &state.0, &agent, &args);
        load.expect_line("ready");
        runs.push((cg, load, bytes, fits));
    }
    for (cg, load, bytes, fits) in &runs {
        let lines = &load.lines;
        let info = lines.iter().find(|l| l.starts_with("info")).unwrap();
        assert!(
            info.contains(&format!("total={bytes}")),
            "cuMemGetInfo reports the limit: {lines:?}"
        );
        let nvml = lines
            .iter()
            .find(|l| l.starts_with("nvml device=0"))
            .unwrap();
        assert!(
            nvml.contains(&format!("total={bytes}")),
            "NVML reports the limit: {lines:?}"
        );
        let allocs: Vec<&String> = lines.iter().filter(|l| l.starts_with("alloc")).collect();
        let ok_count = allocs.iter().filter(|l| l.starts_with("alloc ok")).count() as u64;
        assert_eq!(
            ok_count,
            fits + 1,
            "{fits} x 256 MiB and the 212 MiB remainder fit: {lines:?}"
        );
        assert!(allocs[*fits as usize].contains("fail rc=2"), "{lines:?}");
        assert!(
            allocs.last().unwrap().contains("fail rc=2"),
            "not one byte over: {lines:?}"
        );
        assert!(
            lines
                .iter()
                .rfind(|l| l.starts_with("info"))
                .unwrap()
                .contains("free=0"),
            "{lines:?}"
        );
        let row = agent
            .wait_for(
                cg,
                "status of the limited cgroup",
                Duration::from_secs(3),
                |s| s.is_some_and(|s| s["alloc_denied"] == 2),
            )
            .unwrap();
        assert_eq!(row["memory_limit_bytes"], *bytes, "{row}");
        assert_eq!(
            row["memory_used_bytes"],
            fits * 256 * mib + 212 * mib,
            "kernel view: {row}"
        );
    }
    for (_, load, _, _) in runs {
        assert!(load.finish().success());
    }
}
