//! The one monotonic clock of fgpu: `CLOCK_MONOTONIC` in nanoseconds.
//!
//! It is the same clock in every PID, mount and cgroup namespace of a host (a time namespace
//! may offset it, which is why nothing a tenant stamps is compared with it: per-process stamps
//! are heartbeats of the agent's controller, see [`crate::ledger`]). The agent reads it once
//! per controller tick and passes the reading down: decisions never read a clock themselves.

/// `CLOCK_MONOTONIC`, ns.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: CLOCK_MONOTONIC is a valid clock id and `ts` a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_MONOTONIC`, ms.
pub fn mono_ms() -> u64 {
    mono_ns() / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward_and_agrees_with_std() {
        let a = mono_ns();
        let t = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = mono_ns();
        let el = t.elapsed().as_nanos() as u64;
        assert!(b > a);
        assert!(b - a >= 5_000_000, "{}", b - a);
        assert!((b - a).abs_diff(el) < 2_000_000, "{} vs {el}", b - a);
    }
}
