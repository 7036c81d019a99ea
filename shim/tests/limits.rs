//! libfgpu.so against the simulated driver (fgpu-sim): memory limits for unmodified CUDA
//! clients. No GPU and no root needed.
//!
//! Every test uses its own simulated device (16 GiB, 300 MiB context overhead per process)
//! and its own ledger. Limits are written as OVERHEAD + what the allocations may take, so
//! that "up to the limit, 0 bytes over" is checked exactly, also against what the simulated
//! driver itself handed out (observed by a client without the shim).

mod common;

use common::*;

/// Re-executed as a client by `World::client`; does nothing in a normal test run.
#[test]
fn client_entry() {
    if common::client::main() {
        std::process::exit(0);
    }
}

fn mib(n: u64) -> String {
    format!("{}MiB", n)
}

const APIS: [&str; 6] = ["mem_alloc", "pitch", "managed", "async", "pool", "array"];

/// 4 × 256 MiB fit, the 5th is refused, 100 MiB more fits exactly, 1 byte more is refused;
/// after a free, 256 MiB fit again. Then the driver's own count is exactly the limit.
fn fill_exactly(style: &[&str], api: &str) {
    let w = World::new(&format!("fill-{api}"));
    let limit = OVERHEAD + GIB + 100 * MIB;
    let mut args: Vec<&str> = style.to_vec();
    for _ in 0..5 {
        args.extend(["alloc-api", api, "256MiB"]);
    }
    args.extend(["alloc-api", api, "100MiB", "alloc-api", api, "1"]);
    args.extend(["free", "0", "alloc-api", api, "256MiB", "info"]);
    let h = w.hold(&[("FGPU_MEMORY_LIMIT", &mib(limit >> 20))], &args);
    let ctx = format!("api {api} style {style:?}\n{}", h.before);
    let a = h.allocs();
    assert_ok_then_oom(&a, 4, &ctx);
    assert_eq!(a[5], Ok(100 * MIB), "{ctx}");
    assert_eq!(a[6], Err(2), "{ctx}");
    assert_eq!(a[7], Ok(256 * MIB), "{ctx}");
    assert_eq!(a.len(), 8, "{ctx}");
    let info = h.before.lines().find(|l| l.starts_with("info ")).unwrap();
    assert_eq!(field(info, "total"), limit, "{ctx}");
    assert_eq!(field(info, "free"), 0, "{ctx}");
    let driver = w.device_used();
    if api == "managed" {
        // The driver charges managed memory only when touched; the shim counts it all.
        assert_eq!(driver, OVERHEAD, "{ctx}");
    } else {
        assert_eq!(
            driver, limit,
            "driver sees exactly the limit, 0 bytes over: {ctx}"
        );
    }
    let out = h.release();
    assert!(
        out.stderr.contains("denied"),
        "one denial line expected:\n{out}"
    );
    assert_eq!(
        out.stderr.matches("denied").count(),
        1,
        "only one denial line per process:\n{out}"
    );
}

#[test]
fn runtime_style_client_every_api_stops_at_the_limit() {
    for api in APIS {
        fill_exactly(&[], api);
    }
}

#[test]
fn dlsym_direct_client_every_api_stops_at_the_limit() {
    for api in APIS {
        fill_exactly(&["--dlsym-direct"], api);
    }
}

#[test]
fn per_thread_stream_variants_stop_at_the_limit() {
    for api in ["async", "pool", "mem_alloc"] {
        fill_exactly(&["--ptsz"], api);
    }
}

#[test]
fn vmm_allocations_stop_at_the_limit() {
    fill_exactly(&[], "vmm");
    fill_exactly(&["--dlsym-direct"], "vmm");
}

#[test]
fn vmm_over_the_limit_is_denied_before_the_driver() {
    let w = World::new("vmm-deny");
    for style in [&[][..], &["--dlsym-direct"][..]] {
        let mut args = style.to_vec();
        args.extend(["alloc-api", "vmm", "256MiB"]);
        let o = w.load(
            &[("FGPU_MEMORY_LIMIT", &mib((OVERHEAD >> 20) + 100))],
            &args,
        );
        assert_eq!(o.allocs(), vec![Err(2)], "{o}");
        assert!(o.stderr.contains("cuMemCreate of 256MiB denied"), "{o}");
    }
}

#[test]
fn pool_reservations_stay_charged_until_trimmed() {
    let w = World::new("pool-trim");
    let limit = OVERHEAD + GIB;
    let o = w.load(
        &[("FGPU_MEMORY_LIMIT", &mib(limit >> 20))],
        &[
            "alloc-api",
            "async",
            "512MiB",
            "free",
            "0",
            "alloc",
            "768MiB",
            "trim",
            "alloc",
            "768MiB",
            "info",
        ],
    );
    assert_eq!(
        o.allocs(),
        vec![Ok(512 * MIB), Err(2), Ok(768 * MIB)],
        "freed pool memory stays reserved until trimmed:\n{o}"
    );
    assert_eq!(o.field("info", "free"), limit - OVERHEAD - 768 * MIB, "{o}");
}

#[test]
fn two_processes_share_one_limit() {
    let w = World::new("two");
    let limit = 2 * OVERHEAD + GIB;
    let env = [("FGPU_MEMORY_LIMIT", mib(limit >> 20))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = w.hold(&env, &["alloc", "256MiB", "alloc", "256MiB"]);
    assert_eq!(a.allocs(), vec![Ok(256 * MIB), Ok(256 * MIB)]);
    let mut args = Vec::new();
    for _ in 0..4 {
        args.extend(["alloc", "256MiB"]);
    }
    args.push("info");
    let b = w.hold(&env, &args);
    assert_ok_then_oom(&b.allocs(), 2, &b.before);
    assert_eq!(w.device_used(), limit, "0 bytes over across processes");
    let b = b.release();
    assert!(b.stdout.contains("info free=0 "), "{b}");
    a.release();
}

#[test]
fn sixteen_racing_threads_never_overshoot() {
    let w = World::new("race");
    // 1000 MiB + 32 MiB of room: exactly 16 chunks of 64 MiB, whatever the interleaving.
    let limit = OVERHEAD + 1032 * MIB;
    let o = w.client(
        &[("FGPU_MEMORY_LIMIT", &mib(limit >> 20))],
        "race",
        &["16", "64", "300"],
    );
    assert_eq!(o.code, Some(0), "{o}");
    let race = o.lines("race ")[0];
    assert_eq!(
        field(race, "chunks"),
        16,
        "no overshoot, no spurious refusal:\n{o}"
    );
    assert!(race.contains("fail_codes=[2]"), "{o}");
    let infos = o.lines("info ");
    assert_eq!(
        field(infos[1], "free"),
        limit - OVERHEAD,
        "all charges given back after the churn:\n{o}"
    );
}

#[test]
fn a_killed_process_share_comes_back() {
    let w = World::new("kill");
    let limit = OVERHEAD + GIB;
    let lim = mib(limit >> 20);
    let env = [("FGPU_MEMORY_LIMIT", lim.as_str())];
    let a = w.hold(
        &env,
        &["alloc", "256MiB", "alloc", "256MiB", "alloc", "256MiB"],
    );
    assert_eq!(a.allocs().len(), 3);
    a.kill();
    let mut args = vec!["info"];
    for _ in 0..5 {
        args.extend(["alloc", "256MiB"]);
    }
    let b = w.load(&[("FGPU_MEMORY_LIMIT", &lim), ("FGPU_LOG", "info")], &args);
    assert_eq!(b.field("info", "free"), GIB, "{b}");
    assert_ok_then_oom(&b.allocs(), 4, &b);
    assert!(b.stderr.contains("took back"), "{b}");
}

#[test]
fn nvml_and_cuda_memory_info_report_the_limit() {
    let w = World::new("nvml");
    let limit = 4 * GIB;
    let h = w.hold(
        &[("FGPU_MEMORY_LIMIT", "4GiB")],
        &["alloc", "512MiB", "info", "nvml"],
    );
    let out = Out {
        code: None,
        stdout: h.before.clone(),
        stderr: String::new(),
    };
    let used = OVERHEAD + 512 * MIB;
    assert_eq!(out.field("info", "total"), limit, "{out}");
    assert_eq!(out.field("info", "free"), limit - used, "{out}");
    assert_eq!(out.field("nvml device=0", "total"), limit, "{out}");
    assert_eq!(out.field("nvml device=0", "used"), used, "{out}");
    assert_eq!(out.field("nvml device=0", "free"), limit - used, "{out}");
    // A second process (NVML only, like nvidia-smi) sees the container's usage.
    let o = w.client(&[("FGPU_MEMORY_LIMIT", "4GiB")], "nvml2", &[]);
    assert_eq!(o.field("nvml1", "total"), limit, "{o}");
    assert_eq!(o.field("nvml1", "used"), used, "{o}");
    assert_eq!(o.field("nvml2", "total"), limit, "{o}");
    assert_eq!(o.field("nvml2", "used"), used, "{o}");
    assert_eq!(o.field("nvml2", "free"), limit - used, "{o}");
    h.release();
    // Without the shim the device is the whole simulated device.
    assert_eq!(w.observe().field("nvml device=0", "total"), DEVICE);
}

#[test]
fn a_fork_child_gets_its_own_share_of_the_limit() {
    let w = World::new("fork");
    let limit = OVERHEAD + GIB;
    let o = w.client(
        &[("FGPU_MEMORY_LIMIT", &mib(limit >> 20))],
        "fork-fresh",
        &["256"],
    );
    assert_eq!(o.code, Some(0), "{o}");
    let c0 = o.lines("child0")[0];
    let c1 = o.lines("child1")[0];
    assert_eq!(field(c0, "ctx_rc"), 0, "{o}");
    // Child 0: its overhead + 4 chunks fill the limit; child 1 then has only its overhead.
    assert_eq!(field(c0, "chunks"), 4, "{o}");
    assert_eq!(field(c1, "chunks"), 0, "{o}");
    assert_eq!(
        o.field("parent after nvml1", "used"),
        0,
        "children's shares come back when they exit:\n{o}"
    );
}

#[test]
fn a_fork_child_does_not_take_its_parents_slot() {
    let w = World::new("fork-parent");
    let limit = OVERHEAD + GIB;
    let o = w.client(
        &[
            ("FGPU_MEMORY_LIMIT", &mib(limit >> 20)),
            ("FGPU_LOG", "debug"),
        ],
        "fork",
        &["256", "256"],
    );
    assert_eq!(o.code, Some(0), "{o}");
    let used = OVERHEAD + 256 * MIB;
    assert_eq!(
        o.field("child nvml1", "used"),
        used,
        "the child sees the parent's share:\n{o}"
    );
    // The driver refuses CUDA in a child of an initialised parent; the shim passes that on.
    assert_eq!(o.field("child alloc_rc", "alloc_rc"), 3, "{o}");
    assert_eq!(o.field("parent after info", "free"), limit - used, "{o}");
    assert_eq!(o.field("parent nvml1", "used"), used, "{o}");
    assert_eq!(o.stderr.matches("claimed ledger slot").count(), 2, "{o}");
}

#[test]
fn bad_limit_values_behave_as_documented() {
    let w = World::new("bad");
    let args = ["info", "alloc", "1GiB"];
    // Unreadable: ignored with one error line, no limit.
    for (var, val) in [
        ("FGPU_MEMORY_LIMIT", "banana"),
        ("FGPU_MEMORY_LIMIT", "-1"),
        ("FGPU_MEMORY_LIMIT", "0:1GiB,x:2GiB"),
        ("GPU_MEM_LIMIT_GB", "-1"),
        ("GPU_MEM_LIMIT_GB", "8GiB"),
    ] {
        let o = w.load(&[(var, val)], &args);
        assert_eq!(o.code, Some(0), "{o}");
        assert_eq!(
            o.field("info", "total"),
            DEVICE,
            "{var}={val}: no limit\n{o}"
        );
        assert_eq!(o.allocs(), vec![Ok(GIB)], "{o}");
        let errors: Vec<_> = o.stderr.lines().filter(|l| l.contains(var)).collect();
        assert_eq!(errors.len(), 1, "one message for {var}={val}:\n{o}");
        assert!(
            errors[0].contains(val) && errors[0].contains("ignored"),
            "{o}"
        );
    }
    // 0: a limit of zero bytes: everything is denied, memory info says 0, with a warning.
    let o = w.load(
        &[("FGPU_MEMORY_LIMIT", "0")],
        &["info", "alloc", "1", "alloc-api", "async", "1"],
    );
    assert_eq!(o.field("info", "total"), 0, "{o}");
    assert_eq!(o.field("info", "free"), 0, "{o}");
    assert_eq!(o.allocs(), vec![Err(2), Err(2)], "{o}");
    assert!(
        o.stderr.contains("every GPU allocation will be denied"),
        "{o}"
    );
    // Larger than the device: the device is the limit, with a warning.
    let o = w.load(
        &[("FGPU_MEMORY_LIMIT", "64GiB")],
        &["info", "alloc", "1GiB"],
    );
    assert_eq!(o.field("info", "total"), DEVICE, "{o}");
    assert_eq!(o.allocs(), vec![Ok(GIB)], "{o}");
    assert!(o.stderr.contains("larger than device"), "{o}");
    // The compatibility variable, decimals allowed; the smaller of the two applies.
    let o = w.load(&[("GPU_MEM_LIMIT_GB", "2.5")], &["info"]);
    assert_eq!(o.field("info", "total"), 5 * GIB / 2, "{o}");
    let o = w.load(
        &[("GPU_MEM_LIMIT_GB", "3"), ("FGPU_MEMORY_LIMIT", "2GiB")],
        &["info"],
    );
    assert_eq!(o.field("info", "total"), 2 * GIB, "{o}");
    // Per device: device 0 has its own, device 1 (absent here) another.
    let o = w.load(&[("FGPU_MEMORY_LIMIT", "0:3GiB,1:1GiB")], &["info"]);
    assert_eq!(o.field("info", "total"), 3 * GIB, "{o}");
    let o = w.load(&[("FGPU_MEMORY_LIMIT", "1GiB,1:3GiB")], &["info"]);
    assert_eq!(o.field("info", "total"), GIB, "{o}");
    // A bad FGPU_LOG is reported and does not stop anything.
    let o = w.load(
        &[("FGPU_LOG", "loud"), ("FGPU_MEMORY_LIMIT", "2GiB")],
        &["info"],
    );
    assert_eq!(o.field("info", "total"), 2 * GIB, "{o}");
    assert!(o.stderr.contains("FGPU_LOG=loud"), "{o}");
}

#[test]
fn without_a_limit_everything_passes_through() {
    let w = World::new("nolimit");
    let o = w.load(&[], &["info", "alloc", "15GiB", "alloc", "1GiB", "nvml"]);
    assert_eq!(o.field("info", "total"), DEVICE, "{o}");
    // The driver's own OOM (device full: 300 MiB context + 15 GiB).
    assert_eq!(o.allocs(), vec![Ok(15 * GIB), Err(2)], "{o}");
    assert_eq!(o.stderr, "", "silent without a limit");
    assert!(
        !std::path::Path::new(&w.ledger).exists(),
        "no ledger without a limit"
    );
}

#[test]
fn inert_without_a_driver() {
    let w = World::new("nodriver");
    // No libcuda on the library path.
    let mut c = w.cmd(&w.load, true);
    c.env("LD_LIBRARY_PATH", "/nonexistent")
        .env("FGPU_MEMORY_LIMIT", "1GiB")
        .arg("info");
    let o = run(c, 30);
    assert_eq!(o.code, Some(2), "{o}");
    assert!(o.stdout.contains("error dlopen"), "{o}");
    assert_eq!(o.stderr, "", "{o}");
    let exe = std::env::current_exe().unwrap();
    let mut c = w.cmd(&exe, true);
    c.env("LD_LIBRARY_PATH", "/nonexistent")
        .env("FGPU_MEMORY_LIMIT", "1GiB")
        .env("FGPU_TEST_CLIENT", "probe")
        .args(["--exact", "client_entry", "--nocapture", "-q"]);
    let o = run(c, 30);
    assert!(
        o.stdout
            .contains("probe cuMemAlloc_v2_null=true gpa_null=true cuda_opens=false"),
        "{o}"
    );
    // An ordinary program is untouched.
    let mut c = w.cmd(std::path::Path::new("/bin/sh"), true);
    c.env("FGPU_MEMORY_LIMIT", "1GiB")
        .args(["-c", "echo hello"]);
    let o = run(c, 30);
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (Some(0), "hello\n", "")
    );
}

#[test]
fn rtld_next_is_resolved_from_the_caller() {
    let w = World::new("rtld");
    let o = w.client(&[("FGPU_MEMORY_LIMIT", "1GiB")], "rtld", &[]);
    assert!(
        o.stdout
            .contains("rtld next_is_shim=true next_is_libc=false"),
        "{o}"
    );
    assert!(o.stdout.contains("rtld malloc_found=true"), "{o}");
    assert!(
        o.stdout
            .contains("rtld cuda next_is_wrapper=true handle_is_wrapper=true"),
        "{o}"
    );
}

#[test]
fn context_overhead_is_measured_or_configured() {
    let w = World::new("overhead");
    // Measured (NVML per-process figure), as in every other test.
    let o = w.load(
        &[("FGPU_MEMORY_LIMIT", "2GiB"), ("FGPU_LOG", "info")],
        &["info"],
    );
    assert_eq!(o.field("info", "free"), 2 * GIB - OVERHEAD, "{o}");
    assert!(
        o.stderr
            .contains("overhead on device 0: 300MiB (NVML per-process usage)"),
        "{o}"
    );
    // Configured.
    let o = w.load(
        &[
            ("FGPU_MEMORY_LIMIT", "2GiB"),
            ("FGPU_CONTEXT_OVERHEAD", "1GiB"),
        ],
        &["info", "alloc", "1GiB", "alloc", "512MiB"],
    );
    assert_eq!(o.field("info", "free"), GIB, "{o}");
    assert_eq!(o.allocs(), vec![Ok(GIB), Err(2)], "{o}");
}
