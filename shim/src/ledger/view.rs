//! The ledger this process uses (layout in `fgpu_common::ledger`) and its slot in it, opened
//! at the first need ([`view`]).
//!
//! - Slot: the process takes an OFD write lock (`F_OFD_SETLK`) on byte `LOCK_BASE + slot` of
//!   its own open file description of the ledger (the agent's usage memfd is reopened through
//!   `/proc/self/fd`: the description that came over the socket is shared by every shim) and
//!   keeps it for its whole life. The kernel drops it when the process dies, however it dies;
//!   nothing here can be left locked by a SIGKILLed process. OFD locks belong to the open file
//!   description, not the pid, so this works across PID namespaces.
//! - Reclaim ([`sweep`]): a slot whose lock can be taken (`F_OFD_SETLK` succeeds) belongs to
//!   nobody; its bytes are swapped out and subtracted from the device totals, then the lock is
//!   dropped. Done when claiming a slot, before denying an allocation, and on memory-info
//!   queries.
//! - The ledger in use and the slot form one immutable [`View`] behind one pointer, so that a
//!   reader never pairs a ledger with a slot of another; when the agent hands over a different
//!   ledger after a restart (`super::reconnect`) a new view replaces the old one
//!   ([`publish_agent`]), whose mapping stays (threads may still hold references into it).
//! - Fork: the child gets its own open file description (a fresh `open` of
//!   `/proc/self/fd/N`) and drops the inherited one at once, so that a parent's slot dies with
//!   the parent; it claims its own slot at its next use of the ledger.

use super::sources::{self, Opened, SRC_AGENT, SRC_FILE, ledger_at};
use crate::config;
use crate::log::{debug, error, info};
use crate::sys::reopen_own;
use fgpu_common::ledger::{LEDGER_SIZE, Ledger, MAX_SLOTS};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU8, AtomicUsize, Ordering::SeqCst};

const CLOSED: u8 = 0;
const OPENING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;
const NEEDS_SLOT: u8 = 4;
/// Neither an agent nor an environment limit: nothing to enforce.
const INERT: u8 = 5;

/// The ledger in use and this process's slot in it. Never changed once published.
pub struct View {
    map: usize,
    pub slot: usize,
    /// Our own open file description of the ledger (slot locks live on it).
    pub fd: i32,
}

impl View {
    pub fn ledger(&self) -> &'static Ledger {
        // SAFETY: `map` is a live mapping of LEDGER_SIZE bytes, validated when it was made
        // and never unmapped; Ledger is all atomics.
        unsafe { &*(self.map as *const Ledger) }
    }
}

static STATE: AtomicU8 = AtomicU8::new(CLOSED);
static CUR: AtomicPtr<View> = AtomicPtr::new(std::ptr::null_mut());
/// The current ledger's mapping and descriptor (also while a fork child has no slot yet).
static MAP: AtomicUsize = AtomicUsize::new(0);
static FD: AtomicI32 = AtomicI32::new(-1);
static SOURCE: AtomicU8 = AtomicU8::new(SRC_FILE);

/// The ledger in use and this process's slot, if any.
pub fn view() -> Option<&'static View> {
    loop {
        match STATE.load(SeqCst) {
            READY => {
                // SAFETY: READY is only stored after CUR holds a leaked, never-freed View.
                return Some(unsafe { &*CUR.load(SeqCst) });
            }
            FAILED | INERT => return None,
            CLOSED => {
                if STATE
                    .compare_exchange(CLOSED, OPENING, SeqCst, SeqCst)
                    .is_ok()
                {
                    STATE.store(open(), SeqCst);
                }
            }
            NEEDS_SLOT => {
                if STATE
                    .compare_exchange(NEEDS_SLOT, OPENING, SeqCst, SeqCst)
                    .is_ok()
                {
                    let next = if reopen_in_child() { READY } else { FAILED };
                    STATE.store(next, SeqCst);
                }
            }
            _ => {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }
}

/// The ledger and this process's slot, opening/claiming on first use. None if there is no
/// ledger (nothing to enforce, or none could be had: accounting is then off).
pub fn get() -> Option<(&'static Ledger, usize)> {
    view().map(|v| (v.ledger(), v.slot))
}

/// Whether the shim accounts and enforces at all: an agent handed over a ledger, or the
/// environment sets a limit. Decided at the first call (which connects to the agent); cheap
/// afterwards.
pub fn active() -> bool {
    view().is_some()
}

/// Publishes a view of `map` with a freshly claimed slot (locked through `fd`).
fn install(map: usize, fd: i32) -> bool {
    MAP.store(map, SeqCst);
    FD.store(fd, SeqCst);
    let Some(slot) = claim(ledger_at(map), fd) else {
        return false;
    };
    let v = Box::leak(Box::new(View { map, slot, fd }));
    CUR.store(v, SeqCst);
    true
}

/// Publishes the agent's ledger at `map` with this process's slot `slot` in it, locked
/// through `fd` (a migration after an agent restart, `super::reconnect`).
pub fn publish_agent(map: usize, fd: i32, slot: usize) {
    MAP.store(map, SeqCst);
    FD.store(fd, SeqCst);
    SOURCE.store(SRC_AGENT, SeqCst);
    CUR.store(Box::leak(Box::new(View { map, slot, fd })), SeqCst);
}

fn open() -> u8 {
    match sources::open() {
        Opened::Ledger { map, fd, source } => {
            SOURCE.store(source, SeqCst);
            if install(map, fd) { READY } else { FAILED }
        }
        Opened::Failed => FAILED,
        Opened::Inert => INERT,
    }
}

pub fn claim(l: &Ledger, fd: i32) -> Option<usize> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    match fgpu_ledger::claim_slot(l, fd, pid) {
        Some((slot, reclaimed)) => {
            debug!("pid {pid} claimed ledger slot {slot} (reclaimed {reclaimed} bytes)");
            Some(slot)
        }
        None => {
            error!("all {MAX_SLOTS} ledger slots are taken: memory limits are not enforced here");
            None
        }
    }
}

fn reopen_in_child() -> bool {
    let mut fd = FD.load(SeqCst);
    if fd < 0 {
        if SOURCE.load(SeqCst) != SRC_FILE {
            error!("fork child: cannot reopen the ledger (is /proc mounted?)");
            return false;
        }
        let cfg = config::get();
        match sources::open_shared(&cfg.ledger_path, 0o600) {
            Ok((f, p)) => {
                // The inherited mapping is of the same file; keep using it.
                // SAFETY: unmapping the second mapping we just made.
                unsafe { libc::munmap(p as *mut libc::c_void, LEDGER_SIZE) };
                fd = f;
            }
            Err(e) => {
                error!("fork child: ledger {} unusable ({e})", cfg.ledger_path);
                return false;
            }
        }
    }
    install(MAP.load(SeqCst), fd)
}

/// (mapping, descriptor, whether it is an agent's ledger) of the ledger in use; for
/// reconnects.
pub fn current() -> (usize, i32, bool) {
    match view() {
        Some(v) => (v.map, v.fd, SOURCE.load(SeqCst) == SRC_AGENT),
        None => (0, -1, false),
    }
}

/// Takes back the bytes of slots whose owners are gone. Returns how many bytes came back.
pub fn sweep() -> u64 {
    let Some(v) = view() else {
        return 0;
    };
    let l = v.ledger();
    fgpu_ledger::reclaim_dead(l, v.fd, Some(v.slot), |slot, n| {
        let pid = l.slots[slot].pid.load(SeqCst);
        info!("took back {n} bytes from exited process {pid} (ledger slot {slot})");
    })
}

/// In a fork child (async-signal-safe calls only): get an open file description of our own
/// and drop the parent's, forget the parent's slot.
pub fn after_fork_child() {
    let fd = FD.load(SeqCst);
    if fd >= 0 {
        let new = reopen_own(fd);
        // SAFETY: closing the inherited descriptor (its lock stays with the parent's copy).
        unsafe { libc::close(fd) };
        FD.store(new, SeqCst);
    }
    let s = STATE.load(SeqCst);
    let next = match s {
        READY => NEEDS_SLOT,
        OPENING => CLOSED,
        other => other,
    };
    STATE.store(next, SeqCst);
}
