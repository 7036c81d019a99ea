//! libfgpu.so against the simulated HIP runtime (fgpu-sim's `libamdhip64.so`,
//! `librocm_smi64.so` and `libamd_smi.so`): the same memory limits for HIP clients as for CUDA ones. No GPU and
//! no root needed; no AMD GPU is involved anywhere (docs/amd.md).
//!
//! The HIP side does not charge context memory (docs/amd.md), so a limit here is what the
//! allocations may take; the simulated device itself charges 300 MiB per process context,
//! which the observer's figures include.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

const APIS: [&str; 8] = [
    "malloc", "ext", "managed", "pitch", "async", "pool", "vmm", "array",
];

/// A [`World`] whose library directory also has the simulated HIP runtime and ROCm SMI
/// (copies of the simulator: separate files, as on a real system).
struct HipWorld {
    w: World,
    bin: PathBuf,
}

impl HipWorld {
    fn new(name: &str) -> HipWorld {
        let w = World::new(name);
        let sim = target_dir().join("libfgpu_sim.so");
        for n in ["libamdhip64.so", "librocm_smi64.so", "libamd_smi.so"] {
            std::fs::copy(&sim, w.libdir.join(n)).unwrap();
        }
        let bin = target_dir().join("fgpu-sim-hip");
        assert!(
            bin.exists(),
            "{} is missing: cargo build -p fgpu-sim",
            bin.display()
        );
        HipWorld { w, bin }
    }

    fn cmd(&self, env: &[(&str, &str)], args: &[&str], preload: bool) -> Command {
        let mut c = self.w.cmd(&self.bin, preload);
        c.envs(env.iter().copied()).args(args);
        c
    }

    fn run(&self, env: &[(&str, &str)], args: &[&str]) -> Out {
        run(self.cmd(env, args, true), 30)
    }

    fn hold(&self, env: &[(&str, &str)], args: &[&str]) -> Held {
        let mut c = self.cmd(env, args, true);
        c.arg("hold").stdin(std::process::Stdio::piped());
        Held::start(c)
    }

    /// What the simulated SMI reports without the shim: (total, used) of device `d`.
    fn smi_unlimited(&self, d: u32) -> (u64, u64) {
        let o = run(self.cmd(&[], &["smi"], false), 30);
        let p = format!("smi device={d} ");
        (o.field(&p, "total"), o.field(&p, "used"))
    }
}

fn fill_exactly(style: &[&str], api: &str) {
    let hw = HipWorld::new(&format!("hip-fill-{api}"));
    let limit = GIB + 100 * MIB;
    let mut args: Vec<&str> = style.to_vec();
    for _ in 0..5 {
        args.extend(["alloc-api", api, "256MiB"]);
    }
    args.extend(["alloc-api", api, "100MiB", "alloc-api", api, "1"]);
    args.extend([
        "free",
        "0",
        "alloc-api",
        api,
        "256MiB",
        "info",
        "total",
        "smi",
        "amdsmi",
    ]);
    let h = hw.hold(&[("FGPU_MEMORY_LIMIT", "1124MiB")], &args);
    let ctx = format!("api {api} style {style:?}\n{}", h.before);
    let a = h.allocs();
    assert_ok_then_oom(&a, 4, &ctx);
    assert_eq!(a[5], Ok(100 * MIB), "{ctx}");
    assert_eq!(a[6], Err(2), "hipErrorOutOfMemory exactly: {ctx}");
    assert_eq!(a[7], Ok(256 * MIB), "{ctx}");
    assert_eq!(a.len(), 8, "{ctx}");
    let o = Out {
        code: None,
        stdout: h.before.clone(),
        stderr: String::new(),
    };
    assert_eq!(o.field("info ", "total"), limit, "hipMemGetInfo: {ctx}");
    assert_eq!(o.field("info ", "free"), 0, "{ctx}");
    assert_eq!(
        o.field("total ", "bytes"),
        limit,
        "hipDeviceTotalMem: {ctx}"
    );
    assert_eq!(o.field("smi device=0", "total"), limit, "rsmi total: {ctx}");
    assert_eq!(o.field("smi device=0", "used"), limit, "rsmi used: {ctx}");
    assert_eq!(
        o.field("amdsmi device=0", "total"),
        limit,
        "amdsmi total: {ctx}"
    );
    assert_eq!(
        o.field("amdsmi device=0", "used"),
        limit,
        "amdsmi used: {ctx}"
    );
    assert_eq!(
        o.field("amdsmi device=0", "vram_total_mb"),
        limit / MIB,
        "amdsmi_get_gpu_vram_usage: {ctx}"
    );
    assert_eq!(
        o.field("amdsmi device=0", "vram_used_mb"),
        limit / MIB,
        "{ctx}"
    );
    let driver = hw.w.device_used();
    let expect = if api == "managed" {
        OVERHEAD
    } else {
        OVERHEAD + limit
    };
    assert_eq!(driver, expect, "the device holds exactly the limit: {ctx}");
    let out = h.release();
    assert_eq!(
        out.stderr.matches("denied").count(),
        1,
        "one denial line:\n{out}"
    );
    assert!(
        out.stderr
            .contains(&format!("{} of 256MiB denied", api_name(api))),
        "{out}"
    );
}

fn api_name(api: &str) -> &'static str {
    match api {
        "malloc" => "hipMalloc",
        "ext" => "hipExtMallocWithFlags",
        "managed" => "hipMallocManaged",
        "pitch" => "hipMallocPitch",
        "async" => "hipMallocAsync",
        "pool" => "hipMallocFromPoolAsync",
        "vmm" => "hipMemCreate",
        _ => "hipMallocArray",
    }
}

#[test]
fn dlsym_client_every_hip_path_stops_exactly_at_the_limit() {
    for api in APIS {
        fill_exactly(&[], api);
    }
}

#[test]
fn hip_get_proc_address_client_every_hip_path_stops_exactly_at_the_limit() {
    for api in APIS {
        fill_exactly(&["--gpa"], api);
    }
}

#[test]
fn two_hip_processes_share_one_limit_and_a_cuda_process_shares_it_too() {
    let hw = HipWorld::new("hip-share");
    let env = [("FGPU_MEMORY_LIMIT", "1GiB")];
    let a = hw.hold(&env, &["alloc-api", "malloc", "512MiB"]);
    assert_eq!(a.allocs(), vec![Ok(512 * MIB)], "{}", a.before);
    let b = hw.run(
        &env,
        &[
            "alloc-api",
            "malloc",
            "256MiB",
            "alloc-api",
            "malloc",
            "256MiB",
            "alloc-api",
            "malloc",
            "1",
            "info",
        ],
    );
    assert_eq!(
        b.allocs(),
        vec![Ok(256 * MIB), Ok(256 * MIB), Err(2)],
        "{b}"
    );
    assert_eq!(b.field("info ", "free"), 0, "{b}");
    // A CUDA process (same device by UUID, same ledger record): its context overhead and
    // allocations count against the same limit.
    let cuda_env = [
        ("FGPU_MEMORY_LIMIT", "1GiB"),
        ("FGPU_CONTEXT_OVERHEAD", "0"),
    ];
    let c = hw.w.load(&cuda_env, &["alloc", "512MiB", "alloc", "1"]);
    assert_eq!(c.allocs(), vec![Ok(512 * MIB), Err(2)], "{c}");
    drop(a.release());
    let d = hw.run(
        &env,
        &["alloc-api", "malloc", "1GiB", "alloc-api", "malloc", "1"],
    );
    assert_eq!(
        d.allocs(),
        vec![Ok(GIB), Err(2)],
        "the holder's share came back: {d}"
    );
}

#[test]
fn hip_visible_devices_pick_the_device_and_its_limit() {
    let hw = HipWorld::new("hip-visible");
    let two = [("FGPU_SIM_DEVICES", "2")];
    // Create the two-device state first (the first process fixes the device count).
    let o = run(hw.cmd(&two, &["count"], false), 30);
    assert_eq!(o.field("count ", "n"), 2, "{o}");
    for var in ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"] {
        let env = [(var, "1"), ("FGPU_MEMORY_LIMIT", "0:512MiB")];
        let h = hw.hold(
            &env,
            &[
                "count",
                "uuid",
                "alloc-api",
                "malloc",
                "512MiB",
                "alloc-api",
                "malloc",
                "1",
                "smi",
                "amdsmi",
            ],
        );
        let o = Out {
            code: None,
            stdout: h.before.clone(),
            stderr: String::new(),
        };
        assert_eq!(o.field("count ", "n"), 1, "{var}: {o}");
        let uuid = o.lines("uuid ")[0];
        assert!(
            uuid.ends_with("01"),
            "HIP device 0 is physical device 1: {uuid}"
        );
        assert_eq!(h.allocs(), vec![Ok(512 * MIB), Err(2)], "{var}: {o}");
        // SMI devices are physical: device 1 is the limited one (found by its unique id).
        assert_eq!(o.field("smi device=1", "used"), 512 * MIB, "{var}: {o}");
        assert_eq!(o.field("smi device=1", "total"), 512 * MIB, "{var}: {o}");
        assert_eq!(
            o.field("smi device=0", "total"),
            DEVICE,
            "not visible, not limited: {o}"
        );
        // AMD SMI's processor handles: the same physical devices, told apart by the unique
        // id in their UUIDs.
        assert_eq!(o.field("amdsmi device=1", "used"), 512 * MIB, "{var}: {o}");
        assert_eq!(o.field("amdsmi device=1", "total"), 512 * MIB, "{var}: {o}");
        assert_eq!(
            o.field("amdsmi device=1", "vram_total_mb"),
            512,
            "{var}: {o}"
        );
        assert_eq!(o.field("amdsmi device=0", "total"), DEVICE, "{var}: {o}");
        assert_eq!(o.field("amdsmi device=0", "used"), 0, "{var}: {o}");
        let (_, used0) = hw.smi_unlimited(0);
        assert_eq!(used0, 0, "nothing on physical device 0: {var}");
        let (_, used1) = hw.smi_unlimited(1);
        assert_eq!(used1, OVERHEAD + 512 * MIB, "{var}");
        drop(h.release());
    }
}

#[test]
fn fgpu_hip_off_passes_hip_through_and_no_limit_means_untouched() {
    let hw = HipWorld::new("hip-off");
    let off = hw.run(
        &[("FGPU_MEMORY_LIMIT", "256MiB"), ("FGPU_HIP", "off")],
        &["alloc-api", "malloc", "512MiB", "info", "amdsmi"],
    );
    assert_eq!(off.allocs(), vec![Ok(512 * MIB)], "{off}");
    assert_eq!(off.field("info ", "total"), DEVICE, "{off}");
    assert_eq!(off.field("amdsmi device=0", "total"), DEVICE, "{off}");
    let none = hw.run(&[], &["alloc-api", "malloc", "4GiB", "total"]);
    assert_eq!(none.allocs(), vec![Ok(4 * GIB)], "{none}");
    assert_eq!(none.field("total ", "bytes"), DEVICE, "{none}");
    assert!(none.stderr.is_empty(), "silent without a limit: {none}");
}

#[test]
fn fgpu_context_overhead_is_charged_once_per_process_and_device() {
    let hw = HipWorld::new("hip-overhead");
    let env = [
        ("FGPU_MEMORY_LIMIT", "1GiB"),
        ("FGPU_CONTEXT_OVERHEAD", "300MiB"),
    ];
    let o = hw.run(
        &env,
        &[
            "info",
            "alloc-api",
            "malloc",
            "724MiB",
            "alloc-api",
            "malloc",
            "1",
            "info",
        ],
    );
    assert_eq!(o.allocs(), vec![Ok(724 * MIB), Err(2)], "{o}");
    let infos = o.lines("info ");
    assert_eq!(field(infos[0], "free"), GIB - OVERHEAD, "{o}");
    assert_eq!(field(infos[1], "free"), 0, "{o}");
}

#[test]
fn hip_launches_take_time_on_the_shared_device_timeline() {
    let hw = HipWorld::new("hip-launch");
    let o = hw.run(
        &[("FGPU_MEMORY_LIMIT", "1GiB")],
        &[
            "--strict",
            "launch",
            "10",
            "k_sleep_10000us",
            "sync",
            "module-launch",
            "5",
            "k_sleep_10000us",
            "sync",
            "graph",
            "4",
            "k_sleep_5000us",
            "2",
            "ext-launch",
            "k_sleep_20000us",
        ],
    );
    assert_eq!(o.code, Some(0), "{o}");
    let syncs = o.lines("sync ");
    assert!(field(syncs[0], "ms") >= 95, "10 × 10 ms kernels: {o}");
    assert!(field(syncs[1], "ms") >= 45, "5 × 10 ms module kernels: {o}");
    let ms: f64 = o.lines("ext-launch ")[0]
        .split("ms=")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        (19.0..40.0).contains(&ms),
        "hipExtLaunchKernel's events bracket 20 ms: {o}"
    );
}

/// Debian's real `libamdhip64.so.5` (ROCm 5.2; no AMD GPU here, so every call fails with the
/// runtime's own code): with the shim preloaded and a limit set, HIP still initialises, the
/// runtime's error codes pass through unchanged, and the memory entry points a program looks
/// up with dlsym are the shim's wrappers (the others stay the runtime's).
#[test]
fn debians_real_libamdhip64_initialises_under_the_shim_and_is_intercepted() {
    let hip = [
        "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5",
        "/lib/x86_64-linux-gnu/libamdhip64.so.5",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect(
        "Debian's libamdhip64-5 is not installed (apt-get install libamdhip64-5; .ci/run does)",
    );
    let hw = HipWorld::new("hip-debian");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hip_real_debian.py");
    let py = |preload: bool| {
        let mut c = hw.w.cmd(std::path::Path::new("python3"), preload);
        c.env("FGPU_MEMORY_LIMIT", "1GiB").args([script, hip]);
        run(c, 60)
    };
    let (plain, shimmed) = (py(false), py(true));
    for key in ["count", "malloc", "info", "free"] {
        let a = plain.lines(&format!("{key} "));
        let b = shimmed.lines(&format!("{key} "));
        assert_eq!(a.len(), 1, "{plain}");
        assert_eq!(
            a, b,
            "{key}: the runtime's answer passes through unchanged:\n{plain}\n{shimmed}"
        );
    }
    assert_ne!(
        plain.lines("malloc ")[0],
        "malloc 0",
        "no AMD GPU is expected here"
    );
    let w: Vec<&str> = shimmed.lines("where ")[0].split(' ').collect();
    assert_eq!(
        &w[1..3],
        ["libfgpu.so", "libfgpu.so"],
        "hipMalloc, hipMemGetInfo: {shimmed}"
    );
    assert!(
        w[3].starts_with("libamdhip64.so"),
        "hipGetDeviceCount: {shimmed}"
    );
    assert_eq!(shimmed.code, Some(0), "{shimmed}");
}
