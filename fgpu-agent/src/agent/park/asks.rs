//! Requests for room, as the broker takes them: a request is the container's word, written
//! in its own slot, so what the broker acts on is bounded by what the asker could use, and
//! each asker's park decisions are spaced.
//!
//! - What an asker could use on a GPU ([`could_use`]): at most its own limit's headroom
//!   there (its limit, from the page only the agent writes, less what the kernel sees its
//!   cgroup hold) and the GPU's size. A request beyond is clamped (said once in the log per
//!   asker). Nobody is parked while the GPU has that room free.
//! - One park is decided for an asker at most every [`PARK_EVERY_MS`]: its requests wait
//!   meanwhile (within the shim's two seconds for an answer).
//! - An answer "none" is not spaced (it costs nobody anything), but its log line is: one
//!   per asker every [`NONE_LOG_EVERY_MS`], with how many went unsaid.

use crate::agent::logging::Ration;

/// The least time between two parks decided for one asker (its ledger), ms.
pub const PARK_EVERY_MS: u64 = 1_000;
/// The least time between two "none" log lines for one asker, ms.
pub const NONE_LOG_EVERY_MS: u64 = 10_000;

/// Bytes of room an asker could use on a GPU of `gpu` bytes: `asked`, at most its `limit`
/// (`NO_LIMIT`: none) less the `held` bytes the kernel sees it hold there, and the GPU.
pub fn could_use(asked: u64, limit: u64, held: u64, gpu: u64) -> u64 {
    asked.min(limit.saturating_sub(held)).min(gpu)
}

/// What the broker remembers of one asker (ledger).
#[derive(Debug, Default)]
pub struct Asker {
    /// The earliest CLOCK_MONOTONIC ms at which a park may be decided for it.
    pub next_park_ms: u64,
    /// Whether its clamped request was said in the log.
    pub said_clamped: bool,
    /// Its "none" answers' log lines.
    pub none_log: Ration,
}

impl Asker {
    /// Whether a "none" answer given now is logged; if so, how many before it were not.
    pub fn say_none(&mut self, now_ms: u64) -> Option<u64> {
        self.none_log.admit(now_ms, NONE_LOG_EVERY_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_common::ledger::NO_LIMIT;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_request_is_bounded_by_the_askers_headroom_and_the_gpu() {
        let pib = 1u64 << 50;
        // A petabyte asked by a tenant of 4 GiB holding 1 GiB on a 16 GiB GPU: 3 GiB.
        assert_eq!(could_use(pib, 4 * GIB, GIB, 16 * GIB), 3 * GIB);
        // Without a limit: the GPU.
        assert_eq!(could_use(pib, NO_LIMIT, GIB, 16 * GIB), 16 * GIB);
        // An honest request within both is left as it is.
        assert_eq!(could_use(GIB, 4 * GIB, GIB, 16 * GIB), GIB);
        // Holding its whole limit (or more, by the kernel's count): nothing.
        assert_eq!(could_use(GIB, 4 * GIB, 5 * GIB, 16 * GIB), 0);
    }

    #[test]
    fn none_answers_are_logged_once_per_period_with_the_count_of_the_rest() {
        let mut a = Asker::default();
        assert_eq!(a.say_none(1_000), Some(0));
        assert_eq!(a.say_none(1_050), None);
        assert_eq!(a.say_none(1_100), None);
        assert_eq!(a.say_none(1_000 + NONE_LOG_EVERY_MS), Some(2));
    }
}
