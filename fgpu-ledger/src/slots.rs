//! Per-process slots: a process owns slot `i` for as long as it holds an OFD write lock on
//! byte `LOCK_BASE + i` of its own open file description of the usage memfd (or standalone
//! file). The kernel drops the lock when the process dies, however it dies; OFD locks belong
//! to the description, not the pid, so this works across PID namespaces.

use std::os::fd::RawFd;

use fgpu_common::ledger::{LOCK_BASE, Ledger, MAX_SLOTS};

fn setlk(fd: RawFd, slot: usize, kind: i32) -> bool {
    // SAFETY: flock is plain data; all-zero is valid (and l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = LOCK_BASE + slot as i64;
    fl.l_len = 1;
    // SAFETY: fcntl on the caller's descriptor with a valid flock; never blocks.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl) == 0 }
}

/// Takes slot `slot`'s lock through `fd`; false if another description holds it.
pub fn lock_slot(fd: RawFd, slot: usize) -> bool {
    setlk(fd, slot, libc::F_WRLCK)
}

/// Drops slot `slot`'s lock held through `fd`.
pub fn unlock_slot(fd: RawFd, slot: usize) {
    setlk(fd, slot, libc::F_UNLCK);
}

/// Whether nobody holds slot `slot` (tested without taking it; `fd` must be a description
/// that holds no slot lock itself).
pub fn slot_free(fd: RawFd, slot: usize) -> bool {
    // SAFETY: flock is plain data; all-zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = LOCK_BASE + slot as i64;
    fl.l_len = 1;
    // SAFETY: F_OFD_GETLK only reports a conflicting lock into `fl`.
    let ok = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) == 0 };
    ok && fl.l_type == libc::F_UNLCK as i16
}

/// Claims a free slot for process `pid` through `fd` (searching from `pid % MAX_SLOTS`):
/// takes its lock and reclaims what a dead predecessor left. Returns (slot, bytes reclaimed).
pub fn claim_slot(ledger: &Ledger, fd: RawFd, pid: u32) -> Option<(usize, u64)> {
    let start = pid as usize % MAX_SLOTS;
    (0..MAX_SLOTS)
        .map(|k| (start + k) % MAX_SLOTS)
        .find(|&i| lock_slot(fd, i))
        .map(|i| (i, ledger.claim(i, pid)))
}

/// Whether any description other than `fd`'s holds a slot lock: one `F_OFD_GETLK` over the
/// whole slot range, whatever the number of slots or of locks. `fd` must be a description
/// that holds no slot lock itself (the agent's).
pub fn any_slot_locked(fd: RawFd) -> bool {
    // SAFETY: flock is plain data; all-zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = LOCK_BASE;
    fl.l_len = MAX_SLOTS as i64;
    // SAFETY: F_OFD_GETLK only reports a conflicting lock into `fl`.
    let ok = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) == 0 };
    // A failed query is taken as "locked": nothing is dropped on a guess.
    !ok || fl.l_type != libc::F_UNLCK as i16
}

/// Takes back what every dead process left (slots below the high-water mark whose lock can
/// be taken through `fd`, except `skip`): bytes and compute state. Calls `on_reclaim(slot,
/// bytes)` for each slot that held bytes; returns the bytes given back.
pub fn reclaim_dead(
    ledger: &Ledger,
    fd: RawFd,
    skip: Option<usize>,
    on_reclaim: impl FnMut(usize, u64),
) -> u64 {
    reclaim_dead_in(ledger, fd, skip, 0, MAX_SLOTS, on_reclaim).0
}

/// [`reclaim_dead`] over at most `max` slots from slot `from` on (a caller with many
/// ledgers bounds its work per pass and comes back). Returns the bytes given back and the
/// slot to go on from, `None` once the slots in range are done.
pub fn reclaim_dead_in(
    ledger: &Ledger,
    fd: RawFd,
    skip: Option<usize>,
    from: usize,
    max: usize,
    mut on_reclaim: impl FnMut(usize, u64),
) -> (u64, Option<usize>) {
    let mut total = 0u64;
    let end = ledger.slots_in_range();
    let stop = from.saturating_add(max).min(end);
    for slot in from..stop {
        if Some(slot) == skip || !(ledger.slot_in_use(slot) || ledger.slot_compute_in_use(slot)) {
            continue;
        }
        // Taking the slot's lock ourselves proves its owner is gone, and keeps a new owner
        // out while we reclaim.
        if lock_slot(fd, slot) {
            let n = ledger.reclaim(slot);
            unlock_slot(fd, slot);
            if n != 0 {
                on_reclaim(slot, n);
                total = total.saturating_add(n);
            }
        }
    }
    (total, (stop < end).then_some(stop))
}
