//! libfgpu.so with the fgpu agent: limits set with `fgpu limit set` on a cgroup reach the
//! processes in it (each in a PID namespace of its own, like containers) through the ledger
//! the agent hands over; environment limits only lower them; no agent means standalone mode;
//! an agent restart loses no limit and no usage.
//!
//! `privileged_*` tests run the real agent (`fgpu agent --sim`) and need root (eBPF, cgroups,
//! PID namespaces). The simulated device has 16 GiB and charges 300 MiB of context overhead
//! per process, which the shim counts: with a 1 GiB limit, 724 MiB are left to allocate.

mod common;

use common::agent::*;
use common::{GIB, MIB, OVERHEAD, field};
use std::time::Duration;

/// Re-executed as a client by `AgentWorld::client`; does nothing in a normal test run.
#[test]
fn client_entry() {
    if common::client::main() {
        std::process::exit(0);
    }
}

fn info_total(line: &str) -> u64 {
    field(line, "total")
}

#[test]
fn privileged_the_agent_limit_is_the_total_and_the_cgroup_shares_it() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("share");
    let agent = w.agent();
    let cg = Cgroup::new(&unique("fgpu-shim-share"));
    w.set_limit(&cg, "1GiB");

    let mut a = w.load(
        &cg,
        &[],
        &[
            "info", "nvml", "alloc", "512MiB", "alloc", "212MiB", "alloc", "1", "info", "hold",
        ],
    );
    a.expect("ready");
    // A second process of the same cgroup: its context overhead alone takes the cgroup over
    // the limit (charged anyway: the memory is in use), so nothing more fits.
    let mut b = w.load(
        &cg,
        &[],
        &[
            "info", "alloc", "1", "hold", "sleep", "300", "alloc", "512MiB", "alloc", "212MiB",
            "alloc", "1", "info",
        ],
    );
    b.expect("ready");
    let a = a.finish();
    let ctx = format!("{a}\nagent log:\n{}", agent.log_text());
    assert_eq!(info_total(a.line("info")), GIB, "{ctx}");
    assert_eq!(field(a.line("info"), "free"), GIB - OVERHEAD, "{ctx}");
    let nvml = a.line("nvml device=0");
    assert_eq!(
        field(nvml, "total"),
        GIB,
        "NVML reports the limit too: {ctx}"
    );
    assert_eq!(
        a.allocs(),
        vec![Ok(512 * MIB), Ok(212 * MIB), Err(2)],
        "stopped exactly at the limit: {ctx}"
    );
    let last_info = a.lines.iter().rfind(|l| l.starts_with("info")).unwrap();
    assert_eq!(field(last_info, "free"), 0, "{ctx}");
    assert!(
        !a.stderr.contains("no fgpu agent"),
        "the agent was there: {ctx}"
    );

    // A is gone: its share comes back, and B alone gets exactly the limit.
    let b = b.finish();
    let ctx = format!("{b}\nagent log:\n{}", agent.log_text());
    assert_eq!(info_total(b.line("info")), GIB, "{ctx}");
    assert_eq!(
        field(b.line("info"), "free"),
        0,
        "A and B share the limit: {ctx}"
    );
    assert_eq!(
        b.allocs(),
        vec![Err(2), Ok(512 * MIB), Ok(212 * MIB), Err(2)],
        "{ctx}"
    );
}

#[test]
fn privileged_environment_limits_lower_but_never_raise_the_agent_limit() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("env");
    let agent = w.agent();
    let cg = Cgroup::new(&unique("fgpu-shim-env"));
    w.set_limit(&cg, "1GiB");
    // Lower: 512 MiB (300 MiB of it context overhead).
    let o = w
        .load(
            &cg,
            &[("FGPU_MEMORY_LIMIT", "512MiB")],
            &["info", "alloc", "212MiB", "alloc", "1"],
        )
        .finish();
    let ctx = format!("{o}\nagent log:\n{}", agent.log_text());
    assert_eq!(info_total(o.line("info")), 512 * MIB, "{ctx}");
    assert_eq!(o.allocs(), vec![Ok(212 * MIB), Err(2)], "{ctx}");
    // Higher than the agent's: the agent's holds.
    for env in [("FGPU_MEMORY_LIMIT", "4GiB"), ("GPU_MEM_LIMIT_GB", "8")] {
        let o = w
            .load(&cg, &[env], &["info", "alloc", "724MiB", "alloc", "1"])
            .finish();
        let ctx = format!("{env:?}: {o}");
        assert_eq!(info_total(o.line("info")), GIB, "{ctx}");
        assert_eq!(o.allocs(), vec![Ok(724 * MIB), Err(2)], "{ctx}");
        assert!(!o.stderr.contains("no fgpu agent"), "{ctx}");
    }
}

#[test]
fn privileged_a_new_limit_reaches_a_running_process_and_lowering_kills_nothing() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("change");
    let agent = w.agent();
    let cg = Cgroup::new(&unique("fgpu-shim-change"));
    w.set_limit(&cg, "1GiB");

    // Latency: a client polls cuMemGetInfo; the limit is raised from outside.
    let mut watch = w.client(&cg, &[], "watch-total", &[]);
    let start = watch.expect("watch start");
    assert_eq!(field(&start, "total"), GIB, "{start}");
    std::thread::sleep(Duration::from_millis(200));
    let before = mono_ns();
    w.set_limit(&cg, "2GiB");
    let after = mono_ns();
    let seen = watch.expect("watch");
    assert!(seen.starts_with("watch changed"), "{seen}");
    assert_eq!(field(&seen, "total"), 2 * GIB, "{seen}");
    let at = field(&seen, "mono_ns");
    let from_cli_start = at.saturating_sub(before) as f64 / 1e6;
    let from_cli_end = at as f64 / 1e6 - after as f64 / 1e6;
    eprintln!(
        "limit change seen {from_cli_start:.2} ms after `fgpu limit set` started, \
         {from_cli_end:.2} ms after it returned"
    );
    assert!(
        from_cli_end < 100.0,
        "a new limit must reach a running process within 100 ms of being set: {from_cli_end} ms"
    );
    drop(watch);

    // Raise while a process holds memory, then lower below its usage.
    w.set_limit(&cg, "1GiB");
    let mut p = w.load(
        &cg,
        &[],
        &[
            "alloc", "512MiB", "alloc", "512MiB", "hold", "alloc", "512MiB", "info", "sleep",
            "1500", "alloc", "1", "info", "free", "0", "alloc", "1", "info",
        ],
    );
    p.expect("ready");
    w.set_limit(&cg, "2GiB");
    p.release();
    p.expect("info");
    // Lower below what is in use (300 + 1024 MiB): new allocations fail, nothing is killed.
    w.set_limit(&cg, "1GiB");
    let o = p.finish();
    let ctx = format!("{o}\nagent log:\n{}", agent.log_text());
    assert_eq!(o.code, Some(0), "nothing is killed: {ctx}");
    assert_eq!(
        o.allocs(),
        vec![Ok(512 * MIB), Err(2), Ok(512 * MIB), Err(2), Ok(1)],
        "{ctx}"
    );
    let infos: Vec<&String> = o.lines.iter().filter(|l| l.starts_with("info")).collect();
    assert_eq!(info_total(infos[0]), 2 * GIB, "raised: {ctx}");
    assert_eq!(info_total(infos[1]), GIB, "lowered: {ctx}");
    assert_eq!(
        field(infos[1], "free"),
        0,
        "over the limit: free 0, no error: {ctx}"
    );
    // After freeing 512 MiB, 300 + 512 MiB + 1 byte are in use.
    assert_eq!(
        field(infos[2], "free"),
        GIB - OVERHEAD - 512 * MIB - 1,
        "{ctx}"
    );
    assert!(!agent.log_text().contains("killed"), "{ctx}");
}

/// Processes without an agent: standalone mode with one warning (or silence without an
/// environment limit), or denial with FGPU_AGENT=required. No root needed.
#[test]
fn without_an_agent_the_environment_limit_applies_with_one_warning() {
    let w = common::World::new("no-agent");
    let o = w.load(
        &[("FGPU_MEMORY_LIMIT", "1GiB")],
        &["info", "alloc", "724MiB", "alloc", "1"],
    );
    assert_eq!(o.field("info", "total"), GIB, "{o}");
    assert_eq!(o.allocs(), vec![Ok(724 * MIB), Err(2)], "{o}");
    let lines: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.contains("no fgpu agent"))
        .collect();
    assert_eq!(
        lines,
        vec![format!(
            "fgpu: no fgpu agent at {NOWHERE}: enforcing FGPU_MEMORY_LIMIT only"
        )],
        "{o}"
    );
    // No agent and no limit: inert and silent (unless FGPU_LOG=info).
    let o = w.load(&[], &["info", "alloc", "2GiB"]);
    assert_eq!(o.stderr, "", "{o}");
    assert_eq!(o.allocs(), vec![Ok(2 * GIB)], "{o}");
    let o = w.load(&[("FGPU_LOG", "info")], &["info"]);
    assert!(o.stderr.contains("no fgpu agent at"), "{o}");
}

#[test]
fn fgpu_agent_required_without_an_agent_denies_everything() {
    let w = common::World::new("required");
    let start = std::time::Instant::now();
    let o = w.load(
        &[("FGPU_AGENT", "required"), ("FGPU_MEMORY_LIMIT", "8GiB")],
        &["info", "alloc", "1", "alloc-api", "async", "1", "nvml"],
    );
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(9),
        "tried for 10 s: {waited:?}"
    );
    assert_eq!(o.allocs(), vec![Err(2), Err(2)], "fail closed: {o}");
    assert_eq!(o.field("info", "total"), 0, "{o}");
    let errors: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.contains("FGPU_AGENT=required"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {o}");
}

/// Something at the socket that is not a working agent: an Error reply, garbage, silence.
/// The shim falls back to standalone mode with one warning and never hangs.
#[test]
fn a_refusing_or_broken_agent_means_standalone_mode() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    for (what, answer) in [
        ("refuses", Some(error_frame("no ledger for you"))),
        (
            "garbage",
            Some(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()),
        ),
        ("silent", None),
    ] {
        let w = common::World::new(&format!("fake-{what}"));
        let sock = std::env::temp_dir().join(unique(&format!("fgpu-fake-agent-{what}")));
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let mut held = Vec::new();
            listener.set_nonblocking(true).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let mut hello = [0u8; 20];
                        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                        let _ = s.read_exact(&mut hello);
                        if let Some(a) = &answer {
                            let _ = s.write_all(a);
                        }
                        held.push(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        let mut c = w.cmd(&w.load, true);
        c.env("FGPU_SOCKET", &sock)
            .env("FGPU_MEMORY_LIMIT", "1GiB")
            .args(["info", "alloc", "724MiB", "alloc", "1"]);
        let start = std::time::Instant::now();
        let o = common::run(c, 30);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{what}: no hang: {:?}",
            start.elapsed()
        );
        assert_eq!(o.field("info", "total"), GIB, "{what}: {o}");
        assert_eq!(o.allocs(), vec![Ok(724 * MIB), Err(2)], "{what}: {o}");
        let warnings: Vec<&str> = o
            .stderr
            .lines()
            .filter(|l| l.contains("enforcing FGPU_MEMORY_LIMIT only"))
            .collect();
        assert_eq!(warnings.len(), 1, "{what}: {o}");
        if what == "refuses" {
            assert!(warnings[0].contains("no ledger for you"), "{o}");
        }
        let _ = std::fs::remove_file(&sock);
        drop(server);
    }
}

fn error_frame(msg: &str) -> Vec<u8> {
    let mut f = b"FGPU".to_vec();
    f.extend_from_slice(&1u16.to_le_bytes());
    f.extend_from_slice(&0xffffu16.to_le_bytes());
    f.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    f.extend_from_slice(msg.as_bytes());
    f
}

/// The agent is SIGKILLed while a process holds memory and restarted on the same state and
/// socket: the process keeps enforcing the last ledger while the agent is away, reconnects
/// (its usage memfd is adopted), and a process started afterwards shares the same usage.
#[test]
fn privileged_an_agent_restart_under_load_loses_no_limit_and_no_usage() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("restart");
    let agent = w.agent();
    let cg = Cgroup::new(&unique("fgpu-shim-restart"));
    w.set_limit(&cg, "1GiB");
    let mut a = w.load(
        &cg,
        &[("FGPU_LOG", "info")],
        &[
            "alloc", "512MiB", "hold", "alloc", "256MiB", "alloc", "212MiB", "alloc", "1", "info",
            "sleep", "6000", "alloc", "1", "info", "sleep", "4000",
        ],
    );
    a.expect("ready");
    agent.crash();
    // While the agent is away: the last ledger holds, exactly.
    a.release();
    let down = a.expect("info");
    assert_eq!(field(&down, "total"), GIB, "{down}");
    assert_eq!(field(&down, "free"), 0, "{down}");
    // The agent comes back (on a loaded machine it can take seconds to attach; A's next
    // allocation is 6 s after the crash).
    let agent = w.agent();
    // A reconnects at its next allocation (refused: the cgroup is at its limit).
    let up = a.expect("info");
    assert_eq!(field(&up, "total"), GIB, "{up}");
    // A process started now shares A's usage: its own overhead takes the cgroup over.
    let b = w.load(&cg, &[], &["info", "alloc", "1"]).finish();
    let ctx = format!("{b}\nagent log:\n{}", agent.log_text());
    assert_eq!(info_total(b.line("info")), GIB, "{ctx}");
    assert_eq!(field(b.line("info"), "free"), 0, "shared usage: {ctx}");
    assert_eq!(b.allocs(), vec![Err(2)], "{ctx}");
    let a = a.finish();
    let ctx = format!("{a}\nagent log:\n{}", agent.log_text());
    assert_eq!(
        a.allocs(),
        vec![Ok(512 * MIB), Err(2), Ok(212 * MIB), Err(2), Err(2)],
        "no over-allocation across the restart: {ctx}"
    );
    assert_eq!(
        a.stderr.matches("the fgpu agent went away").count(),
        1,
        "{ctx}"
    );
    assert!(a.stderr.contains("reconnected to the fgpu agent"), "{ctx}");
    // Whoever reaches the new agent first brings the ledger in: A reconnecting with its
    // usage memfd, or B, whose ledger the agent adopts from A's process.
    let log = agent.log_text();
    assert!(
        log.contains("adopted from a reconnecting shim")
            || log.contains("adopted from a running process of the cgroup"),
        "{ctx}"
    );
}

/// After an agent restart, a process that starts before the running ones reconnect joins
/// their count: the new agent adopts the usage memfd they hold.
#[test]
fn privileged_after_a_restart_a_new_process_joins_the_running_processes_count() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("adopt");
    let agent = w.agent();
    let cg = Cgroup::new(&unique("fgpu-shim-adopt"));
    w.set_limit(&cg, "2GiB");
    // A: 300 MiB overhead + 1 GiB.
    let mut a = w.load(
        &cg,
        &[("FGPU_LOG", "info")],
        &[
            "alloc", "1GiB", "hold", "alloc", "1", "info", "sleep", "5000",
        ],
    );
    a.expect("ready");
    agent.crash();
    let agent = w.agent();
    // B starts before A has reconnected: the new agent adopts the usage memfd A's process
    // holds, so B sees A's 1324 MiB at once instead of a fresh, empty count.
    let mut b = w.load(
        &cg,
        &[],
        &[
            "info", "alloc", "100MiB", "hold", "alloc", "400MiB", "alloc", "324MiB", "alloc",
            "323MiB", "info",
        ],
    );
    let first = b.expect("info");
    let ctx = format!("{first}\nagent log:\n{}", agent.log_text());
    assert_eq!(
        field(&first, "free"),
        2 * GIB - OVERHEAD - (OVERHEAD + GIB),
        "{ctx}"
    );
    b.expect("ready");
    let b = b.finish();
    let ctx = format!("{b}\nagent log:\n{}", agent.log_text());
    assert_eq!(
        b.allocs(),
        vec![Ok(100 * MIB), Err(2), Ok(324 * MIB), Err(2)],
        "B counts A's charges, and the limit holds to the byte: {ctx}"
    );
    assert!(agent.log_text().contains("adopted"), "{}", agent.log_text());
    // B has exited and its share came back; A reconnects to the same ledger (nothing to
    // move) and sees exactly its own use. The kernel's figure, which memory info also weighs,
    // is republished every 50 ms: give it a few periods to drop B's bytes.
    std::thread::sleep(std::time::Duration::from_millis(300));
    a.release();
    let seen = a.expect("info");
    assert_eq!(
        field(&seen, "free"),
        2 * GIB - (OVERHEAD + GIB) - 1,
        "{seen}"
    );
    let a = a.finish();
    assert_eq!(a.allocs(), vec![Ok(GIB), Ok(1)], "{a}");
    assert!(
        !a.stderr.contains("moved"),
        "same ledger, nothing to move: {a}"
    );
}

/// Fork under an agent: each child reopens the usage memfd (its own open file description)
/// and claims a slot of its own; together the children stay within the cgroup's limit, and
/// their shares come back when they exit.
#[test]
fn privileged_fork_children_get_their_own_slots_in_the_agent_ledger() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("fork");
    let agent = w.agent();
    let cg = Cgroup::new(&unique("fgpu-shim-fork"));
    w.set_limit(&cg, "1324MiB"); // 300 MiB of context overhead + 1 GiB
    let o = w
        .client(&cg, &[("FGPU_LOG", "debug")], "fork-fresh", &["256"])
        .finish();
    let ctx = format!("{o}\nagent log:\n{}", agent.log_text());
    assert_eq!(o.code, Some(0), "{ctx}");
    let c0 = o.line("child0");
    let c1 = o.line("child1");
    assert_eq!(field(c0, "ctx_rc"), 0, "{ctx}");
    // Child 0: its overhead + 4 chunks fill the limit; child 1 then has only its overhead.
    assert_eq!(field(c0, "chunks"), 4, "{ctx}");
    assert_eq!(field(c1, "chunks"), 0, "{ctx}");
    assert_eq!(field(o.line("parent nvml1"), "total"), 1324 * MIB, "{ctx}");
    // The children's shares come back when they exit (memory info counts the larger of the
    // ledger and the kernel's figure, which the agent publishes every 50 ms: give it time).
    std::thread::sleep(Duration::from_millis(300));
    let after = w.load(&cg, &[], &["info"]).finish();
    assert_eq!(
        field(after.line("info"), "free"),
        GIB,
        "only the new process's overhead is in use: {after}\n{ctx}"
    );
    let mut slots: Vec<&str> = o
        .stderr
        .lines()
        .filter_map(|l| l.split("claimed ledger slot ").nth(1))
        .map(|r| r.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(slots.len(), 3, "parent and two children: {ctx}");
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), 3, "three different slots: {ctx}");
    assert_eq!(
        o.stderr.matches("ledger of cgroup").count(),
        1,
        "one Hello per process tree (children inherit the ledger): {ctx}"
    );
}
