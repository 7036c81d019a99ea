//! The ledger's memory, shared by the agent and the shim: the memfds a cgroup's ledger lives
//! in (created, sized and sealed so that nobody can resize them: a container that tries gets
//! `EPERM`, never a `SIGBUS` in the agent), the checks an offered descriptor must pass before
//! it is adopted, the mappings (the agent's read-write one, the shims' with a read-only limits
//! page), and the per-process slots (OFD locks, claim, reclaim of dead processes).
//!
//! The layout and the arithmetic on it are `fgpu_common::ledger`; this crate adds the
//! system calls. No heap allocation on any path the shim uses after start-up.

mod map;
mod memfd;
mod slots;

pub use map::{Mapping, map_agent, map_shim, remap_limits, unmap_shim};
pub use memfd::{
    LIMITS_SEALS, USAGE_NAME, USAGE_SEALS, check_limits, check_usage, create_limits, create_usage,
    file_len, seal_limits, seals, usage_name, usage_tag, usage_tag_of,
};
pub use slots::{
    any_slot_locked, claim_slot, lock_slot, reclaim_dead, reclaim_dead_in, slot_free, unlock_slot,
};

/// Why a ledger descriptor or mapping cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{what}: {err}")]
    Os {
        what: &'static str,
        err: std::io::ErrorKind,
        errno: i32,
    },
    #[error("{what} is {got} bytes, expected {want}")]
    Size {
        what: &'static str,
        got: i64,
        want: usize,
    },
    #[error(
        "{what} carries seals {got:#x}, expected {want:#x} (a descriptor that could be resized or resealed)"
    )]
    Seals {
        what: &'static str,
        got: i32,
        want: i32,
    },
    #[error(transparent)]
    Layout(#[from] fgpu_common::ledger::LayoutError),
}

impl Error {
    /// The error of the last failed system call.
    pub(crate) fn os(what: &'static str) -> Error {
        let e = std::io::Error::last_os_error();
        Error::Os {
            what,
            err: e.kind(),
            errno: e.raw_os_error().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests;
