//! The shim's side of the agent connection (contract: `fgpu_common::proto::shim`).
//!
//! - At the first need of the ledger the shim connects to `$FGPU_SOCKET` (default
//!   `/run/fgpu/fgpu.sock`), sends `Hello` and receives `LedgerReply` with two memfds:
//!   `limits` (one page, sealed against writes: mapped `PROT_READ`) and `usage` (the usage page
//!   and the slots, shared read-write). They are mapped contiguously into one reserved
//!   region, so that together they form one [`Ledger`]. The connection stays open
//!   (close-on-exec) so that the shim can notice the agent going away.
//! - Agent gone: the mappings outlive it, the shim keeps enforcing the last ledger it had. On
//!   the allocation slow path ([`tick`], at most every 100 ms) a dead connection is noticed
//!   (`poll`, non-blocking) and a reconnect tried: `Hello` with `HELLO_HAS_USAGE_FD` and the
//!   usage memfd attached. Same usage inode back: the limits page is replaced in place
//!   ([`replace_limits`]: `MAP_FIXED`, an atomic page swap). Another one: charges move over.
//!
//! The ledger layer above (crate::ledger) drives this module: it asks for the first contact,
//! runs the periodic check ([`check`], [`check_done`]) and, when a reconnect is due, reaches
//! the agent again ([`hello_again`]), decides what the answer means for the ledger in use,
//! and reports success ([`reconnected`]). This module hands over descriptors and mappings and
//! names nothing above it.
//!
//! Everything here runs on slow paths only (first use, reconnects); it may allocate and block
//! for at most [`hello::HELLO_TIMEOUT_MS`].

mod hello;

use hello::{Fd, dead, hello, os_err};
pub use hello::{HelloError, Reply};

use crate::config;
use crate::log::{debug, info, warning};
use crate::registered::Registered;
use crate::sys::{now_ms, reopen_own};

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, Ordering::SeqCst};

/// `FGPU_AGENT=required`: how long the shim keeps trying at start.
pub const REQUIRED_WAIT_MS: u64 = 10_000;
/// Dead-connection checks and reconnect attempts: at most this often.
pub const CHECK_EVERY_MS: u64 = 100;

/// No agent link and none wanted (standalone, inert, or an agent-less fork child).
const OFF: u8 = 0;
/// Connected; `CONN` is the socket.
const UP: u8 = 1;
/// The agent went away (or never came, with `FGPU_AGENT=required`): reconnect when due.
const DOWN: u8 = 2;

static LINK: AtomicU8 = AtomicU8::new(OFF);
static CONN: AtomicI32 = AtomicI32::new(-1);
static LAST_CHECK_MS: AtomicU64 = AtomicU64::new(0);
static BUSY: AtomicBool = AtomicBool::new(false);
static LOST_WARNED: AtomicBool = AtomicBool::new(false);

/// What the link tells the launch gate (crate::gate), registered by lib.rs at load time.
pub struct GateHooks {
    /// A reconnect installed a new ledger or limits page: re-read the compute settings.
    pub ledger_changed: fn(),
    /// The periodic check: re-read the compute settings if the ledger's generation moved.
    pub check_generation: fn(),
}

/// The gate's hooks (none until registered).
static GATE: Registered<GateHooks> = Registered::new();

/// Registers the gate's hooks; called once, by the library's constructor.
pub fn register_gate(hooks: &'static GateHooks) {
    GATE.set(hooks);
}

fn stat(fd: i32) -> Option<libc::stat> {
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// Whether two descriptors refer to the same file.
pub fn same_file(a: i32, b: i32) -> bool {
    match (stat(a), stat(b)) {
        (Some(x), Some(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

/// Maps `limits` (read-only) and `usage` (read-write) contiguously as one ledger; returns its
/// address after checking seals, sizes, magic, version and layout.
pub fn map_ledger(limits: i32, usage: i32) -> Result<usize, fgpu_ledger::Error> {
    fgpu_ledger::map_shim(limits, usage)
}

/// Replaces the limits page of the ledger at `base` with `limits` (validated first).
pub fn replace_limits(base: usize, limits: i32, usage: i32) -> Result<(), fgpu_ledger::Error> {
    fgpu_ledger::remap_limits(base, limits, usage)
}

/// First contact (from crate::ledger): the agent's ledger, mapped, and our own open
/// file description of the usage memfd, or why not. `FGPU_AGENT=required` retries for up to
/// [`REQUIRED_WAIT_MS`].
pub fn first_contact() -> Result<(usize, i32, String), HelloError> {
    let cfg = config::get();
    let start = now_ms();
    let mut tries = 0u32;
    let reply = loop {
        tries += 1;
        match hello(&cfg.socket, None) {
            Ok(r) => break r,
            Err(HelloError::NoAgent(e))
                if cfg.agent_required && now_ms().saturating_sub(start) < REQUIRED_WAIT_MS =>
            {
                if tries == 1 {
                    info!(
                        "no fgpu agent at {} yet ({e}): waiting up to 10 s",
                        cfg.socket
                    );
                }
                // SAFETY: plain sleep.
                unsafe { libc::usleep(100_000) };
            }
            Err(e) => return Err(e),
        }
    };
    adopt_first(reply)
}

fn adopt_first(reply: Reply) -> Result<(usize, i32, String), HelloError> {
    let base = map_ledger(reply.limits.0, reply.usage.0).map_err(HelloError::Ledger)?;
    // Our own open file description: the one that came over the socket is shared with the
    // agent and every other shim of the cgroup, and slot locks belong to descriptions.
    let own = reopen_own(reply.usage.0);
    if own < 0 {
        fgpu_ledger::unmap_shim(base);
        return Err(HelloError::Bad(format!(
            "cannot reopen the usage memfd through /proc/self/fd ({}): is /proc mounted?",
            os_err()
        )));
    }
    CONN.store(reply.conn.into_raw(), SeqCst);
    LINK.store(UP, SeqCst);
    LAST_CHECK_MS.store(now_ms(), SeqCst);
    Ok((base, own, reply.cgroup))
}

/// `FGPU_AGENT=required` and no agent: keep trying to reach it on the slow path.
pub fn want_reconnect() {
    LINK.store(DOWN, SeqCst);
}

/// The allocation slow path's look at the agent link (at most every [`CHECK_EVERY_MS`], one
/// thread at a time): a dead connection is noticed. Costs one coarse clock read when not due.
/// None: nothing to do now; Some(whether a reconnect is due): the caller (crate::ledger)
/// tries one if so ([`hello_again`]), then calls [`check_done`].
pub fn check() -> Option<bool> {
    let state = LINK.load(SeqCst);
    if state == OFF {
        return None;
    }
    let now = now_ms();
    let last = LAST_CHECK_MS.load(SeqCst);
    if now.saturating_sub(last) < CHECK_EVERY_MS
        || LAST_CHECK_MS
            .compare_exchange(last, now, SeqCst, SeqCst)
            .is_err()
    {
        return None;
    }
    if BUSY.swap(true, SeqCst) {
        return None;
    }
    if state == UP {
        let fd = CONN.load(SeqCst);
        if fd >= 0 && dead(fd) {
            if !LOST_WARNED.swap(true, SeqCst) {
                warning!(
                    "the fgpu agent went away: enforcing the last limits it set, reconnecting"
                );
            }
            let old = CONN.swap(-1, SeqCst);
            if old >= 0 {
                // SAFETY: closing our dead connection.
                unsafe { libc::close(old) };
            }
            LINK.store(DOWN, SeqCst);
            return Some(true);
        }
        Some(false)
    } else {
        Some(true)
    }
}

/// The end of a [`check`] that returned Some: the next one may run; and the gate looks for a
/// compute share set or changed since it last looked.
pub fn check_done() {
    BUSY.store(false, SeqCst);
    if let Some(g) = GATE.get() {
        (g.check_generation)();
    }
}

/// One attempt to reach the agent again: `Hello`, with a fresh open file description of
/// `usage` (our ledger's usage memfd, if it is the agent's) attached, never the one our slot
/// lock lives on: the agent tests and takes slot locks through the description it holds, and
/// through ours it would find our own slot free. None: no usable answer (logged at debug).
pub fn hello_again(usage: Option<i32>) -> Option<Reply> {
    let cfg = config::get();
    let attach = usage.and_then(|fd| {
        let fresh = reopen_own(fd);
        (fresh >= 0).then_some(Fd(fresh))
    });
    let result = hello(&cfg.socket, attach.as_ref().map(|f| f.0));
    drop(attach);
    match result {
        Ok(r) => Some(r),
        Err(e) => {
            debug!("reconnect to {}: {e}", cfg.socket);
            None
        }
    }
}

/// The ledger layer switched to what `reply` handed over (the limits page replaced, or the
/// charges migrated): its connection is the link from now on, and the gate re-reads the
/// compute settings.
pub fn reconnected(reply: Reply) {
    let cfg = config::get();
    let old = CONN.swap(reply.conn.into_raw(), SeqCst);
    if old >= 0 {
        // SAFETY: closing a connection we no longer use.
        unsafe { libc::close(old) };
    }
    LINK.store(UP, SeqCst);
    LOST_WARNED.store(false, SeqCst);
    if let Some(g) = GATE.get() {
        (g.ledger_changed)();
    }
    info!(
        "reconnected to the fgpu agent at {} (cgroup {})",
        cfg.socket, reply.cgroup
    );
}

/// In a fork child (async-signal-safe): no reconnect is in progress here. The connection is
/// shared with the parent; either notices the agent going away.
pub fn after_fork_child() {
    BUSY.store(false, SeqCst);
    LAST_CHECK_MS.store(0, SeqCst);
}
