//! Parking when something goes wrong around it (issue 29, docs/parking.md): a context that
//! breaks while parked, a memory cgroup with no room for the host copy, a hostile container
//! forging requests for room, a tenant killed while parked. Under the real agent (`fgpu
//! agent --sim`), over the simulated driver (2 GiB; every process's context takes 300 MiB).
//! The ordinary paths are in `park.rs`.
//!
//! `privileged_*` tests run the real agent and need root.

mod common;

use common::agent::*;
use fgpu_testkit::privileged;

/// Re-executed as a client by `AgentWorld::client`; does nothing in a normal test run.
#[test]
fn client_entry() {
    if common::client::main() {
        std::process::exit(0);
    }
}

const SIM: [(&str, &str); 2] = [("FGPU_SIM_MEMORY", "2GiB"), ("FGPU_LOG", "info")];

/// A parked tenant whose context broke meanwhile (a device fault: the simulator's
/// `fgpuSimFault`, which no shim sees) is not held at its door for ever: the unpark gives up
/// after a few tries, says why, and the call gets the driver's own error (700), as it would
/// without parking; the process ends; its neighbour keeps its memory.
#[test]
fn privileged_a_parked_tenant_whose_context_broke_gets_the_drivers_error_not_a_hang() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkbroken");
    let _agent = w.agent_seeing("2GiB");
    let (a_cg, b_cg) = w.parking_pair("parkbroken-a", "parkbroken-b");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &[
            "alloc", "256MiB", "alloc", "256MiB", "fill", "0", "7", "launch", "1", "empty", "hold",
            "fault", "check", "0", "7", "alloc", "64MiB",
        ],
    );
    a.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut b = w.load(
        &b_cg,
        &SIM,
        &["alloc", "512MiB", "alloc", "512MiB", "hold", "info"],
    );
    b.expect("ready");
    assert_eq!(allocs(&b.lines), vec![Ok(512 << 20), Ok(512 << 20)], "b");
    assert_eq!(w.status_row(&a_cg)["parked_bytes"], 512u64 << 20);
    // A hang is what this test is about: end the tenant after 30 s if it has not ended.
    let pid = a.pid() as i32;
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(30));
        // SAFETY: a plain signal to the tenant's process (it may have ended: then ESRCH).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let t0 = std::time::Instant::now();
    a.release();
    let a = a.finish();
    let took = t0.elapsed();
    assert!(took < std::time::Duration::from_secs(25), "{took:?}: {a}");
    assert_eq!(a.line("fault"), "fault ok", "{a}");
    assert_eq!(a.line("check 0"), "check 0 fail rc=700", "{a}");
    assert!(a.stderr.contains("unparking failed"), "{a}");
    drop(watchdog);
    let b = b.finish();
    assert_eq!(b.code, Some(0), "{b}");
}

/// A v1 memory cgroup made for one test (this hybrid host charges memory there), removed on
/// drop.
struct MemCg {
    dir: std::path::PathBuf,
}

impl MemCg {
    fn new(name: &str, limit: u64) -> Self {
        let dir = std::path::Path::new(MEMCG_V1).join(name);
        std::fs::create_dir_all(&dir).expect("creating a v1 memory cgroup");
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).expect("limit");
        MemCg { dir }
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("moving a pid");
    }

    fn usage(&self) -> u64 {
        let s = std::fs::read_to_string(self.dir.join("memory.usage_in_bytes")).unwrap();
        s.trim().parse().unwrap()
    }

    fn oom_kills(&self) -> u64 {
        let s = std::fs::read_to_string(self.dir.join("memory.oom_control")).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCg {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

const MEMCG_V1: &str = "/sys/fs/cgroup/memory";

/// A park's host copy is the parked process's own memory, which the kernel charges to its
/// memory cgroup (on this hybrid host, the v1 memory controller's): a park that fits shows
/// in the cgroup's usage; one that its cgroup has no room for is refused before a byte is
/// touched, so the tenant is not OOM-killed, keeps its memory on the GPU, and the asker's
/// allocation fails as it would without parking.
#[test]
fn privileged_a_park_is_charged_to_the_tenants_memory_cgroup_and_refused_where_it_cannot_fit() {
    if !privileged() {
        return;
    }
    if !std::path::Path::new(MEMCG_V1)
        .join("memory.limit_in_bytes")
        .exists()
    {
        eprintln!(
            "skipped: no v1 memory hierarchy here (the v2 files are read by the same code: \
             fgpu-common cgroup::memory's unit tests)"
        );
        return;
    }
    let w = AgentWorld::new("parkmem");
    let _agent = w.agent_seeing("2GiB");
    for (limit, fits) in [(400u64 << 20, false), (1u64 << 30, true)] {
        let tag = if fits { "fits" } else { "tight" };
        let (a_cg, b_cg) = w.parking_pair(&format!("parkmem-a-{tag}"), &format!("parkmem-b-{tag}"));
        let mut a = w.load(
            &a_cg,
            &SIM,
            &[
                "alloc", "256MiB", "alloc", "256MiB", "fill", "0", "7", "fill", "1", "9", "launch",
                "1", "empty", "hold", "check", "0", "7", "check", "1", "9",
            ],
        );
        a.expect("ready");
        let memcg = MemCg::new(
            &format!("fgpu-test-parkmem-{tag}-{}", std::process::id()),
            limit,
        );
        for pid in a_cg.procs() {
            memcg.enter(pid);
        }
        let before = memcg.usage();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let mut b = w.load(&b_cg, &SIM, &["alloc", "512MiB", "alloc", "512MiB", "hold"]);
        b.expect("ready");
        let got = allocs(&b.lines);
        let during = memcg.usage();
        let r = w.status_row(&a_cg);
        let b = b.finish();
        assert_eq!(b.code, Some(0), "{tag}: {b}");
        a.release();
        let a = a.finish();
        assert_eq!(a.code, Some(0), "{tag}: the tenant lives: {a}");
        assert_eq!(memcg.oom_kills(), 0, "{tag}");
        assert_eq!(a.line("check 0"), "check 0 ok", "{tag}: {a}");
        assert_eq!(a.line("check 1"), "check 1 ok", "{tag}: {a}");
        if fits {
            assert_eq!(got, vec![Ok(512 << 20), Ok(512 << 20)], "{tag}: {a}");
            assert_eq!(r["parked_bytes"], 512u64 << 20, "{tag}: {r}");
            assert!(
                during >= before + (512 << 20),
                "{tag}: the host copy is charged to the tenant's memory cgroup: {before} -> {during}"
            );
        } else {
            assert_eq!(got, vec![Ok(512 << 20), Err(2)], "{tag}: {a}");
            assert_eq!(r["parked_bytes"], 0, "{tag}: {r}");
            assert!(during < limit, "{tag}: {during}");
            assert!(
                a.stderr.contains("memory cgroup has room for"),
                "{tag}: {a}"
            );
        }
    }
}

/// A hostile container asks for room it does not need, in every slot it can write, for 3 s:
/// the GPU has the room, so nobody is parked for it; the idle parkable neighbour stays
/// resident and keeps its data.
#[test]
fn privileged_a_container_asking_for_room_it_does_not_need_parks_nobody() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkforge");
    let agent = w.agent_seeing("2GiB");
    let a_cg = Cgroup::new("parkforge-a");
    let h_cg = Cgroup::new("parkforge-h");
    w.set_limits(&a_cg, &["--memory", "1500MiB", "--park-after", "1s"]);
    w.set_limit(&h_cg, "1500MiB");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &[
            "alloc", "256MiB", "fill", "0", "2", "launch", "1", "empty", "hold", "check", "0", "2",
        ],
    );
    a.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let h = w.client(&h_cg, &SIM, "forge-room", &["3000", "512"]);
    let h = h.finish();
    assert!(h.line("forge-room done").contains("writes="), "{h}");
    let r = w.status_row(&a_cg);
    assert_eq!(r["parks"], 0, "parked for a forged request: {r}");
    assert_eq!(r["parked_bytes"], 0, "{r}");
    let log = agent.log_text();
    assert!(
        log.contains("asked for room the GPU has: nothing parked"),
        "the forged requests were not seen:\n{log}"
    );
    a.release();
    let a = a.finish();
    assert_eq!(a.line("check 0"), "check 0 ok", "{a}");
}

/// A hostile container says, in every slot it can write, that it holds `u64::MAX` bytes
/// of every device in host memory: the agent counts at most what it could have parked (its
/// limit, 1500 MiB), so the host budget (2 GiB here) still has room for an idle neighbour's
/// 512 MiB, which is parked for a third container's allocation, and no sum overflows.
#[test]
fn privileged_forged_parked_figures_do_not_use_up_the_host_budget() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkclaim");
    let _agent = w.agent_seeing_with("2GiB", &["--park-host-memory", "2GiB"]);
    let a_cg = Cgroup::new("parkclaim-a");
    let b_cg = Cgroup::new("parkclaim-b");
    let h_cg = Cgroup::new("parkclaim-h");
    w.set_limits(&a_cg, &["--memory", "1500MiB", "--park-after", "1s"]);
    w.set_limits(&h_cg, &["--memory", "1500MiB", "--park-after", "1h"]);
    w.set_limit(&b_cg, "1500MiB");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &[
            "alloc", "256MiB", "alloc", "256MiB", "fill", "0", "7", "launch", "1", "empty", "hold",
            "check", "0", "7",
        ],
    );
    a.expect("ready");
    let mut h = w.client(&h_cg, &SIM, "forge-parked", &["8000"]);
    h.expect("forge-parked ready");
    let hr = w.status_row(&h_cg);
    assert_eq!(
        hr["parked_bytes"],
        1500u64 << 20,
        "capped at its limit: {hr}"
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // 2 GiB - 3 × 300 MiB of contexts - a's 512 MiB - h's 64 MiB = 572 MiB free: b's
    // second 512 MiB fits only once a is parked.
    let mut b = w.load(&b_cg, &SIM, &["alloc", "512MiB", "alloc", "512MiB", "hold"]);
    b.expect("ready");
    assert_eq!(allocs(&b.lines), vec![Ok(512 << 20), Ok(512 << 20)], "b");
    let ar = w.status_row(&a_cg);
    assert_eq!(ar["parked_bytes"], 512u64 << 20, "{ar}");
    let h = h.finish();
    assert!(h.line("forge-parked done").contains("writes="), "{h}");
    let b = b.finish();
    assert_eq!(b.code, Some(0), "{b}");
    a.release();
    let a = a.finish();
    assert_eq!(a.line("check 0"), "check 0 ok", "{a}");
}

/// A parked container's process is killed while parked: its slot is taken back, nothing of
/// it stays counted in host memory, and its neighbour goes on.
#[test]
fn privileged_a_parked_tenant_killed_while_parked_leaves_nothing_behind() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkkill");
    let _agent = w.agent_seeing("2GiB");
    let (a_cg, b_cg) = w.parking_pair("parkkill-a", "parkkill-b");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &[
            "alloc", "512MiB", "fill", "0", "1", "launch", "1", "empty", "hold",
        ],
    );
    a.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut b = w.load(
        &b_cg,
        &SIM,
        &[
            "alloc", "512MiB", "alloc", "512MiB", "hold", "alloc", "128MiB",
        ],
    );
    b.expect("ready");
    assert_eq!(allocs(&b.lines)[1], Ok(512 << 20), "{:?}", b.lines);
    assert_eq!(w.status_row(&a_cg)["parked_bytes"], 512u64 << 20);
    drop(a); // SIGKILL, parked
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, out) = w.fgpu(&["status", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let parked = v.as_array().is_some_and(|a| {
            a.iter()
                .any(|c| c["cgroup"] == a_cg.path.as_str() && c["parked_bytes"] != 0)
        });
        if !parked {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a dead container still counted as parked: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // b goes on: its next allocation (within its limit) is made.
    b.release();
    let b = b.finish();
    assert_eq!(allocs(&b.lines)[2], Ok(128 << 20), "{b}");
}

/// A tenant asks, in every slot it can write, for a petabyte of room (1 PiB: more than any
/// GPU holds) while the GPU has plenty free: what it could use is at most its own limit's
/// headroom (512 MiB here), which the GPU has, so its idle parkable neighbour stays
/// resident. An honest tenant that needs more than is free still gets that neighbour parked.
#[test]
fn privileged_a_petabyte_room_request_parks_nobody_while_the_gpu_has_room() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkpib");
    let agent = w.agent_seeing("2GiB");
    let (a_cg, b_cg) = w.parking_pair("parkpib-a", "parkpib-b");
    w.set_limit(&b_cg, "2GiB");
    let h_cg = Cgroup::new("parkpib-h");
    w.set_limit(&h_cg, "512MiB");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &[
            "alloc", "256MiB", "fill", "0", "5", "launch", "1", "empty", "hold", "check", "0", "5",
        ],
    );
    a.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // 2 GiB - 2 × 300 MiB of contexts - a's 256 MiB - h's 64 MiB: 1128 MiB free.
    let h = w.client(
        &h_cg,
        &SIM,
        "forge-room",
        &["3000", &(1u64 << 30).to_string()],
    );
    let h = h.finish();
    assert!(h.line("forge-room done").contains("writes="), "{h}");
    // A park started for it would be over by now (one of 256 MiB takes 1-2 s here).
    std::thread::sleep(std::time::Duration::from_secs(3));
    let r = w.status_row(&a_cg);
    assert_eq!(r["parks"], 0, "parked for a petabyte request: {r}");
    assert_eq!(r["parked_bytes"], 0, "{r}");
    let log = agent.log_text();
    assert!(
        log.contains("clamped"),
        "the request was not said to be clamped:\n{log}"
    );
    // b: 300 MiB of context + 512 + 512 leave 168 MiB; its 256 MiB need a parked.
    let mut b = w.load(
        &b_cg,
        &SIM,
        &[
            "alloc", "512MiB", "alloc", "512MiB", "alloc", "256MiB", "hold",
        ],
    );
    b.expect("ready");
    assert_eq!(
        allocs(&b.lines),
        vec![Ok(512 << 20), Ok(512 << 20), Ok(256 << 20)],
        "b: {:?}\n{}",
        b.lines,
        agent.log_text()
    );
    assert_eq!(w.status_row(&a_cg)["parked_bytes"], 256u64 << 20);
    let b = b.finish();
    assert_eq!(b.code, Some(0), "{b}");
    a.release();
    let a = a.finish();
    assert_eq!(a.line("check 0"), "check 0 ok", "{a}");
}

/// Sends `sig` to every process of `cg`.
fn signal_all(cg: &Cgroup, sig: i32) {
    for pid in cg.procs() {
        // SAFETY: a plain signal to a test process (it may have ended: then ESRCH).
        unsafe { libc::kill(pid as i32, sig) };
    }
}

/// How long an `alloc-until` client waited for its memory: reads its result line
/// (`alloc-until ok ms=N ...`, or `alloc-until fail ...`: None), which comes within the
/// client's own bound (75 s here).
fn waited_ms(p: &mut Proc) -> Option<u64> {
    p.next_line("alloc-until ")?
        .strip_prefix("alloc-until ok ms=")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A parkable tenant that never answers a park (stopped: it holds its slot and its memory
/// and looks the least recently used) does not hold up parking for the node: the broker
/// gives up on it within a few seconds, parks another idle tenant for the asker it was
/// chosen for, and meanwhile serves a second asker by parking a third. Both askers retry
/// their allocation until they have it; how long each waited is what this test is about.
#[test]
fn privileged_a_tenant_that_never_answers_a_park_does_not_hold_up_the_node() {
    if !privileged() {
        return;
    }
    const SIM4: [(&str, &str); 2] = [("FGPU_SIM_MEMORY", "4GiB"), ("FGPU_LOG", "info")];
    let w = AgentWorld::new("parkmute");
    let agent = w.agent_seeing("4GiB");
    let parkable = |name: &str| {
        let cg = Cgroup::new(name);
        w.set_limits(&cg, &["--memory", "1500MiB", "--park-after", "1s"]);
        cg
    };
    let (s_cg, a_cg, c_cg) = (
        parkable("parkmute-s"),
        parkable("parkmute-a"),
        parkable("parkmute-c"),
    );
    let (b1_cg, b2_cg) = (Cgroup::new("parkmute-b1"), Cgroup::new("parkmute-b2"));
    w.set_limit(&b1_cg, "2GiB");
    w.set_limit(&b2_cg, "2GiB");
    let tenant = |cg: &Cgroup, seed: &str| {
        let mut p = w.load(
            cg,
            &SIM4,
            &[
                "alloc", "512MiB", "fill", "0", seed, "launch", "1", "empty", "hold", "check", "0",
                seed,
            ],
        );
        p.expect("ready");
        std::thread::sleep(std::time::Duration::from_millis(300));
        p
    };
    // s first: the least recently used. Stopped, it never answers a park.
    let s = tenant(&s_cg, "3");
    signal_all(&s_cg, libc::SIGSTOP);
    let mut a = tenant(&a_cg, "4");
    let mut c = tenant(&c_cg, "6");
    // 4 GiB - 5 × 300 MiB of contexts - 3 × 512 MiB - b1's 1 GiB: 36 MiB free.
    let asker = |cg: &Cgroup, first: &str| {
        let mut p = w.client(cg, &SIM4, "alloc-until", &["75000", first, "512", "30000"]);
        p.expect("alloc-until ready");
        p
    };
    let mut b2 = asker(&b2_cg, "0");
    let mut b1 = asker(&b1_cg, "1024");
    assert!(
        b1.lines.iter().any(|l| l == "alloc-until first ok"),
        "{:?}",
        b1.lines
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // b1 asks first (the broker picks s), b2 half a second later.
    b1.release();
    std::thread::sleep(std::time::Duration::from_millis(500));
    b2.release();
    // Each holds its memory once it has it (30 s), so that the other's room is made by a park.
    let w2 = waited_ms(&mut b2);
    let w1 = waited_ms(&mut b1);
    eprintln!("waited for room: first asker {w1:?} ms, second asker {w2:?} ms");
    assert!(
        w2.is_some_and(|ms| ms < 10_000),
        "the second asker waited {w2:?} ms: {:?}\n{}",
        b2.lines,
        agent.log_text()
    );
    assert!(
        w1.is_some_and(|ms| ms < 15_000),
        "the first asker waited {w1:?} ms: {:?}\n{}",
        b1.lines,
        agent.log_text()
    );
    let log = agent.log_text();
    for cg in [&a_cg, &c_cg] {
        let r = w.status_row(cg);
        assert_eq!(r["parked_bytes"], 512u64 << 20, "{r}\n{log}");
    }
    assert_eq!(w.status_row(&s_cg)["parks"], 0, "{log}");
    signal_all(&s_cg, libc::SIGCONT);
    drop((s, b1, b2));
    // Their data came back with them.
    for p in [&mut a, &mut c] {
        p.release();
        assert_eq!(
            p.next_line("check 0").as_deref(),
            Some("check 0 ok"),
            "{:?}",
            p.lines
        );
    }
}
