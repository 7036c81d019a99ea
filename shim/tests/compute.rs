//! libfgpu.so's launch gate against the simulated driver (fgpu-sim): compute caps measured on
//! the simulator's one device timeline, shared by all processes (a kernel named
//! `sleep_<N>us` occupies it N µs). See docs/compute.md.
//!
//! Figures are printed (`cargo test --test compute -- --nocapture`).

mod common;
#[path = "common/spy.rs"]
mod spy;

use common::*;
use std::sync::RwLock;
use std::time::Instant;

/// The launch-overhead benchmark measures tens of nanoseconds: it runs alone (write lock),
/// the other tests of this binary beside each other (read lock), so that on a 2-core machine
/// their simulated launches do not land in its numbers.
static QUIET: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    QUIET.read().unwrap_or_else(|e| e.into_inner())
}

/// Re-executed as a client by `World::client`; does nothing in a normal test run.
#[test]
fn client_entry() {
    if common::client::main() {
        std::process::exit(0);
    }
}

/// Wall time of a `launch ... sync` run (launch phase + sync phase), in ms.
fn launch_sync_ms(o: &Out) -> f64 {
    let l = o.lines("launch ok");
    let s = o.lines("sync ok");
    assert!(!l.is_empty() && !s.is_empty(), "{o}");
    ms(l[0]) + ms(s[0])
}

/// `elapsed_ms=` of a line (a decimal).
fn ms(line: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("elapsed_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed_ms in '{line}'"))
}

/// The gate's exit report (FGPU_LOG=info), `key=` value.
fn gate_stat(o: &Out, key: &str) -> u64 {
    let line = o
        .stderr
        .lines()
        .find(|l| l.contains("compute gate:"))
        .unwrap_or_else(|| panic!("no gate report:\n{o}"));
    field(line, key)
}

/// (a) 100 × 10 ms kernels back to back under a 30% cap, alone on the device: 1 s of GPU
/// time takes about 3.33 s.
#[test]
fn a_capped_process_gets_its_share_of_an_idle_device() {
    let _quiet = shared();
    let w = World::new("cap30");
    let o = w.load(
        &[("FGPU_COMPUTE_SHARE", "30"), ("FGPU_LOG", "info")],
        &["launch", "100", "sleep_10000us", "sync"],
    );
    assert_eq!(o.code, Some(0), "{o}");
    let wall = launch_sync_ms(&o);
    let share = 100.0 * 1000.0 / wall;
    println!("cap 30%: 100 x 10 ms kernels in {wall:.0} ms: {share:.1}% of the device");
    assert!((27.0..=33.0).contains(&share), "share {share:.1}%\n{o}");
    // The gate measured the work (every batch settled) and slept for the rest.
    let measured = gate_stat(&o, "measured_ms");
    assert!(
        (980..=1010).contains(&measured),
        "measured {measured} ms\n{o}"
    );
    assert!(o.stderr.contains("compute capped at 30%"), "{o}");
}

/// The experiment overrides of the batch sizes (`FGPU_GATE_BATCH_US`,
/// `FGPU_GATE_BATCH_GPU_US`): a CPU-bound launcher under a cap it does not reach (25 µs of
/// host work before each 20 µs kernel, 200 a step and a sync, at 99%) makes at least 3 times
/// fewer batches per launch with 8 ms batches than with 0.5 ms ones (a step is then one batch,
/// closed at its sync, instead of about ten); a bad value gives one line and the defaults.
#[test]
fn batch_size_overrides_change_how_often_the_gate_measures() {
    let _quiet = shared();
    let w = World::new("batchus");
    let run = |env: &[(&str, &str)]| {
        let mut all = vec![("FGPU_COMPUTE_SHARE", "99"), ("FGPU_LOG", "info")];
        all.extend_from_slice(env);
        let o = w.load(&all, &["steps-for", "600", "200", "sleep_20us", "0", "25"]);
        assert_eq!(o.code, Some(0), "{o}");
        o
    };
    let plain = run(&[
        ("FGPU_GATE_BATCH_US", "500"),
        ("FGPU_GATE_BATCH_GPU_US", "500"),
    ]);
    let big = run(&[
        ("FGPU_GATE_BATCH_US", "8000"),
        ("FGPU_GATE_BATCH_GPU_US", "8000"),
    ]);
    let (b1, b2) = (gate_stat(&plain, "batches"), gate_stat(&big, "batches"));
    let (l1, l2) = (gate_stat(&plain, "launches"), gate_stat(&big, "launches"));
    println!(
        "CPU-bound launcher: 0.5 ms batches {b1} for {l1} launches; 8 ms batches {b2} for {l2}"
    );
    assert!(
        big.stderr
            .contains("FGPU_GATE_BATCH_US=8000: batch size override"),
        "{big}"
    );
    // Per launch, so that a slower run (fewer launches) does not pass by itself.
    assert!(
        3 * b2 * l1 <= b1 * l2,
        "batches {b1}/{l1} launches -> {b2}/{l2}\n{big}"
    );
    let bad = run(&[("FGPU_GATE_BATCH_US", "5ms")]);
    let lines: Vec<_> = bad
        .stderr
        .lines()
        .filter(|l| l.contains("FGPU_GATE_BATCH_US"))
        .collect();
    assert_eq!(lines.len(), 1, "{bad}");
    assert!(lines[0].contains("ignored"), "{bad}");
}

/// `FGPU_GATE_PROFILE=1` times the gated path: one exit line with as many launches as the gate
/// saw, the real launch calls' time inside the path's, and one timed event record per record
/// the gate made; without it, no such line.
#[test]
fn the_gate_profile_says_where_the_gated_path_spends_its_time() {
    let _quiet = shared();
    let w = World::new("gateprof");
    let args = ["steps-for", "400", "200", "sleep_20us", "0", "25"];
    let env = [("FGPU_COMPUTE_SHARE", "99"), ("FGPU_LOG", "info")];
    let o = w.load(&[env[0], env[1], ("FGPU_GATE_PROFILE", "1")], &args);
    assert_eq!(o.code, Some(0), "{o}");
    let line = o
        .stderr
        .lines()
        .find(|l| l.contains("compute gate profile:"))
        .unwrap_or_else(|| panic!("no profile line\n{o}"));
    println!("{line}");
    let num = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.split('/').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    assert_eq!(num("launches="), gate_stat(&o, "launches"), "{o}");
    assert!(
        num("launch_ns=") > 0 && num("launch_ns=") < num("path_ns="),
        "{line}"
    );
    assert_eq!(
        num("event_record="),
        gate_stat(&o, "events_recorded"),
        "{line}"
    );
    // The gate's own share of a launch on the simulator is well under 5 µs.
    assert!(num("gate_ns_per_launch=") < 5_000, "{line}");
    let plain = w.load(&env, &args);
    assert!(!plain.stderr.contains("compute gate profile"), "{plain}");
}

/// The per-thread-stream variants (`_ptsz`, through cuGetProcAddress flags) and the exported
/// names (dlsym of the versioned symbols) are gated the same way.
#[test]
fn ptsz_and_dlsym_direct_launches_are_gated() {
    let _quiet = shared();
    let w = World::new("cap50v");
    for style in [&["--ptsz"][..], &["--dlsym-direct"][..]] {
        let mut args = style.to_vec();
        args.extend(["launch", "60", "sleep_10000us", "sync"]);
        let o = w.load(&[("FGPU_COMPUTE_SHARE", "50")], &args);
        assert_eq!(o.code, Some(0), "{o}");
        let wall = launch_sync_ms(&o);
        let share = 100.0 * 600.0 / wall;
        println!("cap 50% {style:?}: 60 x 10 ms in {wall:.0} ms: {share:.1}%");
        assert!(
            (46.0..=54.0).contains(&share),
            "{style:?}: share {share:.1}%\n{o}"
        );
    }
}

/// Launches that never pass through our `dlsym` or `cuGetProcAddress` — made through the
/// pointers of the driver's private launch table, as the real CUDA runtime makes them — are
/// gated too (inline hooks on the driver's entry points); kernels and graphs. With the hooks
/// turned off (`FGPU_LAUNCH_HOOKS=0`) the same launches run ungated, which is what the first
/// half of this test guards against.
#[test]
fn launches_through_the_drivers_export_table_are_gated() {
    let _quiet = shared();
    let w = World::new("cap50t");
    let run = |hooks: &str, args: &[&str]| {
        let mut a = vec!["--export-table"];
        a.extend(args);
        w.load(
            &[
                ("FGPU_COMPUTE_SHARE", "50"),
                ("FGPU_LOG", "info"),
                ("FGPU_LAUNCH_HOOKS", hooks),
            ],
            &a,
        )
    };
    let kernels = ["launch", "60", "sleep_10000us", "sync"];
    let o = run("1", &kernels);
    assert_eq!(o.code, Some(0), "{o}");
    assert!(o.stderr.contains("entry points of libcuda patched"), "{o}");
    let share = 100.0 * 600.0 / launch_sync_ms(&o);
    println!("cap 50% through the export table: kernels {share:.1}%");
    assert!((46.0..=54.0).contains(&share), "share {share:.1}%\n{o}");
    assert_eq!(gate_stat(&o, "launches"), 60, "{o}");

    let o = run("1", &["graph", "10", "sleep_1000us", "40"]);
    assert_eq!(o.code, Some(0), "{o}");
    let share = 100.0 * 400.0 / ms(o.lines("graph ok")[0]);
    println!("cap 50% through the export table: graphs {share:.1}%");
    assert!((46.0..=54.0).contains(&share), "share {share:.1}%\n{o}");

    let o = run("0", &kernels);
    assert_eq!(o.code, Some(0), "{o}");
    let share = 100.0 * 600.0 / launch_sync_ms(&o);
    println!("hooks off: kernels through the export table {share:.1}% (ungated)");
    assert!(share > 90.0, "share {share:.1}%\n{o}");
}

/// (b) A capped process (30%) next to an unlimited one, both saturating: the capped one
/// stays under its cap. (The unlimited one launches in chunks of 5 × 10 ms and synchronises,
/// so that the simulator's FIFO device never holds more than 50 ms of its work.)
#[test]
fn a_capped_process_stays_under_its_cap_next_to_an_unlimited_one() {
    let _quiet = shared();
    let w = World::new("cap-vs-free");
    let mut free_args: Vec<&str> = Vec::new();
    for _ in 0..100 {
        free_args.extend(["launch", "5", "sleep_10000us", "sync"]);
    }
    let mut free = w.cmd(&w.load, true);
    free.args(&free_args);
    let t = Instant::now();
    let free = std::thread::spawn(move || run(free, 60));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let o = w.load(
        &[("FGPU_COMPUTE_SHARE", "30"), ("FGPU_LOG", "info")],
        &["launch", "40", "sleep_10000us", "sync"],
    );
    let capped_wall = launch_sync_ms(&o);
    let f = free.join().unwrap();
    let free_wall = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(o.code, Some(0), "{o}");
    assert_eq!(f.code, Some(0), "{f}");
    let capped = 100.0 * 400.0 / capped_wall;
    println!(
        "cap 30% next to an unlimited tenant: capped got {capped:.1}% of the device \
         (40 x 10 ms in {capped_wall:.0} ms, measured {} ms); unlimited ran 5 s of work in \
         {free_wall:.0} ms",
        gate_stat(&o, "measured_ms")
    );
    assert!(capped <= 33.0, "capped share {capped:.1}%\n{o}");
}

/// (c) CUDA-graph launches are gated: graphs of 10 × 1 ms kernels replayed 60 times (0.6 s of
/// GPU time) under a 30% cap take about 2 s. The capture itself is neither charged nor held.
#[test]
fn graph_launches_are_gated() {
    let _quiet = shared();
    let w = World::new("graph30");
    let o = w.load(
        &[("FGPU_COMPUTE_SHARE", "30"), ("FGPU_LOG", "info")],
        &["graph", "10", "sleep_1000us", "60"],
    );
    assert_eq!(o.code, Some(0), "{o}");
    let wall = ms(o.lines("graph ok")[0]);
    let share = 100.0 * 600.0 / wall;
    println!("cap 30%: 60 graph replays of 10 ms in {wall:.0} ms: {share:.1}%");
    assert!((27.0..=33.0).contains(&share), "share {share:.1}%\n{o}");
    let measured = gate_stat(&o, "measured_ms");
    assert!(
        (570..=610).contains(&measured),
        "measured {measured} ms\n{o}"
    );
    // Without a cap the same run takes 0.6 s: the graph's kernels are really there.
    let o = w.load(&[], &["graph", "10", "sleep_1000us", "60"]);
    let wall = ms(o.lines("graph ok")[0]);
    assert!(
        (595.0..700.0).contains(&wall),
        "uncapped graph run {wall:.0} ms\n{o}"
    );
}

/// Best (lowest) ns per launch of `bench-launch N KERNEL` over `rounds`, without the shim,
/// with it and no cap, and with a 50% cap (a tenth of the launches: the gated path is slower),
/// runs interleaved.
fn bench(w: &World, kernel: &str, n: u32, rounds: usize) -> [f64; 3] {
    best_ns_per_launch(rounds, |l| {
        let mut c = w.cmd(&w.load, l != Launcher::Bare);
        let n = if l == Launcher::Gated { n / 10 } else { n };
        c.args(["bench-launch", &n.to_string(), kernel]);
        if l == Launcher::Gated {
            c.env("FGPU_COMPUTE_SHARE", "50");
        }
        c
    })
}

/// (d) Without a limit the launch entry points are still ours (so that a share set later
/// reaches the process), but cost one atomic load: a launch loop runs as fast as without the
/// shim, and the gate creates no event.
#[test]
fn an_unlimited_process_pays_no_gate() {
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let w = World::new("nogate");
    // `sleep_0us` kernels take no device time: the loop measures the host path only.
    assert_ungated_is_free("bench-launch sleep_0us", || {
        bench(&w, "sleep_0us", 200_000, 7)
    });
    assert_ungated_is_free("bench-launch empty (2 us)", || {
        bench(&w, "empty", 100_000, 3)
    });
    // No events: the spy driver counts every cuEventCreate/cuEventRecord the shim makes.
    spy::install(&w);
    let o = w.load(&[], &["launch", "2000", "sleep_10us", "sync"]);
    assert_eq!(o.code, Some(0), "{o}");
    assert_eq!(spy::counts(&o.stderr), (0, 0, 0, 0), "{o}");
    assert!(!o.stderr.contains("compute gate"), "{o}");
    // A share of 100% is no cap either.
    let o = w.load(
        &[("FGPU_COMPUTE_SHARE", "100"), ("FGPU_LOG", "info")],
        &["launch", "2000", "sleep_10us", "sync"],
    );
    assert_eq!(spy::counts(&o.stderr), (0, 0, 0, 0), "{o}");
    assert!(o.stderr.contains("no compute cap"), "{o}");
}

/// (e) No event is ever recorded into a capturing stream: graph capture + instantiate +
/// replays under a cap, with the spy driver refusing (and counting) any record into a
/// capturing stream. Kernel launches before and after the capture are measured (events are
/// recorded), and timing events are used.
#[test]
fn no_event_is_recorded_into_a_capturing_stream() {
    let _quiet = shared();
    let w = World::new("capture");
    spy::install(&w);
    let o = w.load(
        &[("FGPU_COMPUTE_SHARE", "30"), ("FGPU_LOG", "info")],
        &[
            // First, with a budget that is not in debt: the captured launches pass admission
            // and reach the batch logic (with a debt they would be let through by the
            // admission's own capture check).
            "graph",
            "50",
            "sleep_100us",
            "10",
            "launch",
            "20",
            "sleep_1000us",
            "launch",
            "20",
            "sleep_1000us",
            "graph",
            "5",
            "sleep_1000us",
            "3",
            "sync",
        ],
    );
    assert_eq!(o.code, Some(0), "{o}");
    assert_eq!(
        o.lines("graph ok").len(),
        2,
        "capture + instantiate succeed\n{o}"
    );
    let (created, timing, recorded, into_capture) = spy::counts(&o.stderr);
    println!(
        "capture under a cap: events created {created} (timing {timing}), recorded {recorded}, \
         into a capturing stream {into_capture}; gate skipped {} capture checks",
        gate_stat(&o, "capture_skips")
    );
    assert_eq!(into_capture, 0, "{o}");
    assert!(recorded > 0 && created > 0 && timing == created, "{o}");
    assert!(gate_stat(&o, "capture_skips") > 0, "{o}");
    // The gate measured only what ran: at most 40 × 1 ms + 10 × 5 ms + 3 × 5 ms (the last
    // few batches are still unsettled when the process exits).
    let measured = gate_stat(&o, "measured_ms");
    assert!(
        (80..=110).contains(&measured),
        "measured {measured} ms\n{o}"
    );
}

/// Bad FGPU_COMPUTE_SHARE values: one error line each, no cap (like FGPU_MEMORY_LIMIT).
#[test]
fn bad_share_values_are_ignored_with_one_line() {
    let _quiet = shared();
    let w = World::new("badshare");
    for val in ["banana", "0", "101", "-5", "30GiB"] {
        let o = w.load(
            &[("FGPU_COMPUTE_SHARE", val)],
            &["launch", "20", "sleep_10000us", "sync"],
        );
        assert_eq!(o.code, Some(0), "{o}");
        let lines: Vec<_> = o
            .stderr
            .lines()
            .filter(|l| l.contains("FGPU_COMPUTE_SHARE"))
            .collect();
        assert_eq!(lines.len(), 1, "one line for {val}:\n{o}");
        assert!(
            lines[0].contains(val) && lines[0].contains("ignored"),
            "{o}"
        );
        let wall = launch_sync_ms(&o);
        assert!(
            wall < 280.0,
            "{val}: not capped, 200 ms of work in {wall:.0} ms\n{o}"
        );
    }
}

/// The ledger of a world, mapped read-write (the test plays the agent).
fn map_ledger(path: &str) -> &'static fgpu_common::ledger::Ledger {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    // SAFETY: mapping LEDGER_SIZE bytes of a ledger file the shim created at that size,
    // shared; the mapping is never unmapped (leaked for the test's life).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            fgpu_common::ledger::LEDGER_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: a live shared mapping of a whole ledger (all atomics, validated by the shim).
    unsafe { &*(p as *const fgpu_common::ledger::Ledger) }
}

/// The agent-driven mode's consuming side: with `compute_cap` set in the ledger the shim
/// waits while the container's turn (in the limits page) is closed, stamps its slot while it
/// waits and reports measured GPU time. This test plays a controller that keeps a 30% bucket
/// of measured GPU time (refilled at 30% of wall time, at most 30 ms): the turn is open while
/// the bucket is positive, with a 1 ms queue bound, and the heartbeat moves every tick. When
/// the heartbeat stops, the shim falls back to a local cap at the ledger's rate after 1 s.
#[test]
fn a_ledger_cap_is_enforced_through_the_agents_turns() {
    let _quiet = shared();
    use fgpu_common::ledger::compute::{TURN_CLOSED, TURN_OPEN};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    let w = World::new("ledger30");
    let env = [("FGPU_MEMORY_LIMIT", "8GiB"), ("FGPU_LOG", "info")];
    // A first process creates the ledger and binds the device record.
    let o = w.load(&env, &["info"]);
    assert_eq!(o.code, Some(0), "{o}");
    let l = map_ledger(&w.ledger);
    let bound: Vec<usize> = (0..fgpu_common::ledger::MAX_DEVICES)
        .filter(|&i| l.usage.devices[i].key.load(Relaxed) != 0)
        .collect();
    assert!(!bound.is_empty(), "no device record bound\n{o}");
    for &i in &bound {
        l.limits.devices[i].compute_cap.store(30, Relaxed);
        l.turn(i).queue_ns.store(1_000_000, Relaxed);
    }
    l.limits.generation.fetch_add(1, Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let waits_seen = Arc::new(AtomicU64::new(0));
    let agent = {
        let stop = Arc::clone(&stop);
        let waits_seen = Arc::clone(&waits_seen);
        let bound = bound.clone();
        std::thread::spawn(move || {
            const PERIOD_NS: i64 = 500_000;
            let burst = 100_000_000 * 30 / 100;
            let mut tokens = 0i64;
            let mut last_gpu = [0u64; fgpu_common::ledger::MAX_DEVICES];
            let mut last = std::time::Instant::now();
            while !stop.load(Relaxed) {
                let dt = last.elapsed().as_nanos() as i64;
                last = std::time::Instant::now();
                for &i in &bound {
                    let beat = l.turn(i).heartbeat.fetch_add(1, Relaxed) + 1;
                    let gpu = l.usage.compute[i].gpu_ns.load(Relaxed);
                    tokens = (tokens + dt * 30 / 100).min(burst)
                        - gpu.saturating_sub(last_gpu[i]) as i64;
                    last_gpu[i] = gpu;
                    if l.activity(i, beat, 40).waiting > 0 {
                        waits_seen.fetch_add(1, Relaxed);
                    }
                    l.turn(i)
                        .set(if tokens > 0 { TURN_OPEN } else { TURN_CLOSED });
                }
                std::thread::sleep(std::time::Duration::from_nanos(PERIOD_NS as u64));
            }
        })
    };
    let o = w.load(&env, &["launch", "60", "sleep_10000us", "sync"]);
    stop.store(true, Relaxed);
    agent.join().unwrap();
    assert_eq!(o.code, Some(0), "{o}");
    let wall = launch_sync_ms(&o);
    let share = 100.0 * 600.0 / wall;
    println!(
        "ledger cap 30% (turns from a fake controller): 60 x 10 ms in {wall:.0} ms: {share:.1}%"
    );
    assert!((27.0..=33.0).contains(&share), "share {share:.1}%\n{o}");
    assert!(
        waits_seen.load(Relaxed) > 100,
        "the waiting process must stamp its slot while its turn is closed ({} ticks saw it)",
        waits_seen.load(Relaxed)
    );
    // The waiter is gone: its stamp is cleared (nobody waits) at exit.
    assert_eq!(l.activity(bound[0], u64::MAX / 2, u64::MAX).waiting, 0);
    // The controller stops (no heartbeat, the turn closed): the shim notices within a second
    // and caps locally.
    l.turn(bound[0]).set(TURN_CLOSED);
    let o = w.load(&env, &["launch", "60", "sleep_10000us", "sync"]);
    assert_eq!(o.code, Some(0), "{o}");
    let wall = launch_sync_ms(&o);
    let share = 100.0 * 600.0 / wall;
    println!("ledger cap 30%, controller gone: 60 x 10 ms in {wall:.0} ms: {share:.1}%");
    assert!(
        o.stderr.contains("compute controller has been silent"),
        "{o}"
    );
    assert!(share <= 33.0, "share {share:.1}%\n{o}");
}
