//! `FGPU_GATE_PROFILE=1`: where the gated path's host time goes, for the GPU machines that
//! have no profiler (the H200 image has no perf). With it, every gated launch times its whole
//! path and the real launch call inside it, and every driver call the gate makes is timed by
//! kind; at exit, with `FGPU_LOG=info`, one line:
//! `compute gate profile: launches=N path_ns=P launch_ns=L gate_ns_per_launch=G calls: KIND=count/avg_ns ...`
//! (G = (P - L) / N: what the gate adds to each launch on the launching thread; the driver
//! calls are counted on every thread, the watcher's included). Off, it costs one relaxed load
//! per launch and per driver call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::now_ns;
use crate::log::info;

static ON: AtomicBool = AtomicBool::new(false);

/// The driver calls the gate makes, by kind.
#[derive(Clone, Copy)]
pub enum Call {
    Launch = 0,
    Capturing,
    Exchange,
    Record,
    Query,
    StreamQuery,
    Elapsed,
    Context,
}

const KINDS: usize = 8;
const NAMES: [&str; KINDS] = [
    "launch",
    "is_capturing",
    "capture_mode",
    "event_record",
    "event_query",
    "stream_query",
    "elapsed_time",
    "context",
];

static NS: [AtomicU64; KINDS] = [const { AtomicU64::new(0) }; KINDS];
static COUNT: [AtomicU64; KINDS] = [const { AtomicU64::new(0) }; KINDS];
static PATH_NS: AtomicU64 = AtomicU64::new(0);
static PATHS: AtomicU64 = AtomicU64::new(0);

/// Reads `FGPU_GATE_PROFILE` (once, at the gate's start).
pub fn read() {
    if std::env::var("FGPU_GATE_PROFILE").is_ok_and(|v| v.trim() == "1") {
        ON.store(true, Relaxed);
        info!("FGPU_GATE_PROFILE=1: timing the gated path (an experiment setting)");
    }
}

/// `f()`, timed as a call of `kind` while profiling.
pub fn timed<T>(kind: Call, f: impl FnOnce() -> T) -> T {
    if !ON.load(Relaxed) {
        return f();
    }
    let t = now_ns();
    let r = f();
    NS[kind as usize].fetch_add(now_ns().saturating_sub(t), Relaxed);
    COUNT[kind as usize].fetch_add(1, Relaxed);
    r
}

/// The whole gated path of one launch, timed from here to its drop while profiling.
pub struct Span(u64);

pub fn span() -> Span {
    Span(if ON.load(Relaxed) { now_ns() } else { 0 })
}

impl Drop for Span {
    fn drop(&mut self) {
        if self.0 != 0 {
            PATH_NS.fetch_add(now_ns().saturating_sub(self.0), Relaxed);
            PATHS.fetch_add(1, Relaxed);
        }
    }
}

/// The exit line (profiling only).
pub fn report() {
    if !ON.load(Relaxed) {
        return;
    }
    let n = PATHS.load(Relaxed);
    let path = PATH_NS.load(Relaxed);
    let launch = NS[Call::Launch as usize].load(Relaxed);
    let calls: Vec<String> = (0..KINDS)
        .filter(|&k| k != Call::Launch as usize)
        .map(|k| {
            let c = COUNT[k].load(Relaxed);
            format!("{}={c}/{}", NAMES[k], NS[k].load(Relaxed) / c.max(1))
        })
        .collect();
    info!(
        "compute gate profile: launches={n} path_ns={path} launch_ns={launch} \
         gate_ns_per_launch={} calls: {}",
        path.saturating_sub(launch) / n.max(1),
        calls.join(" ")
    );
}
