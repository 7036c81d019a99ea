//! Compute shares for HIP under the agent: `fgpu limit set CGROUP --compute PCT` reaches HIP
//! processes (the simulated `libamdhip64.so`) through the same turns as CUDA's, and HIP and
//! CUDA tenants take turns on one simulated device (they share its timeline). Every tenant
//! is a cgroup with a process in a PID namespace of its own, saturating the device with 1 ms
//! kernels (10 at a time, then a synchronisation); a tenant's share is the GPU time its
//! kernels took over its wall time — exact, the simulator runs one kernel at a time. No AMD
//! GPU is involved (docs/amd.md).
//!
//! `privileged_*` tests run the real agent (`fgpu agent --sim`) and need root.
//! Figures are printed (`cargo test --test hip_compute_agent -- --nocapture`).

mod common;

use common::agent::*;
use common::tenants::*;
use std::path::Path;

/// `elapsed_ms=` of a line.
fn tenant(w: &AgentWorld, program: &Path, name: &str, options: &[&str], work: &[&str]) -> Tenant {
    tenant_of(w, program, "hipcmp", name, options, work)
}

/// Two HIP tenants at 30 / 70 for 10 s, one replaying graphs (`hipGraphLaunch`), one
/// launching kernels (`hipLaunchKernel`): each within ±3 points of its share, the device kept
/// busy; `fgpu status` shows the HIP tenant's configured and achieved share.
#[test]
fn privileged_two_hip_tenants_at_30_70_get_their_shares() {
    if !privileged() {
        return;
    }
    let _one = measuring();
    let (w, hip) = hip_world("hipcmp3070");
    let agent = w.agent();
    let mut ts = vec![
        tenant(
            &w,
            &hip,
            "g30",
            &["--compute", "30"],
            &["graph-for", "10000", "10", "sleep_1000us"],
        ),
        tenant(
            &w,
            &hip,
            "k70",
            &["--compute", "70"],
            &["launch-for", "10000", "sleep_1000us"],
        ),
    ];
    expect_30_70("HIP ", &w, &agent, &mut ts);
}

/// A HIP tenant and a CUDA tenant at 50 / 50 on the same simulated device for 10 s: the
/// controller hands turns to both (their devices are one ledger record, bound by the same
/// UUID), each within ±3 points of half the work done, the device ≥ 90% busy
/// (`fgpu_testkit::shares`).
#[test]
fn privileged_a_hip_and_a_cuda_tenant_at_50_50_share_one_device() {
    if !privileged() {
        return;
    }
    let _one = measuring();
    let (w, hip) = hip_world("hipcmp5050");
    let agent = w.agent();
    let work = ["launch-for", "10000", "sleep_1000us"];
    let load = w.load.clone();
    let mut ts = vec![
        tenant(&w, &hip, "hip50", &["--compute", "50"], &work),
        tenant(&w, &load, "cuda50", &["--compute", "50"], &work),
    ];
    let cpu = CpuMeter::start();
    let (results, _) = run_together(&w, &agent, &mut ts, 100);
    let shares: Vec<f64> = results.iter().map(|r| share(&r[0])).collect();
    let ctx = format!("{results:#?}\nagent log:\n{}", agent.log_text());
    assert_shares(
        "HIP / CUDA 50/50 over 10 s",
        &[
            Measured::new("HIP", shares[0], 50.0),
            Measured::new("CUDA", shares[1], 50.0),
        ],
        3.0,
        &cpu,
        &ctx,
    );
}

/// A cap set on a running HIP process whose launches took the ungated fast path reaches it
/// within a fraction of a second: the whole device before, about 30 % after.
#[test]
fn privileged_a_cap_set_later_reaches_an_ungated_running_hip_process() {
    if !privileged() {
        return;
    }
    let _one = measuring();
    let (w, hip) = hip_world("hipcmplate");
    let agent = w.agent();
    let mut ts = vec![tenant(
        &w,
        &hip,
        "late",
        &[],
        &[
            "launch-for",
            "1000",
            "sleep_1000us",
            "launch-for",
            "3000",
            "sleep_1000us",
        ],
    )];
    let cg = ts[0].cg.path.clone();
    let (fgpu, socket) = w.fgpu_and_socket();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1200));
        std::process::Command::new(fgpu)
            .args(["limit", "set", &cg, "--compute-cap", "30", "--socket"])
            .arg(socket)
            .status()
            .expect("fgpu limit set")
            .success()
    });
    let (results, _) = run_together(&w, &agent, &mut ts, 100);
    assert!(setter.join().unwrap(), "fgpu limit set failed");
    let (before, after) = (share(&results[0][0]), share(&results[0][1]));
    println!("HIP: no limit, then a 30% cap set while running: {before:.1}% then {after:.1}%");
    let ctx = format!("{results:#?}\nagent log:\n{}", agent.log_text());
    assert!(before >= 70.0, "{ctx}");
    // 0.2 s at 100 %, then 2.8 s at 30 %: about 35 %.
    assert!((28.0..=42.0).contains(&after), "{ctx}");
}

/// A HIP tenant SIGKILLed while it waits for a turn, and while it holds one with batches in
/// flight (found by reading its own slot), never holds its CUDA neighbour off the device:
/// the neighbour is back at ≥ 90% of its solo rate from 200 ms after the kill, and a new HIP
/// process in the killed container gets its share next to it (each ±5 points of the work done
/// over 4 s, the device ≥ 90% busy).
#[test]
fn privileged_a_killed_hip_tenant_never_stalls_its_cuda_neighbour() {
    if !privileged() {
        return;
    }
    let _one = measuring();
    let (w, bin) = hip_world("hipkill");
    let agent = w.agent();
    let env = [("FGPU_LOG", "info")];
    let steps = |ms: &'static str| ["hold", "steps-for", ms, "10", "sleep_1000us", "0"];
    // The neighbour's solo rate (CUDA, no setting: not gated).
    let solo_cg = Cgroup::new(&unique("fgpu-hipkill-solo"));
    let mut p = w.load(&solo_cg, &env, &steps("2000"));
    p.expect("ready");
    let f = p.finish();
    let pr = progress(&f.lines);
    let alone = rate_between(&pr, pr[0].0 + 200, pr[pr.len() - 1].0);
    for m in [Moment::Waiting, Moment::Holding] {
        let a = Cgroup::new(&unique("fgpu-hipkill-a"));
        let b = Cgroup::new(&unique("fgpu-hipkill-b"));
        w.set_limits(&a, &["--compute", "50"]);
        w.set_limits(&b, &["--compute", "50"]);
        let hip = |cg: &Cgroup, ms: &str| {
            let mut p =
                Proc::start(w.command(cg, &env, &bin, &["hold", "launch-for", ms, "sleep_1000us"]));
            p.expect("ready");
            p
        };
        let mut victim = hip(&a, "20000");
        let mut nb = w.load(&b, &env, &steps("9000"));
        nb.expect("ready");
        victim.release();
        nb.release();
        std::thread::sleep(std::time::Duration::from_millis(1000));
        let pid = a
            .procs()
            .into_iter()
            .find(|&p| p != victim.pid())
            .expect("the HIP workload in its cgroup");
        assert!(
            wait_for(usage_of(pid), m),
            "the HIP tenant never seen {m:?}\nagent log:\n{}",
            agent.log_text()
        );
        // SAFETY: signalling the test's own workload process.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        let t_kill = mono_ns() / 1_000_000;
        std::thread::sleep(std::time::Duration::from_millis(1500));
        // A new process in the killed container, next to the neighbour for a share's window
        // (4 s from 500 ms after it starts, as in compute_hostile.rs).
        let mut newcomer = hip(&a, "5000");
        newcomer.release();
        let t_new = mono_ns() / 1_000_000;
        let cpu = CpuMeter::start();
        let nf = newcomer.finish();
        let bf = nb.finish();
        let ctx = format!(
            "HIP tenant killed while {m:?}\nnewcomer: {nf}\nneighbour: {bf}\nagent log:\n{}",
            agent.log_text()
        );
        assert_eq!(bf.code, Some(0), "{ctx}");
        assert_eq!(nf.code, Some(0), "{ctx}");
        let p = progress(&bf.lines);
        let after = rate_between(&p, t_kill + 200, t_kill + 1200);
        let line = nf
            .lines
            .iter()
            .find(|l| l.starts_with("launch-for ok"))
            .unwrap_or_else(|| panic!("no result from the newcomer\n{ctx}"));
        let mine = share(line);
        let theirs = 100.0 * rate_between(&p, t_new + 500, t_new + 4500) / alone;
        println!(
            "HIP tenant killed while {m:?}: CUDA neighbour {:.1}% of solo from 200 ms after",
            100.0 * after / alone
        );
        assert!(
            after >= 0.9 * alone,
            "neighbour not back: {after:.1} vs {alone:.1}\n{ctx}"
        );
        assert_shares(
            &format!("  then a new HIP process in the killed container next to it ({m:?})"),
            &[
                Measured::new("newcomer", mine, 50.0),
                Measured::new("neighbour", theirs, 50.0),
            ],
            5.0,
            &cpu,
            &ctx,
        );
        a.kill();
        drop(victim);
    }
}

/// Issue 28: `fgpu agent --sim` probes the simulated HIP runtime from its start, installed
/// as ROCm installs it (`libamdhip64.so.7`, and `libamdhip64.so` a symlink to it, as
/// `cargo xtask` now installs the simulator): a HIP process without the shim that loads the
/// unversioned name has its allocation attributed to its cgroup at once, no start-up sleep
/// for the watcher. (Before, the agent probed only `libcuda.so.1` under `--sim`, and the
/// simulator's two HIP names were two files: 0 bytes attributed.)
#[test]
fn privileged_the_sim_agent_attributes_hip_allocations_through_either_name() {
    if !privileged() {
        return;
    }
    let (w, hip) = hip_world("hipattr");
    let so7 = w.sim_dir.join("libamdhip64.so.7");
    let link = w.sim_dir.join("libamdhip64.so");
    std::fs::rename(&link, &so7).unwrap();
    std::os::unix::fs::symlink("libamdhip64.so.7", &link).unwrap();
    let agent = w.agent();
    let log = agent.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("attached") && l.contains("libamdhip64.so.7")),
        "the agent probes the simulated HIP runtime at start:\n{log}"
    );
    let cg = Cgroup::new(&unique("fgpu-hipattr"));
    let mut p = Proc::start(w.command(
        &cg,
        &[("LD_PRELOAD", "")],
        &hip,
        &["alloc-api", "malloc", "256MiB", "hold"],
    ));
    p.expect("ready");
    let (_, status) = w.fgpu(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    let used = v
        .as_array()
        .or_else(|| v["cgroups"].as_array())
        .and_then(|a| a.iter().find(|r| r["cgroup"] == cg.path.as_str()))
        .map(|r| r["memory_used_bytes"].as_u64().unwrap_or(0));
    assert_eq!(
        used,
        Some(256 << 20),
        "the kernel's count for {}: {status}\n{}",
        cg.path,
        agent.log_text()
    );
    let f = p.finish();
    assert_eq!(f.code, Some(0), "{f}");
}
