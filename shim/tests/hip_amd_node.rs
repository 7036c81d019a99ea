//! An AMD node as the agent sees it: no NVML, the devices from ROCm SMI (the HIP simulator's
//! `librocm_smi64.so`), HIP processes whose `hipDeviceGetUuid` answers in ROCm's form
//! (`FGPU_SIM_HIP_UUID=rocm`: the 16 hex digits of the SMI unique id, as ASCII). The agent
//! lists the GPU by ROCm's UUID, its metrics label the HIP tenants' memory and turns with it
//! (the agent's device and the shim's HIP device records are the same records), and
//! agent-given memory limits and compute shares bind. No AMD GPU is involved (docs/amd.md).
//!
//! `privileged_*` tests need root (eBPF, cgroups, PID namespaces).

mod common;

use common::agent::*;
use common::{MIB, field};
use fgpu_testkit::agent::{AgentPaths, SimAgent};
use fgpu_testkit::shares::{CpuMeter, Measured, assert_shares};
use std::io::{Read, Write};
use std::path::PathBuf;

/// ROCm's UUID of simulated device 0 (unique id 0).
const UUID0: &str = "GPU-0000000000000000";

/// An agent world without NVML (`libnvidia-ml.so.1` removed from the simulator's directory)
/// and with the HIP runtime and ROCm SMI: (world, fgpu-sim-hip).
fn amd_world(name: &str) -> (AgentWorld, PathBuf) {
    let (w, bin) = hip_world(name);
    std::fs::remove_file(w.sim_dir.join("libnvidia-ml.so.1")).unwrap();
    (w, bin)
}

/// The agent with its metrics endpoint on a free loopback port: (agent, port).
fn agent_with_metrics(w: &AgentWorld) -> (Agent, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let log = w
        .state_dir
        .with_file_name(format!("agent-{}.log", unique("log")));
    let addr = format!("127.0.0.1:{port}");
    let agent = SimAgent::start(
        &AgentPaths {
            fgpu: &w.fgpu,
            sim_dir: &w.sim_dir,
            socket: &w.socket,
            state_dir: &w.state_dir,
            bpf_dir: &w.bpf_dir,
            log: &log,
        },
        &["--metrics", &addr],
    );
    (agent, port)
}

fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn privileged_an_agent_without_nvml_knows_amd_gpus_by_rocm_uuid_and_its_limits_bind() {
    if !privileged() {
        return;
    }
    let (w, hip) = amd_world("amdnode");
    let (agent, port) = agent_with_metrics(&w);
    let log = agent.log_text();
    assert!(
        log.contains(&format!("uuid={UUID0}")) && log.contains("source=\"rocm_smi\""),
        "the agent lists the GPU from ROCm SMI:\n{log}"
    );
    assert!(log.contains("memory=17179869184"), "its VRAM size: {log}");

    // Memory: a limit set with `fgpu limit set` binds a HIP process on that device.
    let rocm = [("FGPU_SIM_HIP_UUID", "rocm")];
    let cg = Cgroup::new(&unique("fgpu-amdnode-mem"));
    w.set_limit(&cg, "1GiB");
    // The first step gives the agent's watcher time to attach its probes to the freshly
    // mapped HIP library (the kernel's figures are what the metrics report).
    let args = [
        "sleep",
        "1500",
        "uuid",
        "alloc-api",
        "malloc",
        "512MiB",
        "alloc-api",
        "malloc",
        "512MiB",
        "info",
        "hold",
    ];
    let mut p = Proc::start(w.command(&cg, &rocm, &hip, &args));
    p.expect("ready");
    let uuid_line = p
        .lines
        .iter()
        .find(|l| l.starts_with("uuid "))
        .cloned()
        .unwrap();
    assert!(
        uuid_line.ends_with(&format!("hex={}", hex(UUID0.trim_start_matches("GPU-")))),
        "the HIP runtime reports ROCm's form: {uuid_line}"
    );
    // The harness charges a 300 MiB context: 724 MiB are left, the second 512 MiB is refused.
    let allocs = allocs(&p.lines);
    assert_eq!(allocs, vec![Ok(512 * MIB), Err(2)], "{:#?}", p.lines);
    let info = p
        .lines
        .iter()
        .find(|l| l.starts_with("info "))
        .cloned()
        .unwrap();
    assert_eq!(field(&info, "total"), 1 << 30, "{info}");

    // Compute: two HIP tenants at 30 / 70 get their shares through the agent's turns (within
    // 4 points over 5 s; shim/tests/hip_compute_agent.rs holds 3 over 10 s).
    let tenant = |name: &str, pct: &str| {
        let cg = Cgroup::new(&unique(&format!("fgpu-amdnode-{name}")));
        w.set_limits(&cg, &["--compute", pct]);
        let work = ["hold", "launch-for", "5000", "sleep_1000us"];
        let mut p = Proc::start(w.command(&cg, &rocm, &hip, &work));
        p.expect("ready");
        (cg, p)
    };
    let (_c30, mut t30) = tenant("c30", "30");
    let (_c70, mut t70) = tenant("c70", "70");
    let cpu = CpuMeter::start();
    t30.release();
    t70.release();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let metrics = scrape(port);
    let share = |p: Proc| {
        let f = p.finish();
        assert_eq!(f.code, Some(0), "{f}");
        let l = f.line("launch-for ok");
        let ms: f64 = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("elapsed_ms="))
            .and_then(|v| v.parse().ok())
            .unwrap();
        100.0 * field(l, "n") as f64 / ms
    };
    let (s30, s70) = (share(t30), share(t70));
    let ctx = format!("agent log:\n{}", agent.log_text());
    assert_shares(
        "AMD node (no NVML): HIP tenants at 30/70",
        &[
            Measured::new("c30", s30, 30.0),
            Measured::new("c70", s70, 70.0),
        ],
        4.0,
        &cpu,
        &ctx,
    );
    // The metrics name the device by ROCm's UUID: the memory held on it, and the turn
    // switches the controller made on the ledger record the HIP processes bound (found by the
    // agent's device's UUID bytes: the same record).
    let label = format!("gpu=\"0\",UUID=\"{UUID0}\"");
    let mem = metrics
        .lines()
        .find(|l| l.starts_with("fgpu_cgroup_memory_used_bytes{") && l.contains(&label));
    assert!(mem.is_some(), "memory on the AMD GPU by UUID:\n{metrics}");
    let switches = metrics
        .lines()
        .find(|l| l.contains("switch") && l.contains(&label) && l.contains("_count"));
    assert!(
        switches.is_some(),
        "turn switches on the AMD GPU by UUID:\n{metrics}"
    );
    drop(p);
}

/// Lowercase hex of a string's bytes.
fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}
