//! The launch gate: admits GPU work by turns on the device (under the agent) or by measured
//! GPU time (standalone caps). Design and field semantics: docs/compute.md.
//!
//! - [`budget`]: per device, a process-local token bucket refilled at
//!   `FGPU_COMPUTE_SHARE`% of wall time (standalone cap), and/or the agent's turns on the
//!   ledger. A launch waits while the bucket is negative or the container's turn is closed.
//! - [`batch`]: per stream, launches form batches (closed after [`BATCH_HOST_NS`] of host
//!   time, once their estimated GPU time reaches [`BATCH_GPU_NS`] — less under a small queue
//!   bound —, at every graph launch, and after every launch while the stream's cost per launch
//!   is not known yet), each measured with a pair of timing events. The work queued ahead is
//!   bounded.
//! - [`streams`]: the fixed table of per-stream records; [`driver`]: the event, capture and
//!   context calls the gate makes.
//! - Never an event into a capturing stream: before recording, `cuStreamIsCapturing`; a
//!   launch into a capturing stream is not charged and never waits (the graph is charged
//!   when it is launched). Event queries run in relaxed capture mode.
//!
//! No heap, no TLS with destructors, no lock: per-stream bookkeeping belongs to whichever
//! thread holds the record's owner flag, which is only ever tried.

mod batch;
mod budget;
mod driver;
mod profile;
mod streams;
mod tuning;

use std::sync::Once;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed,
};

use crate::ledger;
use crate::log::{error, info, warning};
use crate::real::{CUresult, Handle};
use crate::registered::Registered;
use budget::M_OFF;
use driver::CUDA_SUCCESS;
pub use driver::{Api, Contexts, GateApi, register_api};
use fgpu_common::ledger::MAX_DEVICES;

/// A batch closes once this much host time has passed since its first launch...
/// (4 ms was tried on the H200 on 2026-12-04: half the timing events per launch, but the
/// gated ResNet-18 step's rate moved within the measurement's noise and the decoder next to
/// it did worse in both runs; docs/benchmarks.md, fifth round. `FGPU_GATE_BATCH_US` sets it.)
pub const BATCH_HOST_NS: u64 = 1_000_000;
/// ...or once its launches are estimated at this much GPU time (or half the controller's
/// queue bound, if that is less).
pub const BATCH_GPU_NS: i64 = 2_000_000;
/// The smallest batch a queue bound makes.
const MIN_BATCH_GPU_NS: i64 = 100_000;
/// A pause of this much host time between two launches into a stream closes its open
/// batch first: the GPU may have run dry meanwhile, and a batch's events would count the
/// idle time as the stream's.
const GAP_NS: u64 = 100_000;

/// What a launch is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Kernel = 0,
    Graph = 1,
}

// ---- process-wide state ------------------------------------------------------------------

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// Whether any launch is gated (UNKNOWN until the first launch).
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static INIT: Once = Once::new();
/// FGPU_COMPUTE_SHARE (0: not set).
static ENV_PCT: AtomicU32 = AtomicU32::new(0);
/// Some ledger device has a compute share or cap.
static LEDGER_GATED: AtomicBool = AtomicBool::new(false);
static STALE_WARNED: AtomicBool = AtomicBool::new(false);
static FULL_WARNED: AtomicBool = AtomicBool::new(false);

/// Counters (read by the exit report and by tests through `FGPU_LOG=info`).
pub struct Stats {
    pub events_created: AtomicU64,
    pub events_recorded: AtomicU64,
    pub batches: AtomicU64,
    pub measured_ns: AtomicU64,
    pub capture_skips: AtomicU64,
    pub waits: AtomicU64,
    pub wait_ns: AtomicU64,
    pub sync_ns: AtomicU64,
    pub gated_launches: AtomicU64,
    /// Batches accounted by estimate (the stream had run dry when they were closed).
    pub estimated_batches: AtomicU64,
}

pub static STATS: Stats = Stats {
    events_created: AtomicU64::new(0),
    events_recorded: AtomicU64::new(0),
    batches: AtomicU64::new(0),
    measured_ns: AtomicU64::new(0),
    capture_skips: AtomicU64::new(0),
    waits: AtomicU64::new(0),
    wait_ns: AtomicU64::new(0),
    sync_ns: AtomicU64::new(0),
    gated_launches: AtomicU64::new(0),
    estimated_batches: AtomicU64::new(0),
};

pub use fgpu_common::clock::mono_ns as now_ns;

/// Settles the completed batches of every stream whose bookkeeping is free right now.
/// Returns whether some batch is still outstanding. With `close_paused` (the watcher thread
/// only: it changes the calling thread's current context) it also closes the open batch of a
/// stream nobody has launched into for [`GAP_NS`] — its launcher may be blocked in a
/// synchronisation, and the controller waits for that batch before the next turn.
fn settle_all(close_paused: bool) -> bool {
    let mut left = false;
    let now = now_ns();
    for s in &streams::TABLE {
        if s.key.load(Relaxed) == 0 {
            continue;
        }
        let Some(g) = s.try_own() else {
            continue;
        };
        let inner = g.inner();
        let close = close_paused
            && inner.open.is_some()
            && now.saturating_sub(s.last_use.load(Relaxed)) > GAP_NS
            && inner.rec != streams::CU_STREAM_PER_THREAD;
        if inner.out > 0 || close {
            let (d, m) = budget::dev_mode(s.ord.load(Relaxed));
            if inner.out > 0 {
                batch::settle_ready(s, inner, d, m);
            }
            if close {
                let prev = driver::current_ctx(inner.api);
                if driver::set_current_ctx(inner.api, inner.ctx) {
                    batch::close_after_pause(s, inner, d, m);
                    driver::set_current_ctx(inner.api, prev);
                }
            }
        }
        left |= inner.out > 0 || inner.open.is_some();
    }
    left
}

// ---- settings ---------------------------------------------------------------------------------

/// Whether any launch is gated; decides on the first call.
pub fn enabled() -> bool {
    match STATE.load(Relaxed) {
        UNKNOWN => {
            INIT.call_once(init);
            STATE.load(Relaxed) == ON
        }
        s => s == ON,
    }
}

fn init() {
    crate::config::get(); // FGPU_LOG
    if let Some(v) = std::env::var("FGPU_COMPUTE_SHARE")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        match parse_share(&v) {
            Ok(100) => info!("FGPU_COMPUTE_SHARE=100: no compute cap"),
            Ok(p) => {
                ENV_PCT.store(p, Relaxed);
                info!("compute capped at {p}% of wall time per device (FGPU_COMPUTE_SHARE)");
            }
            Err(e) => error!("FGPU_COMPUTE_SHARE={v} ignored (no compute cap from it): {e}"),
        }
    }
    tuning::read();
    profile::read();
    scan_ledger();
    start_watcher();
    // SAFETY: registering a plain extern "C" function with no preconditions.
    unsafe { libc::atexit(report) };
}

/// How often the watcher looks at the ledger's generation at least...
const WATCH_EVERY_NS: u64 = 50_000_000;
/// ...at most this long while more than one device is gated (it sleeps on one turn word)...
const WATCH_DEVICES_NS: u64 = 1_000_000;
/// ...and how often it settles this process's work while one of its turns is closed and
/// some is still outstanding.
const WATCH_DRAIN: std::time::Duration = std::time::Duration::from_micros(200);

/// Under an agent: a thread that re-reads the compute settings when the agent changes them,
/// so that a share set on a running process that launches without being gated (its launches
/// take the fast path and never look) applies within [`WATCH_EVERY_NS`] (one load per
/// wake-up), and that reports this process's work complete as soon as its turn closes: the
/// controller bumps the turn's word at every change, and the watcher sleeps on it.
/// Not restarted in forked children (they notice at their next allocation).
fn start_watcher() {
    if !ledger::current().2 {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("fgpu-watch".into())
        .spawn(|| {
            loop {
                check_generation();
                crate::park::poll();
                let w = budget::watch();
                // While a turn of ours is closed and our work is still queued, settle it (and
                // close batches left open by a thread blocked in a synchronisation —
                // `loss.item()`, `cudaStreamSynchronize` — which would not see it complete):
                // the controller hands the device on only once it has.
                if w.closed_with_work && settle_all(true) {
                    std::thread::sleep(WATCH_DRAIN);
                    continue;
                }
                match w.word {
                    Some((word, seen)) => budget::watch_wait(
                        word,
                        seen,
                        if w.several {
                            WATCH_DEVICES_NS
                        } else {
                            WATCH_EVERY_NS
                        },
                    ),
                    None => std::thread::sleep(std::time::Duration::from_nanos(WATCH_EVERY_NS)),
                }
            }
        });
    if let Err(e) = spawned {
        warning!(
            "no compute-settings watcher ({e}): a share set later applies at the next allocation"
        );
    }
}

/// `PCT` (`30` or `30%`), 1 to 100.
pub fn parse_share(v: &str) -> Result<u32, String> {
    match fgpu_common::quantity::parse_percent(v) {
        Ok(0) => Err("0 is not a share (1-100; unset the variable for none)".into()),
        Ok(p) => Ok(u32::from(p)),
        Err(e) => Err(format!("{e} (expected 1-100, e.g. 30 or 30%)")),
    }
}

/// Reads the ledger's compute settings (only when a ledger is in use anyway) and switches the
/// gate on or off.
fn scan_ledger() {
    let mut gated = false;
    if crate::ledger::active()
        && let Some((l, _)) = ledger::get()
    {
        SEEN_GENERATION.store(l.limits.generation.load(Acquire), Relaxed);
        gated = (0..MAX_DEVICES).any(|i| budget::ledger_setting(l, i).0);
        crate::park::refresh(l);
    }
    LEDGER_GATED.store(gated, Relaxed);
    let on = gated || ENV_PCT.load(Relaxed) != 0;
    STATE.store(if on { ON } else { OFF }, Relaxed);
    // A parkable process's launches pass parking's door, which only the gate's path has.
    publish(!on && !crate::park::parkable());
}

/// Publishes the launch entry points' fast paths (crate::cuda::launch, crate::hip::launch): a
/// `fn(bool)` that lib.rs registers at load time; none until then.
static PUBLISH: Registered<fn(bool)> = Registered::new();

/// Registers `f` to publish the launch entry points' fast paths (`open`: no launch is gated);
/// called once, by the library's constructor.
pub fn on_publish(f: &'static fn(bool)) {
    PUBLISH.set(f);
}

fn publish(open: bool) {
    if let Some(f) = PUBLISH.get() {
        f(open);
    }
}

/// The ledger generation the compute settings were last read at (u64::MAX: never).
static SEEN_GENERATION: AtomicU64 = AtomicU64::new(u64::MAX);

/// Re-reads the compute settings if the ledger's limits changed since they were read (the
/// agent bumps `generation` after every change): one load when nothing changed. Called by
/// the gated launch path and the agent link's periodic check.
pub fn check_generation() {
    if let Some((l, _)) = ledger::get() {
        let g = l.limits.generation.load(Acquire);
        let seen = SEEN_GENERATION.load(Relaxed);
        if g != seen && seen != u64::MAX {
            ledger_changed();
        }
    }
}

/// The ledger's limits changed (or a new ledger was installed): re-reads the compute
/// settings; per-device modes are resolved again at the next launch.
pub fn ledger_changed() {
    INIT.call_once(init);
    budget::reset_modes();
    scan_ledger();
}

/// In a fork child (async-signal-safe): the parent's waiting threads are not the child's.
pub fn after_fork_child() {
    budget::after_fork_child();
}

/// At exit: batches still outstanding will never be settled by this process; take them out
/// of the ledger's queued work so that the controller does not wait for them.
fn forget_outstanding() {
    for s in &streams::TABLE {
        let Some(g) = s.try_own() else {
            continue;
        };
        let inner = g.inner();
        batch::forget_open(inner);
        while inner.out > 0 {
            batch::pop_oldest(inner);
        }
    }
}

extern "C" fn report() {
    // The profile covers every gated launch, also when the process ends ungated (a setting
    // removed while it ran).
    profile::report();
    if STATE.load(Relaxed) != ON {
        return;
    }
    forget_outstanding();
    let s = &STATS;
    info!(
        "compute gate: launches={} batches={} estimated_batches={} events_created={} \
         events_recorded={} measured_ms={} capture_skips={} waits={} wait_ms={} sync_ms={}",
        s.gated_launches.load(Relaxed),
        s.batches.load(Relaxed),
        s.estimated_batches.load(Relaxed),
        s.events_created.load(Relaxed),
        s.events_recorded.load(Relaxed),
        s.measured_ns.load(Relaxed) / 1_000_000,
        s.capture_skips.load(Relaxed),
        s.waits.load(Relaxed),
        s.wait_ns.load(Relaxed) / 1_000_000,
        s.sync_ns.load(Relaxed) / 1_000_000
    );
}

// ---- the gate ---------------------------------------------------------------------------------

/// The gated path of a CUDA launch into `stream` (`ptsz`: the entry point treats stream 0 as
/// the per-thread stream). `call` makes the real launch.
pub fn launch(kind: Kind, stream: Handle, ptsz: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    launch_on(Api::Cuda, kind, stream, ptsz, call)
}

/// [`launch`] for a launch of `api` (crate::hip::launch: HIP's, whose codes the gate reads
/// the same way).
pub fn launch_on(
    api: Api,
    kind: Kind,
    stream: Handle,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let _door = crate::park::enter();
    if !enabled() {
        return call();
    }
    let _span = profile::span();
    let call = move || profile::timed(profile::Call::Launch, call);
    check_generation();
    let now = now_ns();
    let (key, rec) = streams::stream_key(api, stream as usize, ptsz);
    let Some(s) = streams::find(api, key, rec, now) else {
        return call();
    };
    let prev = s.last_use.swap(now, Relaxed);
    let (d, m) = budget::dev_mode(s.ord.load(Relaxed));
    if m == M_OFF {
        return call();
    }
    STATS.gated_launches.fetch_add(1, Relaxed);
    // Close the open batch before the GPU may idle inside it — a pause in this stream's
    // launches, or (just before the first sleep) a wait for budget — so that its events
    // never count idle time.
    let close_open = || {
        if let Some(g) = s.try_own()
            && s.key.load(Acquire) == key
        {
            batch::close_after_pause(s, g.inner(), d, m);
        }
    };
    let paused = now.saturating_sub(prev) > GAP_NS;
    if paused {
        close_open();
    }
    let admitted = budget::admit(
        d,
        m,
        now,
        || driver::capturing(api, rec),
        || settle_all(false),
        || {
            if !paused {
                close_open();
            }
        },
    );
    // One clock reading per launch admitted at once (on some VMs a reading is a system
    // call): the batch's host time below is counted from it too.
    let Some(now) = admitted else {
        return call(); // capturing: recorded into a graph, charged when the graph runs
    };
    // Admission may have switched the device to its local fallback.
    let m = d.mode.load(Acquire);
    let bound = budget::launched(d, m);
    let Some(g) = s.try_own() else {
        // Another thread does this stream's bookkeeping right now: charge the estimate.
        let rc = call();
        if rc == CUDA_SUCCESS {
            let est = s.est[kind as usize].load(Relaxed).max(0);
            budget::charge_local(d, m, est);
            s.stray_est.fetch_add(est, Relaxed);
            s.stray_n.fetch_add(1, Relaxed);
        }
        return rc;
    };
    if s.key.load(Acquire) != key {
        return call(); // the record was given to another stream meanwhile
    }
    let inner = g.inner();
    if kind == Kind::Graph {
        batch::close_batch(s, inner, d, m); // a graph is a batch of its own
    }
    if inner.open.is_none() && !batch::open_batch(s, inner, d, m, kind, now) {
        return call(); // capturing
    }
    let rc = call();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let k = kind as usize;
    let est = if inner.known[k] { inner.est[k] } else { 0 };
    budget::charge_local(d, m, est);
    let batch_gpu = match bound {
        0 => tuning::batch_gpu_ns(),
        bound => (bound / 2).clamp(MIN_BATCH_GPU_NS, tuning::batch_gpu_ns()),
    };
    let known = inner.known[k];
    let close = {
        let Some(b) = batch::add_to_open(inner, est) else {
            return rc;
        };
        kind == Kind::Graph
            || !known
            || b.est >= batch_gpu
            || now.saturating_sub(b.at) >= tuning::batch_host_ns()
    };
    if close {
        batch::close_batch(s, inner, d, m);
    }
    rc
}
