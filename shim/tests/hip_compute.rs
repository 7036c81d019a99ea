//! libfgpu.so's launch gate for HIP against the simulated HIP runtime (fgpu-sim's
//! `libamdhip64.so`): the same compute caps as CUDA's (shim/tests/compute.rs), measured on
//! the simulator's one device timeline (a kernel named `sleep_<N>us` occupies it N µs). No
//! AMD GPU is involved (docs/amd.md, docs/compute.md "HIP").
//!
//! Figures are printed (`cargo test --test hip_compute -- --nocapture`).

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::sync::RwLock;

/// The launch-overhead benchmark runs alone (write lock), the other tests beside each other.
static QUIET: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    QUIET.read().unwrap_or_else(|e| e.into_inner())
}

/// A [`World`] whose library directory also has the simulated HIP runtime (a copy of the
/// simulator, as on a real system).
struct HipWorld {
    w: World,
    bin: PathBuf,
}

impl HipWorld {
    fn new(name: &str) -> HipWorld {
        let w = World::new(name);
        let sim = target_dir().join("libfgpu_sim.so");
        for n in ["libamdhip64.so", "librocm_smi64.so"] {
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
        let o = run(self.cmd(env, args, true), 60);
        assert_eq!(o.code, Some(0), "{o}");
        o
    }
}

/// `elapsed_ms=` of a line (a decimal).
fn ms(line: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("elapsed_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed_ms in '{line}'"))
}

/// Wall time of a `launch ... sync` run (the launch phase + the sync phase), in ms.
fn launch_sync_ms(o: &Out, launch: &str) -> f64 {
    let l = o.lines(launch);
    let s = o.lines("sync rc=0");
    assert!(!l.is_empty() && !s.is_empty(), "{o}");
    ms(l[0]) + ms(s[0])
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

/// The simulated runtime's event counters (`event-stats`): (created, recorded, into a
/// capturing stream), whoever in the process made the calls.
fn event_stats(o: &Out) -> (u64, u64, u64) {
    let l = o.lines("event-stats rc=0");
    assert_eq!(l.len(), 1, "{o}");
    (
        field(l[0], "created"),
        field(l[0], "recorded"),
        field(l[0], "into_capture"),
    )
}

/// 100 × 10 ms `hipLaunchKernel`s under `FGPU_COMPUTE_SHARE=30`, alone on the device: 1 s of
/// GPU time takes about 3.33 s, and the gate measured all of it.
#[test]
fn a_capped_hip_process_gets_its_share_of_an_idle_device() {
    let _quiet = shared();
    let hw = HipWorld::new("hipcap30");
    let o = hw.run(
        &[("FGPU_COMPUTE_SHARE", "30"), ("FGPU_LOG", "info")],
        &["launch", "100", "sleep_10000us", "sync"],
    );
    let wall = launch_sync_ms(&o, "launch rc=0");
    let share = 100.0 * 1000.0 / wall;
    println!("HIP cap 30%: 100 x 10 ms kernels in {wall:.0} ms: {share:.1}% of the device");
    assert!((27.0..=33.0).contains(&share), "share {share:.1}%\n{o}");
    let measured = gate_stat(&o, "measured_ms");
    assert!(
        (980..=1010).contains(&measured),
        "measured {measured} ms\n{o}"
    );
    assert_eq!(gate_stat(&o, "launches"), 100, "{o}");
    assert!(o.stderr.contains("compute capped at 30%"), "{o}");
}

/// Every way a HIP program reaches a launch is gated the same way: `hipGetProcAddress`
/// (`--gpa`), the `_spt` entry points (`--spt`), `hipStreamPerThread` (`--per-thread`),
/// `hipModuleLaunchKernel`, and `hipExtLaunchKernel` (each with its own start/stop events).
#[test]
fn every_hip_launch_entry_point_is_gated() {
    let _quiet = shared();
    let hw = HipWorld::new("hipcap50v");
    let env = [("FGPU_COMPUTE_SHARE", "50"), ("FGPU_LOG", "info")];
    let kernels = ["launch", "60", "sleep_10000us", "sync"];
    for style in [
        &[][..],
        &["--gpa"],
        &["--spt"],
        &["--per-thread"],
        &["--gpa", "--spt"],
    ] {
        let mut args = style.to_vec();
        args.extend(kernels);
        let o = hw.run(&env, &args);
        let share = 100.0 * 600.0 / launch_sync_ms(&o, "launch rc=0");
        println!("HIP cap 50% {style:?}: hipLaunchKernel {share:.1}%");
        assert!(
            (46.0..=54.0).contains(&share),
            "{style:?}: share {share:.1}%\n{o}"
        );
        assert_eq!(gate_stat(&o, "launches"), 60, "{style:?}: {o}");
    }
    for style in [&[][..], &["--gpa"]] {
        let mut args = style.to_vec();
        args.extend(["module-launch", "60", "sleep_10000us", "sync"]);
        let o = hw.run(&env, &args);
        let share = 100.0 * 600.0 / launch_sync_ms(&o, "module-launch rc=0");
        println!("HIP cap 50% {style:?}: hipModuleLaunchKernel {share:.1}%");
        assert!(
            (46.0..=54.0).contains(&share),
            "{style:?}: share {share:.1}%\n{o}"
        );
        assert_eq!(gate_stat(&o, "launches"), 60, "{style:?}: {o}");
    }
    // hipExtLaunchKernel: one kernel a call, the caller waiting for its stop event each time.
    let mut args = vec![];
    for _ in 0..30 {
        args.extend(["ext-launch", "sleep_10000us"]);
    }
    let t = std::time::Instant::now();
    let o = hw.run(&env, &args);
    let wall = t.elapsed().as_secs_f64() * 1e3;
    let share = 100.0 * 300.0 / wall;
    let kernel_ms: Vec<f64> = o
        .lines("ext-launch rc=0")
        .iter()
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("ms="))
                .and_then(|v| v.parse().ok())
                .unwrap()
        })
        .collect();
    println!("HIP cap 50%: 30 hipExtLaunchKernel of 10 ms in {wall:.0} ms: {share:.1}%");
    assert_eq!(kernel_ms.len(), 30, "{o}");
    assert!(
        kernel_ms.iter().all(|&k| (9.5..=11.0).contains(&k)),
        "the caller's own events time its kernel: {kernel_ms:?}"
    );
    assert_eq!(gate_stat(&o, "launches"), 30, "{o}");
    // The process's start-up is in the wall time: the bound is looser above.
    assert!((40.0..=54.0).contains(&share), "share {share:.1}%\n{o}");
}

/// `hipGraphLaunch` is gated: graphs of 10 × 1 ms replayed 60 times (0.6 s of GPU time)
/// under a 30% cap take about 2 s. The capture is neither charged nor held, and no event is
/// ever recorded into the capturing stream.
#[test]
fn hip_graph_launches_are_gated_and_the_capture_is_not_charged() {
    let _quiet = shared();
    let hw = HipWorld::new("hipgraph30");
    let env = [("FGPU_COMPUTE_SHARE", "30"), ("FGPU_LOG", "info")];
    for style in [&[][..], &["--spt"]] {
        let mut args = style.to_vec();
        args.extend(["graph", "10", "sleep_1000us", "60", "event-stats"]);
        let o = hw.run(&env, &args);
        let wall = ms(o.lines("graph rc=0")[0]);
        let share = 100.0 * 600.0 / wall;
        println!("HIP cap 30% {style:?}: 60 graph replays of 10 ms in {wall:.0} ms: {share:.1}%");
        assert!(
            (27.0..=33.0).contains(&share),
            "{style:?}: share {share:.1}%\n{o}"
        );
        let measured = gate_stat(&o, "measured_ms");
        assert!(
            (570..=610).contains(&measured),
            "measured {measured} ms\n{o}"
        );
        let (created, recorded, into_capture) = event_stats(&o);
        assert!(created > 0 && recorded > 0, "{o}");
        assert_eq!(into_capture, 0, "{o}");
    }
    // Captured launches first pass admission with a budget not in debt and reach the batch
    // logic (50 captured kernels), then kernels and another capture with the budget in debt.
    let o = hw.run(
        &env,
        &[
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
            "event-stats",
        ],
    );
    let (created, recorded, into_capture) = event_stats(&o);
    println!(
        "HIP capture under a cap: events created {created}, recorded {recorded}, into a \
         capturing stream {into_capture}; gate skipped {} capture checks",
        gate_stat(&o, "capture_skips")
    );
    assert_eq!(
        o.lines("graph rc=0").len(),
        2,
        "capture + instantiate succeed\n{o}"
    );
    assert_eq!(into_capture, 0, "{o}");
    assert!(gate_stat(&o, "capture_skips") > 0, "{o}");
    let measured = gate_stat(&o, "measured_ms");
    assert!(
        (80..=110).contains(&measured),
        "measured {measured} ms\n{o}"
    );
    // Without a cap the graph run takes 0.6 s: the graph's kernels are really there.
    let o = hw.run(&[], &["graph", "10", "sleep_1000us", "60"]);
    let wall = ms(o.lines("graph rc=0")[0]);
    assert!(
        (595.0..700.0).contains(&wall),
        "uncapped graph run {wall:.0} ms\n{o}"
    );
}

/// Best (lowest) ns per launch of `bench-launch N sleep_0us` over `rounds`, without the shim,
/// with it and no cap, and with a 50% cap (a tenth of the launches), runs interleaved.
fn bench(hw: &HipWorld, n: u32, rounds: usize) -> [f64; 3] {
    best_ns_per_launch(rounds, |l| {
        let (env, n): (&[(&str, &str)], u32) = match l {
            Launcher::Gated => (&[("FGPU_COMPUTE_SHARE", "50")], n / 10),
            _ => (&[], n),
        };
        hw.cmd(
            env,
            &["bench-launch", &n.to_string(), "sleep_0us"],
            l != Launcher::Bare,
        )
    })
}

/// Without a cap the HIP launch entry points are still ours (a share set later reaches the
/// process) but cost one atomic load: a launch loop runs as fast as without the shim, and no
/// event is created or recorded in the process. `FGPU_COMPUTE_SHARE=100` is no cap either,
/// and `FGPU_HIP=off` lets a capped process's HIP launches through ungated.
#[test]
fn an_ungated_hip_process_pays_no_gate() {
    let _alone = QUIET.write().unwrap_or_else(|e| e.into_inner());
    let hw = HipWorld::new("hipnogate");
    assert_ungated_is_free("HIP bench-launch sleep_0us", || bench(&hw, 200_000, 7));
    for env in [
        &[][..],
        &[("FGPU_COMPUTE_SHARE", "100"), ("FGPU_LOG", "info")],
    ] {
        let o = hw.run(
            env,
            &[
                "launch",
                "2000",
                "sleep_10us",
                "graph",
                "5",
                "sleep_10us",
                "5",
                "sync",
                "event-stats",
            ],
        );
        assert_eq!(event_stats(&o), (0, 0, 0), "{env:?}: {o}");
        assert!(!o.stderr.contains("compute gate"), "{o}");
    }
    let o = hw.run(
        &[
            ("FGPU_COMPUTE_SHARE", "30"),
            ("FGPU_HIP", "off"),
            ("FGPU_LOG", "info"),
        ],
        &["launch", "20", "sleep_10000us", "sync", "event-stats"],
    );
    let wall = launch_sync_ms(&o, "launch rc=0");
    assert!(
        wall < 280.0,
        "FGPU_HIP=off: not capped, 200 ms of work in {wall:.0} ms\n{o}"
    );
    assert_eq!(event_stats(&o), (0, 0, 0), "{o}");
}
