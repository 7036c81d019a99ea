//! Overrides of the batch sizes, for experiments on a GPU only (docs/compute.md, "Seeing what
//! the turns cost"): `FGPU_GATE_BATCH_US` — host time after which a batch closes (default
//! [`BATCH_HOST_NS`] = 1000 µs) — and `FGPU_GATE_BATCH_GPU_US` — estimated GPU time at which it
//! closes (default [`BATCH_GPU_NS`] = 2000 µs; a queue bound still halves it). 100 to 100000
//! µs; anything else is ignored with one line. Fewer batches mean fewer timing events (and
//! their driver calls) per step, at the price of coarser settlement. They change only how this
//! process measures itself: the controller's queue bound and turns still hold.
//! `FGPU_GATE_DEPTH` (1 to [`DEPTH`]) lowers how many closed batches a stream may have
//! unmeasured (the A/B of the deeper ring).

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};

use super::batch::DEPTH;
use super::{BATCH_GPU_NS, BATCH_HOST_NS};
use crate::log::{error, info};

static HOST_NS: AtomicU64 = AtomicU64::new(BATCH_HOST_NS);
static GPU_NS: AtomicI64 = AtomicI64::new(BATCH_GPU_NS);
static MAX_OUT: AtomicUsize = AtomicUsize::new(DEPTH);

/// Closed, unmeasured batches a stream may have at most.
pub fn depth() -> usize {
    MAX_OUT.load(Relaxed)
}

/// `1`..=[`DEPTH`].
fn parse_depth(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=DEPTH).contains(&n) => Ok(n),
        Ok(n) => Err(format!("{n} is out of range (1-{DEPTH})")),
        Err(_) => Err("not a whole number".into()),
    }
}

/// Host time after which an open batch closes, ns.
pub fn batch_host_ns() -> u64 {
    HOST_NS.load(Relaxed)
}

/// Estimated GPU time at which an open batch closes (before a queue bound halves it), ns.
pub fn batch_gpu_ns() -> i64 {
    GPU_NS.load(Relaxed)
}

/// `100`..`100000` (µs) → ns.
fn parse_us(v: &str) -> Result<u64, String> {
    match v.trim().parse::<u64>() {
        Ok(us) if (100..=100_000).contains(&us) => Ok(us * 1000),
        Ok(us) => Err(format!("{us} is out of range (100-100000 µs)")),
        Err(_) => Err("not a whole number of µs".into()),
    }
}

/// Reads the overrides (once, at the gate's start).
pub fn read() {
    if let Some(ns) = override_ns("FGPU_GATE_BATCH_US") {
        HOST_NS.store(ns, Relaxed);
    }
    if let Some(ns) = override_ns("FGPU_GATE_BATCH_GPU_US") {
        GPU_NS.store(ns.min(i64::MAX as u64) as i64, Relaxed);
    }
    if let Some(v) = std::env::var("FGPU_GATE_DEPTH")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        match parse_depth(&v) {
            Ok(n) => {
                info!("FGPU_GATE_DEPTH={v}: batch depth override (an experiment setting)");
                MAX_OUT.store(n, Relaxed);
            }
            Err(e) => error!("FGPU_GATE_DEPTH={v} ignored: {e}"),
        }
    }
}

fn override_ns(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok().filter(|v| !v.trim().is_empty())?;
    match parse_us(&v) {
        Ok(ns) => {
            info!("{name}={v}: batch size override (an experiment setting)");
            Some(ns)
        }
        Err(e) => {
            error!("{name}={v} ignored: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DEPTH, parse_depth, parse_us};

    #[test]
    fn the_depth_override_takes_1_to_the_ring_only() {
        assert_eq!(parse_depth("3"), Ok(3));
        assert_eq!(parse_depth(" 1 "), Ok(1));
        assert_eq!(parse_depth(&DEPTH.to_string()), Ok(DEPTH));
        assert!(parse_depth("0").is_err());
        assert!(parse_depth(&(DEPTH + 1).to_string()).is_err());
        assert!(parse_depth("three").is_err());
    }

    #[test]
    fn batch_overrides_take_microseconds_in_range_only() {
        assert_eq!(parse_us("4000"), Ok(4_000_000));
        assert_eq!(parse_us(" 100 "), Ok(100_000));
        assert_eq!(parse_us("100000"), Ok(100_000_000));
        assert!(parse_us("99").is_err());
        assert!(parse_us("100001").is_err());
        assert!(parse_us("4ms").is_err());
        assert!(parse_us("-5").is_err());
    }
}
