//! Cross-process behaviour of the simulated driver, driven through fgpu-sim-load.

mod common;
use common::*;
use std::time::{Duration, Instant};

const OVERHEAD: u64 = 300 * MIB;

#[test]
fn second_process_sees_first_processes_memory_and_nvml_lists_it() {
    let env = SimEnv::new("visibility");
    let a = env.hold(&[
        "alloc", "256MiB", "alloc", "256MiB", "alloc", "256MiB", "hold",
    ]);
    assert_eq!(
        a.lines.iter().filter(|l| l.starts_with("alloc ok")).count(),
        3
    );
    let b = env.run(&["info", "nvml"]);
    // B's own context overhead is charged too.
    assert_eq!(info_free(&b), 16 * GIB - 768 * MIB - 2 * OVERHEAD);
    let a_pid = a.pid() as u64;
    let procs: Vec<&String> = b.iter().filter(|l| l.starts_with("nvml process")).collect();
    let a_line = procs
        .iter()
        .find(|l| field(l, "pid") == Some(a_pid))
        .unwrap_or_else(|| panic!("pid {a_pid} not listed: {b:?}"));
    assert_eq!(field(a_line, "used"), Some(768 * MIB + OVERHEAD));
    assert_eq!(procs.len(), 2, "A and B: {b:?}");
    let dev = line(&b, "nvml device=0");
    assert_eq!(field(dev, "used"), Some(768 * MIB + 2 * OVERHEAD));
    assert!(dev.contains("uuid=GPU-5e1a0000-0000-0000-0000-000000000000"));
    a.release();
    // A exited normally: its memory is back.
    let c = env.run(&["info"]);
    assert_eq!(info_free(&c), 16 * GIB - OVERHEAD);
}

#[test]
fn sigkilled_process_memory_is_reclaimed() {
    let env = SimEnv::new("sigkill");
    let a = env.hold(&["alloc", "1GiB", "alloc-api", "vmm", "512MiB", "hold"]);
    let b = env.run(&["info"]);
    assert_eq!(info_free(&b), 16 * GIB - 1536 * MIB - 2 * OVERHEAD);
    a.kill9();
    let c = env.run(&["info", "nvml"]);
    assert_eq!(info_free(&c), 16 * GIB - OVERHEAD);
    assert_eq!(
        c.iter().filter(|l| l.starts_with("nvml process")).count(),
        1
    );
}

#[test]
fn allocation_past_device_memory_fails_with_oom_and_charges_nothing() {
    let env = SimEnv::with_memory("oom", "2GiB");
    let out = env.run(&[
        "alloc", "1GiB", "info", "alloc", "1GiB", "info", "alloc", "600MiB", "info",
    ]);
    let allocs: Vec<&String> = out.iter().filter(|l| l.starts_with("alloc")).collect();
    assert!(allocs[0].starts_with("alloc ok"));
    assert!(allocs[1].starts_with("alloc fail rc=2"), "{out:?}");
    assert!(allocs[2].starts_with("alloc ok"), "{out:?}");
    let infos: Vec<u64> = out
        .iter()
        .filter(|l| l.starts_with("info "))
        .map(|l| field(l, "free").unwrap_or(0))
        .collect();
    assert_eq!(infos[0], 2 * GIB - GIB - OVERHEAD);
    assert_eq!(
        infos[1], infos[0],
        "a failed allocation must not be charged"
    );
    assert_eq!(infos[2], infos[0] - 600 * MIB);
    // Across processes: A holds 1 GiB, B cannot get another 1 GiB; every API says OOM.
    let a = env.hold(&["alloc", "1GiB", "hold"]);
    for api in ["mem_alloc", "pitch", "async", "pool", "vmm", "array"] {
        let b = env.run(&["alloc-api", api, "1GiB", "info"]);
        assert!(
            line(&b, "alloc").starts_with("alloc fail rc=2"),
            "{api}: {b:?}"
        );
        assert_eq!(info_free(&b), 2 * GIB - GIB - 2 * OVERHEAD, "{api}");
    }
    // Managed memory is not charged until touched, so it fits.
    let b = env.run(&["alloc-api", "managed", "1GiB", "info"]);
    assert!(line(&b, "alloc").starts_with("alloc ok"), "{b:?}");
    a.release();
}

#[test]
fn stream_ordered_pool_keeps_memory_until_trimmed() {
    let env = SimEnv::new("pool");
    let out = env.run(&[
        "info",
        "alloc-api",
        "async",
        "64MiB",
        "alloc-api",
        "pool",
        "32MiB",
        "free-all",
        "info",
        "alloc-api",
        "async",
        "64MiB",
        "info",
        "free-last",
        "trim",
        "info",
    ]);
    let infos: Vec<u64> = out
        .iter()
        .filter(|l| l.starts_with("info "))
        .map(|l| field(l, "free").unwrap_or(0))
        .collect();
    assert_eq!(
        infos[1],
        infos[0] - 96 * MIB,
        "freed pool memory stays reserved"
    );
    assert_eq!(
        infos[2], infos[1],
        "reuse of the reservation charges nothing"
    );
    assert_eq!(infos[3], infos[0], "trim gives it back");
}

#[test]
fn vmm_memory_returns_after_unmap_and_release_across_processes() {
    let env = SimEnv::new("vmm-proc");
    let a = env.hold(&["alloc-api", "vmm", "3MiB", "hold"]);
    assert_eq!(field(&a.lines[2], "size"), Some(4 * MIB), "{:?}", a.lines);
    let b = env.run(&["info"]);
    assert_eq!(info_free(&b), 16 * GIB - 4 * MIB - 2 * OVERHEAD);
    a.release();
    let out = env.run(&[
        "info",
        "alloc-api",
        "vmm",
        "8MiB",
        "info",
        "free-last",
        "info",
    ]);
    let infos: Vec<u64> = out
        .iter()
        .filter(|l| l.starts_with("info "))
        .map(|l| field(l, "free").unwrap_or(0))
        .collect();
    assert_eq!(infos, [infos[0], infos[0] - 8 * MIB, infos[0]]);
}

fn timed_launches(env: &SimEnv, processes: usize) -> Duration {
    let args = ["launch", "100", "sleep_10000us", "sync"];
    let start = Instant::now();
    let children: Vec<_> = (0..processes)
        .map(|_| {
            env.command(&args)
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().expect("wait");
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        // Launches are asynchronous: enqueueing 100 × 10 ms takes far less than 1 s.
        let launch = line(&lines, "launch ok");
        let ms: f64 = launch
            .split("elapsed_ms=")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("elapsed_ms");
        assert!(ms < 500.0, "{launch}");
        line(&lines, "sync ok");
    }
    start.elapsed()
}

#[test]
fn device_timeline_is_shared_by_processes() {
    let single = SimEnv::new("timeline-1");
    let one = timed_launches(&single, 1);
    assert!(
        one >= Duration::from_millis(950) && one < Duration::from_millis(1500),
        "one process: {one:?}"
    );
    let pair = SimEnv::new("timeline-2");
    let two = timed_launches(&pair, 2);
    assert!(
        two >= Duration::from_millis(1800) && two < Duration::from_millis(2600),
        "two processes: {two:?}"
    );
}

#[test]
fn graph_replay_takes_the_sum_of_its_kernels_and_ptsz_and_dlsym_clients_work() {
    let env = SimEnv::new("graph");
    let start = Instant::now();
    let out = env.run(&["--ptsz", "--strict", "graph", "10", "sleep_10000us", "3"]);
    let took = start.elapsed();
    line(&out, "graph ok");
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(900),
        "{took:?}"
    );
    let out = env.run(&[
        "--dlsym-direct",
        "--strict",
        "alloc",
        "1MiB",
        "launch",
        "5",
        "empty",
        "sync",
        "free-all",
    ]);
    line(&out, "free ok");
}
