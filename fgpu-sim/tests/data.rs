//! Device data through fgpu-sim-load: patterns written and read back byte for byte, data
//! that follows a VMM physical handle to another address, an access to a reserved range with
//! nothing mapped (a parked allocation) failing with a sticky CUDA_ERROR_ILLEGAL_ADDRESS,
//! device-to-device copies and memsets.

mod common;
use common::*;

fn has(lines: &[String], want: &str) -> bool {
    lines.iter().any(|l| l == want)
}

#[test]
fn filled_linear_allocations_read_back_byte_for_byte() {
    let env = SimEnv::new("data-linear");
    // An odd size (a tail shorter than a pattern word) and one over 64 MiB (two copies).
    let out = env.run(&[
        "--error-names",
        "alloc",
        "5000003",
        "alloc",
        "70MiB",
        "alloc-api",
        "pitch",
        "1MiB",
        "fill",
        "0",
        "11",
        "fill",
        "1",
        "12",
        "fill",
        "2",
        "13",
        "check",
        "0",
        "11",
        "check",
        "1",
        "12",
        "check",
        "2",
        "13",
        "check",
        "1",
        "11",
    ]);
    assert!(has(&out, "fill 0 ok bytes=5000003"), "{out:?}");
    assert!(
        has(&out, &format!("fill 1 ok bytes={}", 70 * MIB)),
        "{out:?}"
    );
    for idx in 0..3 {
        assert!(has(&out, &format!("check {idx} ok")), "{out:?}");
    }
    // Another seed's pattern is not there.
    assert!(has(&out, "check 1 mismatch at 0"), "{out:?}");
}

#[test]
fn unwritten_memory_reads_as_zero_and_memset_sets_every_byte() {
    let env = SimEnv::new("data-memset");
    let out = env.run(&[
        "--error-names",
        "alloc",
        "3MiB",
        "check-byte",
        "0",
        "0",
        "fill",
        "0",
        "2",
        "memset",
        "0",
        "171",
        "check-byte",
        "0",
        "171",
        "check",
        "0",
        "2",
        "memset",
        "0",
        "0",
        "check-byte",
        "0",
        "0",
    ]);
    assert_eq!(
        out.iter().filter(|l| *l == "check-byte 0 ok").count(),
        3,
        "{out:?}"
    );
    assert!(has(&out, "memset 0 ok"), "{out:?}");
    assert!(has(&out, "check 0 mismatch at 0"), "{out:?}");
}

#[test]
fn device_to_device_copies_move_the_bytes() {
    let env = SimEnv::new("data-dtod");
    // linear → linear, linear → vmm, vmm → linear.
    let out = env.run(&[
        "--error-names",
        "alloc",
        "4MiB",
        "alloc",
        "4MiB",
        "alloc-api",
        "vmm",
        "4MiB",
        "alloc",
        "4MiB",
        "fill",
        "0",
        "5",
        "copy",
        "1",
        "0",
        "check",
        "1",
        "5",
        "copy",
        "2",
        "1",
        "check",
        "2",
        "5",
        "copy",
        "3",
        "2",
        "check",
        "3",
        "5",
        "check",
        "0",
        "5",
    ]);
    for (dst, src) in [(1, 0), (2, 1), (3, 2)] {
        assert!(
            has(&out, &format!("copy {dst} {src} ok bytes={}", 4 * MIB)),
            "{out:?}"
        );
    }
    for idx in 0..4 {
        assert!(has(&out, &format!("check {idx} ok")), "{out:?}");
    }
}

#[test]
fn vmm_data_follows_the_physical_handle_to_another_address() {
    let env = SimEnv::new("data-vmm");
    let out = env.run(&[
        "--error-names",
        "alloc-api",
        "vmm",
        "8MiB",
        "fill",
        "0",
        "7",
        "unmap",
        "0",
        "remap",
        "0",
        "check",
        "0",
        "7",
        // Unmapped and mapped again at the same address (a park and an unpark).
        "unmap",
        "0",
        "map",
        "0",
        "check",
        "0",
        "7",
        "info",
    ]);
    let first = field(line(&out, "alloc ok"), "ptr").expect("ptr");
    let second = field(line(&out, "remap 0 ok"), "ptr").expect("ptr");
    assert_ne!(first, second, "a fresh reservation");
    assert_eq!(field(line(&out, "map 0 ok"), "ptr"), Some(second));
    assert_eq!(
        out.iter().filter(|l| *l == "check 0 ok").count(),
        2,
        "{out:?}"
    );
    // The physical memory stayed charged throughout: 8 MiB and the context.
    assert_eq!(info_free(&out), 16 * GIB - 8 * MIB - 300 * MIB);
}

#[test]
fn touching_a_reserved_range_with_nothing_mapped_is_a_sticky_illegal_address() {
    let env = SimEnv::new("data-parked");
    let out = env.run(&[
        "--error-names",
        "alloc",
        "1MiB",
        "alloc-api",
        "vmm",
        "4MiB",
        "fill",
        "1",
        "3",
        "unmap",
        "1",
        "check",
        "1",
        "3",
        "info",
        "check",
        "0",
        "0",
        "alloc",
        "1MiB",
    ]);
    assert!(has(&out, "unmap 1 ok"), "{out:?}");
    assert!(faulted(&out, "check 1"), "{out:?}");
    // Every later call on the context fails the same way, even on good memory.
    assert!(faulted(&out, "info"), "{out:?}");
    assert!(faulted(&out, "check 0"), "{out:?}");
    assert!(
        line(&out, "alloc fail").starts_with("alloc fail rc=700"),
        "{out:?}"
    );
    // Another process is not affected.
    let other = env.run(&["alloc", "1MiB", "fill", "0", "1", "check", "0", "1"]);
    assert!(has(&other, "check 0 ok"), "{other:?}");
}

/// Runs the loader on a simulator of two GPUs; `args` split at whitespace.
fn run_two(env: &SimEnv, args: &str) -> Vec<String> {
    let args: Vec<&str> = args.split_whitespace().collect();
    let out = env
        .command(&args)
        .env("FGPU_SIM_DEVICES", "2")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run loader");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "loader {args:?} failed: {text}");
    text.lines().map(str::to_string).collect()
}

/// Whether `what` (e.g. `check 0`) failed with a sticky illegal address.
fn faulted(lines: &[String], what: &str) -> bool {
    has(
        lines,
        &format!("{what} fail rc=700 error=CUDA_ERROR_ILLEGAL_ADDRESS"),
    )
}

#[test]
fn vmm_memory_is_reachable_only_from_the_devices_given_access() {
    let env = SimEnv::new("data-access");
    // Linear memory of device 0 read in device 1's context: the driver stages it.
    let out = run_two(&env, "--error-names alloc 1MiB fill 0 5 device 1 check 0 5");
    assert!(has(&out, "check 0 ok"), "{out:?}");
    // VMM memory given access for device 0 only (as `alloc-api vmm` does): device 1's
    // context faults on it, and stays broken.
    let out = run_two(
        &env,
        "--error-names alloc-api vmm 4MiB fill 0 6 device 1 check 0 6 info",
    );
    assert!(has(&out, "fill 0 ok bytes=4194304"), "{out:?}");
    assert!(faulted(&out, "check 0"), "{out:?}");
    assert!(faulted(&out, "info"), "{out:?}");
    // Given read access for device 1 as well, device 1 reads it; given read and write, it
    // writes; access taken away from device 0 faults there.
    let out = run_two(
        &env,
        "--error-names alloc-api vmm 4MiB fill 0 7 access 0 1 1 device 1 check 0 7 \
         access 0 1 3 fill 0 8 device 0 check 0 8 access 0 0 0 check 0 8",
    );
    assert!(has(&out, "access 0 ok ordinal=1 flags=1"), "{out:?}");
    assert!(has(&out, "fill 0 ok bytes=4194304"), "{out:?}");
    let ok = out.iter().filter(|l| *l == "check 0 ok").count();
    assert_eq!(ok, 2, "{out:?}");
    assert!(faulted(&out, "check 0"), "{out:?}");
    // A device that is not there.
    let out = run_two(&env, "--error-names alloc-api vmm 2MiB access 0 5 3");
    assert!(
        has(&out, "access 0 fail rc=101 error=CUDA_ERROR_INVALID_DEVICE"),
        "{out:?}"
    );
}

#[test]
fn a_write_without_write_access_faults() {
    let env = SimEnv::new("data-readonly");
    let out = run_two(
        &env,
        "--error-names alloc-api vmm 2MiB access 0 1 1 device 1 fill 0 9",
    );
    assert!(faulted(&out, "fill 0"), "{out:?}");
}

#[test]
fn batched_copies_and_stream_values_touch_device_memory_like_copies() {
    let env = SimEnv::new("data-batch");
    // Both batch forms read what `fill` wrote (70 MiB: two batches of four copies); a written
    // value is the pattern's first word, so the pattern still checks; the wait reads it.
    let out = env.run(&[
        "--error-names",
        "alloc",
        "70MiB",
        "alloc-api",
        "vmm",
        "4MiB",
        "fill",
        "0",
        "5",
        "fill",
        "1",
        "6",
        "batch-check",
        "0",
        "5",
        "batch12-check",
        "0",
        "5",
        "batch-check",
        "1",
        "6",
        "write-value",
        "1",
        "6",
        "wait-value",
        "1",
        "6",
        "check",
        "1",
        "6",
        "batch-check",
        "0",
        "6",
        "unmap",
        "1",
        "wait-value",
        "1",
        "6",
        "check",
        "0",
        "5",
    ]);
    for want in [
        "batch-check 0 ok",
        "batch12-check 0 ok",
        "batch-check 1 ok",
        "write-value 1 ok",
        "wait-value 1 ok",
        "check 1 ok",
        // Another seed's pattern is not what the batch reads.
        "batch-check 0 mismatch at 0",
        // A wait on memory with nothing mapped (a parked allocation) faults, and the fault
        // is sticky.
        "wait-value 1 fail rc=700 error=CUDA_ERROR_ILLEGAL_ADDRESS",
        "check 0 fail rc=700 error=CUDA_ERROR_ILLEGAL_ADDRESS",
    ] {
        assert!(has(&out, want), "{want}: {out:?}");
    }
}

#[test]
fn a_batch_of_memory_operations_writes_and_waits_like_the_single_calls() {
    let env = SimEnv::new("data-memops");
    let args = "--error-names alloc-api vmm 2MiB memset 0 0 mem-ops 0 6 check 0 6 unmap 0 \
                mem-ops 0 6 info";
    let out = env.run(&args.split_whitespace().collect::<Vec<_>>());
    assert!(has(&out, "mem-ops 0 ok"), "{out:?}");
    // The write put the pattern's first word there and nothing else: the pattern differs
    // from the fourth byte on, where the memset's zeros are.
    let at: u64 = line(&out, "check 0")
        .strip_prefix("check 0 mismatch at ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out:?}"));
    assert!(at >= 4, "{out:?}");
    // On memory with nothing mapped (a parked allocation) the batch faults, stickily.
    assert!(faulted(&out, "mem-ops 0"), "{out:?}");
    assert!(faulted(&out, "info"), "{out:?}");
}

#[test]
fn a_fault_breaks_the_context_for_every_later_call() {
    let env = SimEnv::new("data-fault");
    let out = env.run(&[
        "--error-names",
        "alloc",
        "1MiB",
        "fill",
        "0",
        "1",
        "fault",
        "check",
        "0",
        "1",
        "alloc",
        "1MiB",
    ]);
    assert!(has(&out, "fault ok"), "{out:?}");
    assert!(
        has(&out, "check 0 fail rc=700 error=CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{out:?}"
    );
    assert!(
        line(&out, "alloc fail").starts_with("alloc fail rc=700"),
        "{out:?}"
    );
}

#[test]
fn strict_mode_fails_on_a_mismatch() {
    let env = SimEnv::new("data-strict");
    let out = env
        .command(&[
            "--strict", "alloc", "1MiB", "fill", "0", "1", "check", "0", "2",
        ])
        .output()
        .expect("run loader");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("check 0 mismatch at 0"), "{text}");
    assert_eq!(out.status.code(), Some(1));
}
