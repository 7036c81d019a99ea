//! The device timeline shared by all processes, and busy-time accounting.
//!
//! A device executes one thing at a time: a launch of duration `d` on a stream starts at
//! `max(now, device busy_until, stream's last completion)` and moves `busy_until` to
//! `start + d` (CAS loop on the shared atomic). Launches return at once; synchronisation
//! sleeps until the relevant completion time on CLOCK_MONOTONIC.
//!
//! Busy time is also added to rings of 100 ms buckets (device-wide and per process) from which
//! NVML utilisation over the last second is computed.

use crate::state::{DeviceRec, Slot};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

pub const BUCKET_NS: u64 = 100_000_000;
pub const BUCKETS: usize = 128;
/// Work scheduled further ahead than this is not recorded in the rings (it would wrap).
const HORIZON_NS: u64 = (BUCKETS as u64 - 16) * BUCKET_NS;

pub use fgpu_common::clock::mono_ns as now_ns;

/// Sleeps until CLOCK_MONOTONIC reaches `t` ns.
pub fn sleep_until(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    };
    while now_ns() < t {
        // SAFETY: absolute sleep on a valid clock with a valid timespec.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
    }
}

/// Busy ns per 100 ms bucket; a bucket's tag is the bucket number it currently holds.
#[repr(C)]
pub struct BusyRing {
    tag: [AtomicU64; BUCKETS],
    ns: [AtomicU64; BUCKETS],
}

impl BusyRing {
    pub fn clear(&self) {
        for i in 0..BUCKETS {
            self.tag[i].store(0, SeqCst);
            self.ns[i].store(0, SeqCst);
        }
    }

    fn add_to_bucket(&self, bucket: u64, ns: u64) {
        let i = (bucket % BUCKETS as u64) as usize;
        let tag = self.tag[i].load(SeqCst);
        if tag != bucket + 1 {
            if tag > bucket + 1 {
                return; // the slot already holds a newer bucket
            }
            if self.tag[i]
                .compare_exchange(tag, bucket + 1, SeqCst, SeqCst)
                .is_ok()
            {
                self.ns[i].store(0, SeqCst);
            }
        }
        self.ns[i].fetch_add(ns, SeqCst);
    }

    /// Records busy time over `[start, end)`.
    pub fn add(&self, start: u64, end: u64, now: u64) {
        let end = end.min(now + HORIZON_NS);
        let mut t = start;
        while t < end {
            let bucket = t / BUCKET_NS;
            let bucket_end = ((bucket + 1) * BUCKET_NS).min(end);
            self.add_to_bucket(bucket, bucket_end - t);
            t = bucket_end;
        }
    }

    /// Busy fraction (0..=100) over the last full second of completed buckets.
    pub fn percent_last_second(&self, now: u64) -> u32 {
        let current = now / BUCKET_NS;
        let per_sec = 1_000_000_000 / BUCKET_NS;
        let busy: u64 = (current.saturating_sub(per_sec)..current)
            .map(|b| {
                let i = (b % BUCKETS as u64) as usize;
                if self.tag[i].load(SeqCst) == b + 1 {
                    self.ns[i].load(SeqCst)
                } else {
                    0
                }
            })
            .sum();
        (busy * 100 / 1_000_000_000).min(100) as u32
    }
}

/// Schedules `dur` ns of work on a device after `not_before` (the stream's last completion).
/// Returns (start, end).
pub fn schedule(
    dev: &DeviceRec,
    slot: &Slot,
    dev_idx: usize,
    not_before: u64,
    dur: u64,
) -> (u64, u64) {
    let now = now_ns();
    let mut busy = dev.busy_until_ns.load(SeqCst);
    let (start, end) = loop {
        let start = now.max(busy).max(not_before);
        let end = start + dur;
        match dev
            .busy_until_ns
            .compare_exchange(busy, end, SeqCst, SeqCst)
        {
            Ok(_) => break (start, end),
            Err(actual) => busy = actual,
        }
    };
    dev.busy_total_ns.fetch_add(dur, SeqCst);
    dev.busy.add(start, end, now);
    slot.busy_total_ns[dev_idx].fetch_add(dur, SeqCst);
    slot.busy[dev_idx].add(start, end, now);
    (start, end)
}

/// Local memory convention: a kernel whose name contains `lmem_<N>mib` needs N MiB of local
/// memory on its device (the real driver's per-thread local memory times the threads that
/// can be resident); a launch grows the process's reservation to it.
pub fn kernel_local_mem(name: &str) -> u64 {
    number_in(name, "lmem_", "mib").map_or(0, |n| n.saturating_mul(1 << 20))
}

/// The first N of `PREFIX<N>SUFFIX` in `name`.
fn number_in(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let mut rest = name;
    while let Some(pos) = rest.find(prefix) {
        let after = &rest[pos + prefix.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0
            && after[digits..].starts_with(suffix)
            && let Ok(n) = after[..digits].parse::<u64>()
        {
            return Some(n);
        }
        rest = after;
    }
    None
}

/// Kernel duration convention: a name containing `sleep_<N>us` runs N µs, `empty` runs 2 µs,
/// anything else 5 µs.
pub fn kernel_duration_ns(name: &str) -> u64 {
    match number_in(name, "sleep_", "us") {
        Some(n) => n.saturating_mul(1_000),
        None if name.contains("empty") => 2_000,
        None => 5_000,
    }
}

#[cfg(test)]
mod tests {
    use super::{kernel_duration_ns, kernel_local_mem};

    #[test]
    fn local_memory() {
        assert_eq!(kernel_local_mem("lmem_3072mib_sleep_1000us"), 3 << 30);
        assert_eq!(kernel_local_mem("sleep_1000us"), 0);
        assert_eq!(kernel_local_mem("lmem_mib lmem_2mib"), 2 << 20);
    }

    #[test]
    fn durations() {
        assert_eq!(kernel_duration_ns("sleep_10000us"), 10_000_000);
        assert_eq!(kernel_duration_ns("_Z13sleep_250usPf"), 250_000);
        assert_eq!(kernel_duration_ns("empty"), 2_000);
        assert_eq!(kernel_duration_ns("sleep_xus"), 5_000);
        assert_eq!(kernel_duration_ns("gemm"), 5_000);
    }
}
