//! The simulator with several GPUs: distinct UUIDs, memory and NVML records per physical
//! device, and CUDA ordinals that follow `CUDA_VISIBLE_DEVICES` (indices, `GPU-` UUIDs,
//! reordering, MIG UUIDs refused with a message), through fgpu-sim-load.

mod common;
use common::*;
use std::process::Stdio;

const OVERHEAD: u64 = 300 * MIB;
/// Every allocation path that charges device memory (64 MiB charges 64 MiB on each).
const PATHS: [&str; 6] = ["mem_alloc", "pitch", "async", "pool", "vmm", "array"];

fn uuid(d: usize) -> String {
    format!("GPU-5e1a0000-0000-0000-0000-{d:012x}")
}

/// Runs the loader on a node of `gpus` devices with `CUDA_VISIBLE_DEVICES=visible` (None:
/// unset); returns (exit success, stdout lines, stderr).
fn run(
    env: &SimEnv,
    gpus: u32,
    visible: Option<&str>,
    args: &[&str],
) -> (bool, Vec<String>, String) {
    let mut c = env.command(args);
    c.env("FGPU_SIM_DEVICES", gpus.to_string())
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(v) = visible {
        c.env("CUDA_VISIBLE_DEVICES", v);
    }
    let out = c.output().expect("run loader");
    let text = String::from_utf8_lossy(&out.stdout);
    (
        out.status.success(),
        text.lines().map(str::to_string).collect(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(env: &SimEnv, gpus: u32, visible: Option<&str>, args: &[&str]) -> Vec<String> {
    let (success, lines, err) = run(env, gpus, visible, args);
    assert!(success, "{visible:?} {args:?}: {lines:?} {err}");
    lines
}

/// NVML's `used` of physical device `d`, and this process's share of it.
fn nvml_used(lines: &[String], d: usize) -> (u64, u64) {
    let dev = line(lines, &format!("nvml device={d} "));
    assert!(dev.contains(&format!("uuid={}", uuid(d))), "{dev}");
    let pid = field(&lines[0], "pid").expect("pid");
    let own = lines
        .iter()
        .filter(|l| l.starts_with(&format!("nvml process device={d} ")))
        .find(|l| field(l, "pid") == Some(pid))
        .map_or(0, |l| field(l, "used").expect("used"));
    (field(dev, "used").expect("used"), own)
}

#[test]
fn nvml_lists_every_physical_gpu_with_its_own_uuid_and_memory() {
    for gpus in [2u32, 4] {
        let env = SimEnv::with_memory(&format!("mg-list{gpus}"), "4GiB");
        let out = ok(&env, gpus, None, &["devices", "nvml"]);
        assert_eq!(
            field(line(&out, "devices "), "count"),
            Some(u64::from(gpus))
        );
        for d in 0..gpus as usize {
            assert_eq!(
                line(&out, &format!("ordinal {d} ")),
                format!("ordinal {d} uuid={}", uuid(d))
            );
            let dev = line(&out, &format!("nvml device={d} "));
            assert_eq!(field(dev, "total"), Some(4 * GIB));
            // Only the context on ordinal 0 (physical 0) is charged.
            let want = if d == 0 { OVERHEAD } else { 0 };
            assert_eq!(field(dev, "used"), Some(want), "{out:?}");
        }
    }
}

#[test]
fn every_allocation_path_charges_the_physical_gpu_its_ordinal_names() {
    // (gpus, CUDA_VISIBLE_DEVICES, ordinal used, physical device it names, physical device
    // of ordinal 0, where the loader's first context is)
    let cases: [(u32, Option<String>, u32, usize, usize); 6] = [
        (2, None, 1, 1, 0),
        (2, Some("1".into()), 0, 1, 1),
        (2, Some(uuid(1)), 0, 1, 1),
        (2, Some("1,0".into()), 0, 1, 1),
        (4, Some("3,1".into()), 1, 1, 3),
        (4, Some(format!("2,{}", uuid(3))), 1, 3, 2),
    ];
    for (i, (gpus, visible, ord, phys, first)) in cases.iter().enumerate() {
        let env = SimEnv::with_memory(&format!("mg-paths{i}"), "8GiB");
        let ord_s = ord.to_string();
        let mut args = vec!["device", ord_s.as_str()];
        for p in PATHS {
            args.extend(["alloc-api", p, "64MiB"]);
        }
        args.extend(["info", "nvml"]);
        let out = ok(&env, *gpus, visible.as_deref(), &args);
        let dev = line(&out, "device ok");
        assert!(
            dev.contains(&format!("uuid={}", uuid(*phys))),
            "{visible:?}: {dev}"
        );
        assert_eq!(
            out.iter().filter(|l| l.starts_with("alloc ok")).count(),
            PATHS.len()
        );
        let charged = PATHS.len() as u64 * 64 * MIB;
        // cuMemGetInfo on the current context reports the physical device's memory.
        assert_eq!(
            info_free(&out),
            8 * GIB - OVERHEAD - charged,
            "{visible:?}: {out:?}"
        );
        for d in 0..*gpus as usize {
            let (used, own) = nvml_used(&out, d);
            let mut want = 0;
            if d == *first {
                want += OVERHEAD;
            }
            if d == *phys {
                want += charged + if first == phys { 0 } else { OVERHEAD };
            }
            assert_eq!((used, own), (want, want), "{visible:?} device {d}: {out:?}");
        }
    }
}

#[test]
fn reordered_ordinals_keep_each_gpus_figures_apart() {
    let env = SimEnv::with_memory("mg-reorder", "4GiB");
    let out = ok(
        &env,
        2,
        Some("1,0"),
        &[
            "device", "0", "alloc", "1GiB", "info", "device", "1", "alloc", "256MiB", "info",
            "nvml",
        ],
    );
    let infos: Vec<u64> = out
        .iter()
        .filter(|l| l.starts_with("info "))
        .map(|l| field(l, "free").expect("free"))
        .collect();
    assert_eq!(
        infos,
        vec![4 * GIB - OVERHEAD - GIB, 4 * GIB - OVERHEAD - 256 * MIB]
    );
    assert_eq!(nvml_used(&out, 1).0, OVERHEAD + GIB);
    assert_eq!(nvml_used(&out, 0).0, OVERHEAD + 256 * MIB);
}

#[test]
fn a_full_gpu_does_not_stop_allocations_on_another() {
    let env = SimEnv::with_memory("mg-oom", "2GiB");
    let out = run(
        &env,
        2,
        None,
        &[
            "alloc", "1GiB", "alloc", "1GiB", "device", "1", "alloc", "1GiB", "info",
        ],
    )
    .1;
    let allocs: Vec<&String> = out.iter().filter(|l| l.starts_with("alloc")).collect();
    assert!(allocs[0].starts_with("alloc ok"));
    assert_eq!(
        field(allocs[1], "rc"),
        Some(2),
        "CUDA_ERROR_OUT_OF_MEMORY: {out:?}"
    );
    assert!(allocs[2].starts_with("alloc ok"), "{out:?}");
    assert_eq!(info_free(&out), GIB - OVERHEAD);
}

#[test]
fn visible_devices_that_name_nothing_leave_no_device() {
    let env = SimEnv::new("mg-none");
    for (v, msg) in [
        (
            "MIG-4f1b2c3d-0000-0000-0000-000000000000",
            "MIG is not supported",
        ),
        ("", ""),
        ("7", "'7' is not a device index (0-1)"),
        ("GPU-5e1a", "matches 2 device UUIDs"),
    ] {
        let (success, out, err) = run(&env, 2, Some(v), &["devices"]);
        assert!(!success, "{v}: {out:?}");
        // CUDA_ERROR_NO_DEVICE from cuInit.
        assert_eq!(line(&out, "init "), "init rc=100 driver=0", "{v}");
        assert!(err.contains(msg), "{v}: {err}");
    }
    // Enumeration stops at the first bad entry; the ones before it stay visible.
    let (success, out, err) = run(&env, 2, Some("1,MIG-abc,0"), &["devices"]);
    assert!(success, "{out:?}");
    assert_eq!(field(line(&out, "devices "), "count"), Some(1));
    assert_eq!(
        line(&out, "ordinal 0 "),
        format!("ordinal 0 uuid={}", uuid(1))
    );
    assert!(err.contains("'MIG-abc' is a MIG device UUID"), "{err}");
    let (_, out, _) = run(&env, 2, Some("1"), &["device", "1"]);
    // CUDA_ERROR_INVALID_DEVICE: ordinal 1 does not exist under CUDA_VISIBLE_DEVICES=1.
    assert_eq!(line(&out, "device "), "device fail ordinal=1 rc=101");
}
