//! The container's shared ledger file (layout in `fgpu_common::ledger`): opening it, this
//! process's slot, and taking back dead processes' bytes.
//!
//! - Path: `$FGPU_LEDGER`, default `/dev/shm/fgpu-ledger-<uid>` (a container's /dev/shm is
//!   its own). Created race-free: built under a temporary name, `link(2)`ed into place; a
//!   loser of the race opens the winner's file. No global lock, at start-up or ever.
//! - Slot: the process takes an OFD write lock (`F_OFD_SETLK`) on byte `LOCK_BASE + slot` and
//!   keeps it for its whole life. The kernel drops it when the process dies, however it dies;
//!   nothing here can be left locked by a SIGKILLed process. OFD locks belong to the open file
//!   description, not the pid, so this works across PID namespaces.
//! - Reclaim: a slot whose lock can be taken (`F_OFD_SETLK` succeeds) belongs to nobody; its
//!   bytes are swapped out and subtracted from the device totals, then the lock is dropped.
//!   Done when claiming a slot, before denying an allocation, and on memory-info queries.
//! - Fork: the child gets its own open file description (a fresh `open` of
//!   `/proc/self/fd/N`) and drops the inherited one at once, so that a parent's slot dies with
//!   the parent; it claims its own slot at its next use of the ledger.
//! - If the file cannot be used (no /dev/shm, a foreign file) the process falls back to a
//!   private ledger in a memfd (limits then hold per process and fork tree) with one error.

use crate::config;
use crate::log::{debug, error, info};
use fgpu_common::ledger::{LEDGER_SIZE, LOCK_BASE, Ledger, MAX_SLOTS};
use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU64, AtomicUsize, Ordering::SeqCst};

const CLOSED: u8 = 0;
const OPENING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;
const NEEDS_SLOT: u8 = 4;
const NO_SLOT: usize = usize::MAX;

static STATE: AtomicU8 = AtomicU8::new(CLOSED);
static MAP: AtomicUsize = AtomicUsize::new(0);
static FD: AtomicI32 = AtomicI32::new(-1);
static SLOT: AtomicUsize = AtomicUsize::new(NO_SLOT);

/// The ledger and this process's slot, opening/claiming on first use. None if no ledger can
/// be had at all (accounting is then off, with an error logged once).
pub fn get() -> Option<(&'static Ledger, usize)> {
    loop {
        match STATE.load(SeqCst) {
            READY => {
                let map = MAP.load(SeqCst) as *const Ledger;
                // SAFETY: MAP holds a live MAP_SHARED mapping of LEDGER_SIZE bytes, validated
                // when opened and never unmapped; Ledger is all atomics.
                return Some((unsafe { &*map }, SLOT.load(SeqCst)));
            }
            FAILED => return None,
            CLOSED => {
                if STATE
                    .compare_exchange(CLOSED, OPENING, SeqCst, SeqCst)
                    .is_ok()
                {
                    let next = if open() { READY } else { FAILED };
                    STATE.store(next, SeqCst);
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

fn ledger() -> &'static Ledger {
    // SAFETY: only called once MAP holds a validated mapping (see `get`).
    unsafe { &*(MAP.load(SeqCst) as *const Ledger) }
}

fn lock(fd: i32, slot: usize, kind: i32) -> bool {
    // SAFETY: flock is plain data; all-zero is valid (and l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = LOCK_BASE + slot as i64;
    fl.l_len = 1;
    // SAFETY: fcntl on our descriptor with a valid flock.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl) == 0 }
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
    let mut ts: libc::timespec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let Ok(tmp) = CString::new(format!("{path}.tmp.{pid}.{}", ts.tv_nsec)) else {
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

fn open() -> bool {
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
                    return false;
                }
            }
        }
    };
    FD.store(fd, SeqCst);
    MAP.store(p, SeqCst);
    claim(fd)
}

fn claim(fd: i32) -> bool {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let start = pid as usize % MAX_SLOTS;
    for k in 0..MAX_SLOTS {
        let i = (start + k) % MAX_SLOTS;
        if lock(fd, i, libc::F_WRLCK) {
            let reclaimed = ledger().claim(i, pid);
            SLOT.store(i, SeqCst);
            debug!("pid {pid} claimed ledger slot {i} (reclaimed {reclaimed} bytes)");
            return true;
        }
    }
    error!("all {MAX_SLOTS} ledger slots are taken: memory limits are not enforced here");
    false
}

fn reopen_in_child() -> bool {
    let mut fd = FD.load(SeqCst);
    if fd < 0 {
        let cfg = config::get();
        match open_shared(&cfg.ledger_path, 0o600) {
            Ok((f, p)) => {
                // The inherited mapping is of the same file; keep using it.
                // SAFETY: unmapping the second mapping we just made.
                unsafe { libc::munmap(p as *mut libc::c_void, LEDGER_SIZE) };
                fd = f;
                FD.store(fd, SeqCst);
            }
            Err(e) => {
                error!("fork child: ledger {} unusable ({e})", cfg.ledger_path);
                return false;
            }
        }
    }
    claim(fd)
}

/// Takes back the bytes of slots whose owners are gone. Returns how many bytes came back.
pub fn sweep() -> u64 {
    let Some((l, own)) = get() else {
        return 0;
    };
    let fd = FD.load(SeqCst);
    let mut total = 0u64;
    for i in (0..MAX_SLOTS).filter(|&i| i != own && l.slot_in_use(i)) {
        if lock(fd, i, libc::F_WRLCK) {
            let n = l.reclaim(i);
            lock(fd, i, libc::F_UNLCK);
            if n != 0 {
                let pid = l.slots[i].pid.load(SeqCst);
                info!("took back {n} bytes from exited process {pid} (ledger slot {i})");
                total = total.saturating_add(n);
            }
        }
    }
    total
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

/// [`sweep`], at most every 100 ms (memory-info queries).
pub fn sweep_if_due() {
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

/// In a fork child (async-signal-safe calls only): get an open file description of our own
/// and drop the parent's, forget the parent's slot.
pub fn after_fork_child() {
    SLOT.store(NO_SLOT, SeqCst);
    LAST_SWEEP_MS.store(0, SeqCst);
    let fd = FD.load(SeqCst);
    if fd >= 0 {
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
        let new = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
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
