//! The container's shared ledger (layout in `fgpu_common::ledger`): where it comes from, this
//! process's slot in it, and taking back dead processes' bytes.
//!
//! - Source, decided at the first need of the ledger ([`get`]):
//!   1. the fgpu agent's ledger for the process's cgroup ([`crate::agent_link`]): limits
//!      read-only, usage shared read-write;
//!   2. no agent, and an environment limit: the standalone file `$FGPU_LEDGER`, default
//!      `/dev/shm/fgpu-ledger-<uid>` (a container's /dev/shm is its own), with one warning.
//!      Created race-free: built under a temporary name, `link(2)`ed into place; a loser of
//!      the race opens the winner's file. No global lock, at start-up or ever;
//!   3. no agent, `FGPU_AGENT=required`: a private ledger whose limits are 0 (every
//!      allocation is denied) until the agent answers;
//!   4. no agent, no environment limit: none; the shim stays inert.
//! - Slot: the process takes an OFD write lock (`F_OFD_SETLK`) on byte `LOCK_BASE + slot` of
//!   its own open file description of the ledger (the agent's usage memfd is reopened through
//!   `/proc/self/fd`: the description that came over the socket is shared by every shim) and
//!   keeps it for its whole life. The kernel drops it when the process dies, however it dies;
//!   nothing here can be left locked by a SIGKILLed process. OFD locks belong to the open file
//!   description, not the pid, so this works across PID namespaces.
//! - Reclaim: a slot whose lock can be taken (`F_OFD_SETLK` succeeds) belongs to nobody; its
//!   bytes are swapped out and subtracted from the device totals, then the lock is dropped.
//!   Done when claiming a slot, before denying an allocation, and on memory-info queries.
//! - The ledger in use and the slot form one immutable [`View`] behind one pointer, so that a
//!   reader never pairs a ledger with a slot of another; when the agent hands over a different
//!   ledger after a restart ([`migrate`]) a new view replaces the old one, whose mapping stays
//!   (threads may still hold references into it).
//! - Fork: the child gets its own open file description (a fresh `open` of
//!   `/proc/self/fd/N`) and drops the inherited one at once, so that a parent's slot dies with
//!   the parent; it claims its own slot at its next use of the ledger.
//! - If the file cannot be used (no /dev/shm, a foreign file) the process falls back to a
//!   private ledger in a memfd (limits then hold per process and fork tree) with one error.

use crate::agent_link::{self, HelloError};
use crate::config;
use crate::log::{debug, error, info, warning};
use fgpu_common::ledger::{LEDGER_SIZE, Ledger, MAX_DEVICES, MAX_SLOTS};
use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering::SeqCst};

const CLOSED: u8 = 0;
const OPENING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;
const NEEDS_SLOT: u8 = 4;
/// Neither an agent nor an environment limit: nothing to enforce.
const INERT: u8 = 5;

/// Where the ledger in use came from.
const SRC_FILE: u8 = 0;
const SRC_AGENT: u8 = 1;
/// `FGPU_AGENT=required` without an agent: a private ledger with limits of 0.
const SRC_DENY: u8 = 2;

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

fn ledger_at(map: usize) -> &'static Ledger {
    // SAFETY: only called with validated mappings of LEDGER_SIZE bytes that are never
    // unmapped.
    unsafe { &*(map as *const Ledger) }
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

fn map(fd: i32) -> Option<usize> {
    // SAFETY: mapping LEDGER_SIZE bytes of a file at least that large, shared.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEDGER_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

fn file_size(fd: i32) -> i64 {
    // SAFETY: stat is plain data; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return -1;
    }
    st.st_size
}

/// Creates a complete ledger under a temporary name and links it into place.
fn create(path: &str, mode: libc::mode_t) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let nonce = fgpu_common::clock::mono_ns() % 1_000_000_000;
    let Ok(tmp) = CString::new(format!("{path}.tmp.{pid}.{nonce}")) else {
        return;
    };
    let Ok(cpath) = CString::new(path) else {
        return;
    };
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
    // SAFETY: valid path.
    let fd = unsafe { libc::open(tmp.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return;
    }
    // SAFETY: our fresh descriptor.
    let sized = unsafe {
        libc::fchmod(fd, mode) == 0 && libc::ftruncate(fd, LEDGER_SIZE as libc::off_t) == 0
    };
    if sized && let Some(p) = map(fd) {
        // SAFETY: a fresh, zero-filled mapping of a whole Ledger.
        unsafe { &*(p as *const Ledger) }.init();
        // SAFETY: unmapping what we mapped; linking our complete file into place (fails
        // harmlessly with EEXIST if another process won the race).
        unsafe {
            libc::munmap(p as *mut libc::c_void, LEDGER_SIZE);
            libc::link(tmp.as_ptr(), cpath.as_ptr());
        }
    }
    // SAFETY: removing our temporary name and closing our descriptor.
    unsafe {
        libc::unlink(tmp.as_ptr());
        libc::close(fd);
    }
}

/// Opens (creating if needed) and maps the shared file; returns the descriptor and mapping.
fn open_shared(path: &str, mode: libc::mode_t) -> Result<(i32, usize), String> {
    let cpath = CString::new(path).map_err(|_| "path contains a NUL byte".to_string())?;
    for _ in 0..100 {
        // SAFETY: valid path.
        let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ENOENT) {
                return Err(err.to_string());
            }
            create(path, mode);
            continue;
        }
        let size = file_size(fd);
        let mapped = if size >= LEDGER_SIZE as i64 {
            map(fd)
        } else {
            None
        };
        let Some(p) = mapped else {
            // SAFETY: closing the descriptor we opened.
            unsafe { libc::close(fd) };
            return Err(format!(
                "size {size}, expected {LEDGER_SIZE} (a ledger of another version?)"
            ));
        };
        // SAFETY: a mapping of LEDGER_SIZE bytes.
        if let Err(e) = unsafe { &*(p as *const Ledger) }.validate() {
            // SAFETY: undoing our mapping and descriptor.
            unsafe {
                libc::munmap(p as *mut libc::c_void, LEDGER_SIZE);
                libc::close(fd);
            }
            return Err(e.to_string());
        }
        return Ok((fd, p));
    }
    Err("could not create it".into())
}

/// A ledger only this process (and its fork children) see.
fn open_private() -> Option<(i32, usize)> {
    // SAFETY: valid name; a fresh anonymous file.
    let fd = unsafe { libc::memfd_create(c"fgpu-ledger".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: our fresh descriptor.
    if unsafe { libc::ftruncate(fd, LEDGER_SIZE as libc::off_t) } != 0 {
        // SAFETY: closing it.
        unsafe { libc::close(fd) };
        return None;
    }
    let p = map(fd)?;
    // SAFETY: fresh zero-filled mapping of a whole Ledger.
    unsafe { &*(p as *const Ledger) }.init();
    Some((fd, p))
}

fn open() -> u8 {
    let cfg = config::get();
    let err = match agent_link::first_contact() {
        Ok((map, fd, cgroup)) => {
            SOURCE.store(SRC_AGENT, SeqCst);
            info!(
                "ledger of cgroup {cgroup} from the fgpu agent at {}",
                cfg.socket
            );
            return if install(map, fd) { READY } else { FAILED };
        }
        Err(e) => e,
    };
    let sock = &cfg.socket;
    if cfg.agent_required {
        error!(
            "FGPU_AGENT=required, but {err} at {sock}: every GPU allocation is denied until it \
             answers"
        );
        let Some((fd, p)) = open_private() else {
            error!("no ledger at all: memory limits are not enforced");
            return FAILED;
        };
        for d in &ledger_at(p).limits.devices {
            d.memory_limit.store(0, SeqCst);
        }
        SOURCE.store(SRC_DENY, SeqCst);
        agent_link::want_reconnect();
        return if install(p, fd) { READY } else { FAILED };
    }
    if cfg.env_limited {
        let vars = cfg.env_vars();
        match err {
            HelloError::NoAgent(_) => warning!("no fgpu agent at {sock}: enforcing {vars} only"),
            other => warning!("{other} (at {sock}): enforcing {vars} only"),
        }
        return open_standalone();
    }
    match err {
        HelloError::NoAgent(e) => {
            info!("no fgpu agent at {sock} ({e}) and no limit in the environment: nothing enforced")
        }
        other => warning!("{other} (at {sock}): no GPU memory limit is enforced"),
    }
    INERT
}

fn open_standalone() -> u8 {
    let cfg = config::get();
    let mode = if cfg.ledger_explicit { 0o666 } else { 0o600 };
    let (fd, p) = match open_shared(&cfg.ledger_path, mode) {
        Ok(x) => x,
        Err(e) => {
            error!(
                "ledger {} unusable ({e}): limits hold per process only",
                cfg.ledger_path
            );
            match open_private() {
                Some(x) => x,
                None => {
                    error!("no ledger at all: memory limits are not enforced");
                    return FAILED;
                }
            }
        }
    };
    SOURCE.store(SRC_FILE, SeqCst);
    if install(p, fd) { READY } else { FAILED }
}

fn claim(l: &Ledger, fd: i32) -> Option<usize> {
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
        match open_shared(&cfg.ledger_path, 0o600) {
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

fn sub_saturating(a: &std::sync::atomic::AtomicU64, n: u64) {
    let _ = a.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(n)));
}

/// Moves this process over to another ledger (the agent restarted and has a usage memfd of
/// its own for the cgroup): binds the same device records, claims a slot through `fd`,
/// force-charges what this process holds (even over the limit: the memory is in use), then
/// publishes the new view and takes the charges out of the old ledger. Operations that were
/// already in flight on the old ledger are settled once more after the switch; one that
/// lands on the old ledger after that stays there (the old ledger's count is too high, ours
/// too low by that allocation until it is freed). Returns false (nothing changed, the
/// mapping at `map` unused) if the two ledgers bind devices differently.
pub fn migrate(map: usize, fd: i32) -> bool {
    let Some(old_view) = view() else {
        return false;
    };
    let old = old_view.ledger();
    let new = ledger_at(map);
    for d in 0..MAX_DEVICES {
        let k = old.usage.devices[d].key.load(SeqCst);
        if k == 0 {
            continue;
        }
        let nd = &new.usage.devices[d];
        match nd.key.compare_exchange(0, k, SeqCst, SeqCst) {
            Ok(_) => {
                nd.uuid[0].store(old.usage.devices[d].uuid[0].load(SeqCst), SeqCst);
                nd.uuid[1].store(old.usage.devices[d].uuid[1].load(SeqCst), SeqCst);
            }
            Err(now) if now == k => {}
            Err(_) => {
                error!(
                    "the fgpu agent's new ledger binds device record {d} to another GPU: \
                     staying on the previous ledger (its limits as they were)"
                );
                return false;
            }
        }
    }
    let Some(slot) = claim(new, fd) else {
        return false;
    };
    let s = &old.slots[old_view.slot];
    let mut moved = [0u64; MAX_DEVICES];
    for (d, m) in moved.iter_mut().enumerate() {
        let n = s.used[d].load(SeqCst);
        if n != 0 {
            new.charge(d, slot, n);
            new.slots[slot].overhead[d].store(s.overhead[d].load(SeqCst), SeqCst);
        }
        *m = n;
    }
    MAP.store(map, SeqCst);
    FD.store(fd, SeqCst);
    SOURCE.store(SRC_AGENT, SeqCst);
    CUR.store(Box::leak(Box::new(View { map, slot, fd })), SeqCst);
    let mut total = 0u64;
    for (d, &m) in moved.iter().enumerate() {
        let n = s.used[d].swap(0, SeqCst);
        s.overhead[d].store(0, SeqCst);
        sub_saturating(&old.usage.devices[d].used, n);
        if n > m {
            new.charge(d, slot, n - m);
        } else if n < m {
            new.release(d, slot, m - n);
        }
        total = total.saturating_add(n);
    }
    // The old slot is empty: let it go (the descriptor stays open: a concurrent sweep may
    // still be using it).
    fgpu_ledger::unlock_slot(old_view.fd, old_view.slot);
    info!("moved {total} bytes of this process's charges to the fgpu agent's ledger (slot {slot})");
    true
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

/// Monotonic milliseconds (coarse clock: a few ns to read).
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

static LAST_SWEEP_MS: AtomicU64 = AtomicU64::new(0);

/// [`sweep`], at most every 100 ms (memory-info queries); also the agent link's check.
pub fn sweep_if_due() {
    agent_link::tick();
    let now = now_ms();
    let last = LAST_SWEEP_MS.load(SeqCst);
    if now.saturating_sub(last) >= 100
        && LAST_SWEEP_MS
            .compare_exchange(last, now, SeqCst, SeqCst)
            .is_ok()
    {
        sweep();
    }
}

/// A new open file description of what `fd` refers to (`open("/proc/self/fd/N")`), or -1.
/// Async-signal-safe (used in fork children): no allocation.
pub fn reopen_own(fd: i32) -> i32 {
    if fd < 0 {
        return -1;
    }
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 11];
    let (mut n, mut len) = (fd as u32, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for k in 0..len {
        path[14 + k] = digits[len - 1 - k];
    }
    // SAFETY: a NUL-terminated path in a local buffer (zeros after the digits).
    unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) }
}

/// In a fork child (async-signal-safe calls only): get an open file description of our own
/// and drop the parent's, forget the parent's slot.
pub fn after_fork_child() {
    LAST_SWEEP_MS.store(0, SeqCst);
    agent_link::after_fork_child();
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
