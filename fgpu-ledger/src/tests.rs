use std::os::fd::AsRawFd;

use fgpu_common::ledger::{PAGE, USAGE_SIZE};

use super::*;

#[test]
fn a_fresh_usage_memfd_cannot_be_resized_or_resealed() {
    let fd = create_usage(7).unwrap();
    let raw = fd.as_raw_fd();
    assert_eq!(check_usage(raw), Ok(()));
    // SAFETY: ftruncate / fcntl on our own descriptor; both must be refused.
    unsafe {
        assert_ne!(libc::ftruncate(raw, 4096), 0, "shrinking must be refused");
        assert_ne!(
            libc::ftruncate(raw, (USAGE_SIZE * 2) as i64),
            0,
            "growing too"
        );
        assert_ne!(libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_WRITE), 0);
    }
    assert_eq!(file_len(raw), Ok(USAGE_SIZE as i64));
}

#[test]
fn an_unsealed_or_resized_memfd_is_not_adopted() {
    // SAFETY: a fresh memfd we own.
    let raw = unsafe { libc::memfd_create(c"fgpu-usage".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    // SAFETY: sizing our own memfd.
    assert_eq!(unsafe { libc::ftruncate(raw, USAGE_SIZE as i64) }, 0);
    assert!(
        matches!(check_usage(raw), Err(Error::Seals { .. })),
        "no seals"
    );
    // Sealed, but at the wrong size.
    // SAFETY: as above.
    unsafe {
        libc::ftruncate(raw, PAGE as i64);
        libc::fcntl(raw, libc::F_ADD_SEALS, USAGE_SEALS);
    }
    assert!(matches!(check_usage(raw), Err(Error::Size { .. })));
    // A write-sealed one (nobody could write it).
    // SAFETY: a second fresh memfd of ours.
    let w = unsafe { libc::memfd_create(c"fgpu-usage".as_ptr(), libc::MFD_ALLOW_SEALING) };
    // SAFETY: as above.
    unsafe {
        libc::ftruncate(w, USAGE_SIZE as i64);
        libc::fcntl(
            w,
            libc::F_ADD_SEALS,
            USAGE_SEALS | libc::F_SEAL_FUTURE_WRITE,
        );
    }
    assert!(matches!(check_usage(w), Err(Error::Seals { .. })));
    // A plain file is no memfd.
    let f = std::fs::File::open("/proc/self/status").unwrap();
    assert!(check_usage(f.as_raw_fd()).is_err());
    // SAFETY: closing our descriptors.
    unsafe {
        libc::close(raw);
        libc::close(w);
    }
}

#[test]
fn shims_map_the_limits_page_read_only() {
    let limits = create_limits().unwrap();
    let usage = create_usage(7).unwrap();
    let agent = map_agent(limits.as_raw_fd(), usage.as_raw_fd()).unwrap();
    agent.ledger().init();
    seal_limits(limits.as_raw_fd()).unwrap();
    assert_eq!(check_limits(limits.as_raw_fd()), Ok(()));
    let base = map_shim(limits.as_raw_fd(), usage.as_raw_fd()).unwrap();
    // SAFETY: a validated shim mapping of a whole ledger.
    let shim = unsafe { &*(base as *const fgpu_common::ledger::Ledger) };
    agent.ledger().limits.devices[0]
        .memory_limit
        .store(42, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(shim.limit(0), 42, "the shim sees the agent's writes");
    // The shim's view of the limits page is read-only: mprotect to writable is refused
    // (the memfd is sealed against new writable mappings).
    // SAFETY: asking for write access to our own mapping; must fail.
    let rc = unsafe {
        libc::mprotect(
            base as *mut libc::c_void,
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_ne!(rc, 0, "the limits page must not become writable");
    // A writable mapping of the limits page is refused too.
    assert!(map_agent(limits.as_raw_fd(), usage.as_raw_fd()).is_err());
    unmap_shim(base);
}

#[test]
fn slots_are_claimed_once_and_reclaimed_after_their_owner() {
    let limits = create_limits().unwrap();
    let usage = create_usage(7).unwrap();
    let m = map_agent(limits.as_raw_fd(), usage.as_raw_fd()).unwrap();
    let l = m.ledger();
    l.init();
    // Two descriptions of the same memfd: one per "process".
    let path = format!("/proc/self/fd/{}", usage.as_raw_fd());
    let a = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let b = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let (sa, _) = claim_slot(l, a.as_raw_fd(), 7).unwrap();
    let (sb, _) = claim_slot(l, b.as_raw_fd(), 7).unwrap();
    assert_ne!(sa, sb, "a held slot is not handed out twice");
    l.try_reserve(0, sa, 1000, u64::MAX).unwrap();
    l.slot_compute(sa, 0).wait_stamp(5);
    assert!(!slot_free(b.as_raw_fd(), sa));
    assert_eq!(
        reclaim_dead(l, b.as_raw_fd(), Some(sb), |_, _| {}),
        0,
        "a lives"
    );
    drop(a); // its owner is gone: the lock goes with its description
    let mut seen = Vec::new();
    assert_eq!(
        reclaim_dead(l, b.as_raw_fd(), Some(sb), |s, n| seen.push((s, n))),
        1000
    );
    assert_eq!(seen, vec![(sa, 1000)]);
    assert_eq!(l.used(0), 0);
    assert!(!l.slot_compute_in_use(sa), "its compute state goes too");
}

#[test]
fn usage_memfds_are_tagged_with_their_cgroup() {
    let fd = create_usage(4242).unwrap();
    assert_eq!(usage_tag_of(fd.as_raw_fd()), Some(Some(4242)));
    assert_eq!(usage_tag("/memfd:fgpu-usage:17 (deleted)"), Some(Some(17)));
    assert_eq!(
        usage_tag("/memfd:fgpu-usage (deleted)"),
        Some(None),
        "untagged"
    );
    assert_eq!(
        usage_tag("/memfd:fgpu-usage:x17 (deleted)"),
        Some(None),
        "malformed"
    );
    assert_eq!(
        usage_tag("/memfd:fgpu-usage: (deleted)"),
        Some(None),
        "empty tag"
    );
    assert_eq!(
        usage_tag("/memfd:fgpu-usagex (deleted)"),
        None,
        "another name"
    );
    assert_eq!(usage_tag("/memfd:fgpu-limits (deleted)"), None);
    assert_eq!(usage_tag("/dev/null"), None);
}

#[test]
fn a_held_slot_lock_is_seen_in_one_query_and_reclaim_goes_a_bounded_stretch_at_a_time() {
    let limits = create_limits().unwrap();
    let usage = create_usage(8).unwrap();
    let m = map_agent(limits.as_raw_fd(), usage.as_raw_fd()).unwrap();
    let l = m.ledger();
    l.init();
    let path = format!("/proc/self/fd/{}", usage.as_raw_fd());
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap()
    };
    let agent = open();
    assert!(!any_slot_locked(agent.as_raw_fd()), "nobody holds a slot");
    let shim = open();
    let (s, _) = claim_slot(l, shim.as_raw_fd(), 900).unwrap();
    assert!(any_slot_locked(agent.as_raw_fd()));
    l.try_reserve(0, s, 64, u64::MAX).unwrap();
    drop(shim);
    assert!(!any_slot_locked(agent.as_raw_fd()), "its lock went with it");
    // Slot 900 is past the first stretch of 512: nothing back yet, and where to go on.
    let (back, next) = reclaim_dead_in(l, agent.as_raw_fd(), None, 0, 512, |_, _| {});
    assert_eq!((back, next), (0, Some(512)));
    let (back, next) = reclaim_dead_in(l, agent.as_raw_fd(), None, 512, 512, |_, _| {});
    assert_eq!((back, next), (64, None));
    assert_eq!(l.used(0), 0);
}
