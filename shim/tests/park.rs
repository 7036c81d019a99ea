//! Parking (issue 29, docs/parking.md) under the real agent (`fgpu agent --sim`), over the
//! simulated driver, which keeps device data and fails a touch of unmapped memory with a
//! sticky CUDA_ERROR_ILLEGAL_ADDRESS: a tenant whose memory came back wrong, or that touched
//! it while it was parked, fails its `check` lines.
//!
//! The simulated GPU has 2 GiB; every process's context takes 300 MiB of it.
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

/// An idle parkable tenant holding 512 MiB is parked when another tenant's allocation finds
/// the GPU full; the other's allocation then succeeds; the parked tenant holds nothing on the
/// GPU (status: parked 512 MiB); its next copy brings the memory back at the same addresses,
/// byte for byte.
#[test]
fn privileged_an_idle_parkable_tenant_is_parked_for_another_and_comes_back_byte_for_byte() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("park");
    let _agent = w.agent_seeing("2GiB");
    let (a_cg, b_cg) = w.parking_pair("park-a", "park-b");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &[
            "alloc", "256MiB", "alloc", "256MiB", "fill", "0", "7", "fill", "1", "9", "launch",
            "1", "empty", "hold", "check", "0", "7", "check", "1", "9", "info",
        ],
    );
    a.expect("ready");
    let before = w.status_row(&a_cg);
    assert_eq!(before["park_after_ms"], 1000, "{before}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // 2 GiB - 300 MiB (a's context) - 512 MiB (a) - 300 MiB (b's context) = 936 MiB free:
    // the second 512 MiB only fits once a is parked.
    let mut b = w.load(
        &b_cg,
        &SIM,
        &["alloc", "512MiB", "alloc", "512MiB", "info", "hold"],
    );
    b.expect("ready");
    let allocs = allocs(&b.lines);
    if allocs != vec![Ok(512 << 20), Ok(512 << 20)] {
        let r = w.status_row(&a_cg);
        drop(b);
        a.release();
        panic!(
            "b's allocations: {allocs:?}\na's row: {r}\na: {}\nagent: {}",
            a.finish(),
            _agent.log_text()
        );
    }
    let parked = w.status_row(&a_cg);
    assert_eq!(parked["parked_bytes"], 512u64 << 20, "{parked}");
    assert_eq!(parked["parks"], 1, "{parked}");
    assert!(
        parked["memory_used_bytes"].as_u64().unwrap() < 400 << 20,
        "a parked holds its context only: {parked}"
    );
    let (ok, text) = w.fgpu(&["status"]);
    assert!(
        ok && text.contains("parked: 512MiB in host memory"),
        "{text}"
    );
    // b ends: its memory goes back; a's next copy unparks it.
    let b = b.finish();
    assert_eq!(b.code, Some(0), "{b}");
    a.release();
    let a = a.finish();
    assert_eq!(a.code, Some(0), "{a}");
    assert_eq!(a.line("check 0"), "check 0 ok", "{a}");
    assert_eq!(a.line("check 1"), "check 1 ok", "{a}");
    assert!(a.stderr.contains("unparked 512MiB"), "{a}");
}

/// A parkable tenant working on two GPUs reads each GPU's memory from the other's context,
/// as it can with `cuMemAlloc` memory: backed memory is opened to every device the process
/// holds a context on (mapped memory is reachable only from the devices `cuMemSetAccess`
/// names; the simulator faults any other, as a real GPU does). Memory made before the second
/// context (opened when it comes) and after it; both again after a park and an unpark,
/// which maps the memory anew.
#[test]
fn privileged_a_parkable_two_gpu_tenant_reaches_each_gpus_memory_from_the_other_before_and_after_a_park()
 {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkgpus");
    let _agent = w.agent_seeing_gpus("2GiB", "2", &[]);
    let env = [
        ("FGPU_SIM_MEMORY", "2GiB"),
        ("FGPU_SIM_DEVICES", "2"),
        ("FGPU_LOG", "info"),
    ];
    let a_cg = Cgroup::new("parkgpus-a");
    let b_cg = Cgroup::new("parkgpus-b");
    w.set_limits(&a_cg, &["--memory", "1500MiB", "--park-after", "1s"]);
    w.set_limit(&b_cg, "1800MiB");
    // 0: 128 MiB on GPU 0, made before a context on GPU 1 exists; 1: 64 MiB on GPU 1. After
    // the park, each is read from the other GPU's context first (that read unparks).
    let mut a = w.load(
        &a_cg,
        &env,
        &[
            "--error-names",
            "device",
            "0",
            "alloc",
            "128MiB",
            "fill",
            "0",
            "7",
            "device",
            "1",
            "check",
            "0",
            "7",
            "alloc",
            "64MiB",
            "fill",
            "1",
            "9",
            "device",
            "0",
            "check",
            "1",
            "9",
            "launch",
            "1",
            "empty",
            "hold",
            "device",
            "1",
            "check",
            "0",
            "7",
            "device",
            "0",
            "check",
            "1",
            "9",
        ],
    );
    a.expect("ready");
    let early: Vec<&String> = a.lines.iter().filter(|l| l.starts_with("check")).collect();
    assert_eq!(early, ["check 0 ok", "check 1 ok"], "{:?}", a.lines);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // GPU 0: 2 GiB - 300 MiB (a's context) - 128 MiB (a) = 1620 MiB free; b needs 1708.
    let mut b = w.load(
        &b_cg,
        &env,
        &[
            "alloc", "512MiB", "alloc", "512MiB", "alloc", "384MiB", "hold",
        ],
    );
    b.expect("ready");
    assert_eq!(
        allocs(&b.lines),
        vec![Ok(512 << 20), Ok(512 << 20), Ok(384 << 20)],
        "b"
    );
    let parked = w.status_row(&a_cg);
    assert_eq!(parked["parked_bytes"], 192u64 << 20, "{parked}");
    let b = b.finish();
    assert_eq!(b.code, Some(0), "{b}");
    a.release();
    let a = a.finish();
    assert_eq!(a.code, Some(0), "{a}");
    let checks: Vec<&String> = a.lines.iter().filter(|l| l.starts_with("check")).collect();
    assert_eq!(checks.len(), 4, "{a}");
    assert!(checks.iter().all(|l| l.ends_with(" ok")), "{a}");
    assert!(a.stderr.contains("unparked 192MiB"), "{a}");
}

/// The other ways a program has the GPU touch its memory pass the same door as copies and
/// launches: a parked tenant whose next call is a batched copy (CUDA 13.0's
/// `cuMemcpyBatchAsync_v2`, CUDA 12.8's `cuMemcpyBatchAsync`) or a stream memory operation
/// (`cuStreamWriteValue32_v2`, `cuStreamWaitValue32_v2`, a batch of them through
/// `cuStreamBatchMemOp_v2`) is unparked first, and that call
/// sees its data (over unmapped memory the simulator fails it with 700 and poisons the
/// context).
#[test]
fn privileged_batched_copies_and_stream_memory_operations_bring_a_parked_tenant_back() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkops");
    let _agent = w.agent_seeing("2GiB");
    for op in [
        "batch-check",
        "batch12-check",
        "write-value",
        "wait-value",
        "mem-ops",
    ] {
        let (a_cg, b_cg) = w.parking_pair(&format!("parkops-a-{op}"), &format!("parkops-b-{op}"));
        let mut a = w.load(
            &a_cg,
            &SIM,
            &[
                "alloc", "256MiB", "alloc", "256MiB", "fill", "0", "7", "fill", "1", "9", "launch",
                "1", "empty", "hold", op, "0", "7", "check", "0", "7", "check", "1", "9",
            ],
        );
        a.expect("ready");
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let mut b = w.load(&b_cg, &SIM, &["alloc", "512MiB", "alloc", "512MiB", "hold"]);
        b.expect("ready");
        assert_eq!(
            allocs(&b.lines),
            vec![Ok(512 << 20), Ok(512 << 20)],
            "{op}: b"
        );
        let parked = w.status_row(&a_cg);
        assert_eq!(parked["parked_bytes"], 512u64 << 20, "{op}: {parked}");
        let b = b.finish();
        assert_eq!(b.code, Some(0), "{op}: {b}");
        a.release();
        let a = a.finish();
        assert_eq!(a.line(op), format!("{op} 0 ok"), "{op}: {a}");
        assert_eq!(a.line("check 0"), "check 0 ok", "{op}: {a}");
        assert_eq!(a.line("check 1"), "check 1 ok", "{op}: {a}");
        assert!(a.stderr.contains("unparked 512MiB"), "{op}: {a}");
        assert_eq!(a.code, Some(0), "{op}: {a}");
    }
}

/// A tenant holding memory that cannot move is not parked: the other tenant's allocation
/// fails as it would without parking, and the status says why. One case per kind of memory
/// that pins (a pitched allocation, managed memory, a stream-ordered allocation, a memory
/// pool's, a CUDA array, and memory allocated before the container was made parkable).
#[test]
fn privileged_pinned_tenants_are_not_parked_and_status_says_why() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkpin");
    let _agent = w.agent_seeing("2GiB");
    for (api, reason) in [
        ("pitch", "pitched allocations"),
        ("managed", "managed memory"),
        ("async", "stream-ordered allocations or memory pools"),
        ("pool", "stream-ordered allocations or memory pools"),
        ("array", "CUDA arrays"),
        ("early", "memory allocated before parking was enabled"),
    ] {
        let a_cg = Cgroup::new(&format!("parkpin-a-{api}"));
        let b_cg = Cgroup::new(&format!("parkpin-b-{api}"));
        let early = api == "early";
        if early {
            w.set_limits(&a_cg, &["--memory", "1500MiB"]);
        } else {
            w.set_limits(&a_cg, &["--memory", "1500MiB", "--park-after", "1s"]);
        }
        w.set_limit(&b_cg, "1800MiB");
        let first: Vec<&str> = if early {
            vec!["alloc", "256MiB"]
        } else {
            vec!["alloc-api", api, "256MiB"]
        };
        let mut steps = first;
        steps.extend(["alloc", "256MiB", "launch", "1", "empty", "hold"]);
        let mut a = w.load(&a_cg, &SIM, &steps);
        a.expect("ready");
        if early {
            // Parkable from now on: what it holds was allocated before.
            w.set_limits(&a_cg, &["--park-after", "1s"]);
        }
        std::thread::sleep(std::time::Duration::from_millis(1500));
        // 300 + 512 + 768 MiB for b: more than the 2 GiB less a's context and its plain
        // 256 MiB, whether or not the simulator puts a's other 256 MiB on the device
        // (managed memory it does not); parking a's plain 256 MiB would make it fit.
        let mut b = w.load(&b_cg, &SIM, &["alloc", "512MiB", "alloc", "768MiB", "hold"]);
        b.expect("ready");
        let allocs = allocs(&b.lines);
        assert_eq!(allocs[0], Ok(512 << 20), "{api}: {:?}", b.lines);
        assert_eq!(
            allocs[1],
            Err(2),
            "{api}: out of memory, as without parking: {:?}",
            b.lines
        );
        let r = w.status_row(&a_cg);
        assert_eq!(r["parked_bytes"], 0, "{api}: {r}");
        assert!(r["park_pinned"].to_string().contains(reason), "{api}: {r}");
        let (ok, text) = w.fgpu(&["status"]);
        assert!(
            ok && text.contains(&format!("not parkable: {reason}")),
            "{api}: {text}"
        );
        drop(b);
        drop(a);
    }
}

/// A tenant that keeps launching is never idle for its park-after: it is not parked, and the
/// other's allocation fails.
#[test]
fn privileged_a_busy_tenant_is_not_parked() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkbusy");
    let _agent = w.agent_seeing("2GiB");
    let (a_cg, b_cg) = w.parking_pair("parkbusy-a", "parkbusy-b");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &[
            "alloc",
            "512MiB",
            "hold",
            "launch-for",
            "4000",
            "sleep_1000us",
            "fill",
            "0",
            "3",
            "check",
            "0",
            "3",
        ],
    );
    a.expect("ready");
    a.release();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut b = w.load(&b_cg, &SIM, &["alloc", "512MiB", "alloc", "512MiB", "hold"]);
    b.expect("ready");
    let allocs = allocs(&b.lines);
    assert_eq!(allocs[1], Err(2), "{:?}", b.lines);
    assert_eq!(w.status_row(&a_cg)["parks"], 0);
    let a = a.finish();
    assert_eq!(a.line("check 0"), "check 0 ok", "{a}");
}

/// A container of two processes is parked whole, and each gets its own data back.
#[test]
fn privileged_a_two_process_container_is_parked_whole() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parktwo");
    let _agent = w.agent_seeing("2GiB");
    let a_cg = Cgroup::new("parktwo-a");
    let b_cg = Cgroup::new("parktwo-b");
    w.set_limits(&a_cg, &["--memory", "1800MiB", "--park-after", "1s"]);
    w.set_limit(&b_cg, "1500MiB");
    let steps = |seed: &'static str| {
        vec![
            "alloc", "256MiB", "fill", "0", seed, "launch", "1", "empty", "hold", "check", "0",
            seed,
        ]
    };
    let mut a1 = w.load(&a_cg, &SIM, &steps("5"));
    a1.expect("ready");
    let mut a2 = w.load(&a_cg, &SIM, &steps("6"));
    a2.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // 2 GiB - 2 × (300 + 256) MiB (a) - 300 MiB (b's context) = 636 MiB free: the second
    // 512 MiB fits only once both of a's processes are parked.
    let mut b = w.load(&b_cg, &SIM, &["alloc", "512MiB", "alloc", "512MiB", "hold"]);
    b.expect("ready");
    assert_eq!(
        allocs(&b.lines),
        vec![Ok(512 << 20), Ok(512 << 20)],
        "{:?}",
        b.lines
    );
    let r = w.status_row(&a_cg);
    assert_eq!(
        r["parked_bytes"],
        512u64 << 20,
        "both processes parked: {r}"
    );
    assert_eq!(r["parks"], 2, "{r}");
    drop(b);
    for (mut a, n) in [(a1, "first"), (a2, "second")] {
        a.release();
        let a = a.finish();
        assert_eq!(a.line("check 0"), "check 0 ok", "{n}: {a}");
    }
}

/// The agent is killed while a container is parked and the GPU has no room for it: its next
/// copy waits (it never takes memory another container holds), and once the other container
/// ends, the memory comes back, byte for byte, with no agent to ask.
#[test]
fn privileged_a_parked_tenant_comes_back_without_the_agent_once_there_is_room() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkdead");
    let agent = w.agent_seeing("2GiB");
    let (a_cg, b_cg) = w.parking_pair("parkdead-a", "parkdead-b");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &[
            "alloc", "512MiB", "fill", "0", "8", "launch", "1", "empty", "hold", "check", "0", "8",
        ],
    );
    a.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut b = w.load(&b_cg, &SIM, &["alloc", "512MiB", "alloc", "512MiB", "hold"]);
    b.expect("ready");
    assert_eq!(allocs(&b.lines)[1], Ok(512 << 20), "{:?}", b.lines);
    assert_eq!(w.status_row(&a_cg)["parked_bytes"], 512u64 << 20);
    agent.crash();
    // a's copy waits: 2 GiB - 300 (a) - 300 - 1024 (b) = 424 MiB free, 512 needed.
    a.release();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // b ends: room.
    b.release();
    let b = b.finish();
    assert_eq!(b.code, Some(0), "{b}");
    let a = a.finish();
    assert_eq!(a.line("check 0"), "check 0 ok", "{a}");
    assert!(a.stderr.contains("unparked 512MiB"), "{a}");
}

/// The agent restarts while a container is parked: the new agent's status shows it parked
/// (its processes' slots say so), and it comes back byte for byte.
#[test]
fn privileged_a_restarted_agent_still_sees_a_parked_container() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parkrestart");
    let agent = w.agent_seeing("2GiB");
    let (a_cg, b_cg) = w.parking_pair("parkrestart-a", "parkrestart-b");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &[
            "alloc", "512MiB", "fill", "0", "4", "launch", "1", "empty", "hold", "check", "0", "4",
        ],
    );
    a.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut b = w.load(&b_cg, &SIM, &["alloc", "512MiB", "alloc", "512MiB", "hold"]);
    b.expect("ready");
    assert_eq!(allocs(&b.lines)[1], Ok(512 << 20), "{:?}", b.lines);
    agent.crash();
    let _again = w.agent_seeing("2GiB");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let seen = loop {
        let (ok, out) = w.fgpu(&["status", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let r = v.as_array().and_then(|a| {
            a.iter()
                .find(|c| c["cgroup"] == a_cg.path.as_str())
                .cloned()
        });
        if ok
            && r.as_ref()
                .is_some_and(|r| r["parked_bytes"] == 512u64 << 20)
        {
            break r.unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted agent does not show a's parked memory: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(seen["park_after_ms"], 1000, "{seen}");
    drop(b);
    a.release();
    let a = a.finish();
    assert_eq!(a.line("check 0"), "check 0 ok", "{a}");
}

/// With no parkable container on the node, a full GPU fails an allocation at once, as
/// without parking: the shim does not ask the agent for room (nobody could be parked).
#[test]
fn privileged_without_a_parkable_container_nobody_asks_for_room() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("parknone");
    let agent = w.agent_seeing("2GiB");
    let a_cg = Cgroup::new("parknone-a");
    let b_cg = Cgroup::new("parknone-b");
    w.set_limit(&a_cg, "1500MiB");
    w.set_limit(&b_cg, "1500MiB");
    let mut a = w.load(
        &a_cg,
        &SIM,
        &["alloc", "512MiB", "launch", "1", "empty", "hold"],
    );
    a.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut b = w.load(&b_cg, &SIM, &["alloc", "512MiB", "alloc", "512MiB", "hold"]);
    b.expect("ready");
    assert_eq!(allocs(&b.lines)[1], Err(2), "{:?}", b.lines);
    let log = agent.log_text();
    assert!(
        !log.contains("asked for room"),
        "nobody is parkable, yet the shim asked:\n{log}"
    );
}
