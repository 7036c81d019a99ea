//! The agent's shared state: a plain record of its parts, each of which keeps its own
//! locks. The parts are built once in [`super::run`] and shared behind an `Arc`; what reads
//! or changes them lives in their own modules ([`super::report`] builds the status report
//! from a `&State`, [`super::apply`] is the one place that reacts to a limit change).
//!
//! # Lock order
//!
//! Where the agent holds one of these locks while it takes another, it does so in this order
//! only (as the code stands; a lock never waits on one listed before it):
//!
//! 1. `names`;
//! 2. `limits`;
//! 3. the parts taken last, each with none of the others: the ledgers' map, or one ledger's
//!    team; `shims`; the compute figures; the backstop's tallies; `libraries`.
//!
//! `kernel` and `bound` are taken with no other lock of the state held, and none is taken
//! under them. The enforce loop's memory ([`super::enforcer`]) is no part of the state: the
//! loop owns it and takes no lock for it. Outside the state, the metrics listener's cache is
//! held while a scrape takes its sample, so it comes before all of the above.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use super::backstop::Backstop;
use super::bound::Bound;
use super::cgroups::CgroupNames;
use super::compute::ComputeStatus;
use super::gpus::Gpus;
use super::kernel::KernelMaps;
use super::ledgers::Ledgers;
use super::limits::{LimitStore, OnExceed};
use super::peer::Access;
use super::shims::Shims;

pub struct State {
    pub cgroup2_mount: PathBuf,
    pub kernel: Mutex<KernelMaps>,
    pub limits: Mutex<LimitStore>,
    /// Limits removed with their cgroup (containers' limits from the CDI hook).
    pub bound: Mutex<Bound>,
    pub gpus: Gpus,
    pub access: Access,
    pub ledgers: Ledgers,
    pub backstop: Backstop,
    /// Shims that said Hello, by ledger ([`super::budget`]).
    pub shims: Shims,
    pub on_exceed: OnExceed,
    /// `--unseen-tolerance` (see [`super::unseen`]).
    pub unseen_tolerance: u64,
    pub names: Mutex<CgroupNames>,
    /// Driver libraries the probes are attached to.
    pub libraries: Arc<Mutex<Vec<String>>>,
    pub events: EventCounts,
    /// New processes, for the library watcher to look into.
    pub exec_tx: Sender<u32>,
    /// The compute controller's figures.
    pub compute: ComputeStatus,
}

/// Events seen by the agent, by kind ([`super::events`]).
#[derive(Debug, Default)]
pub struct EventCounts {
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    pub exits: AtomicU64,
}
