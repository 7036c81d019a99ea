use super::compute::Activity;
use super::compute::{TURN_CLOSED, TURN_CORUN, TURN_OPEN};
use super::*;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

fn ledger() -> Box<Ledger> {
    let layout = std::alloc::Layout::new::<Ledger>();
    // SAFETY: Ledger is made of atomics and integers only, for which all-zero is valid;
    // the pointer comes from the global allocator with Ledger's layout.
    let l = unsafe { Box::from_raw(std::alloc::alloc_zeroed(layout).cast::<Ledger>()) };
    l.init();
    l
}

#[test]
fn layout_is_page_split() {
    assert_eq!(USAGE_OFFSET, 4096);
    assert_eq!(SLOTS_OFFSET, 8192);
    let l = ledger();
    assert_eq!(l.validate(), Ok(()));
    assert_eq!(l.limit(0), NO_LIMIT);
    l.limits.magic.store(0, SeqCst);
    assert_eq!(l.validate(), Err(LayoutError::Magic(0)));
}

#[test]
fn devices_bind_by_uuid() {
    let l = ledger();
    let a = [1u8; 16];
    let mut b = [1u8; 16];
    b[15] = 2;
    assert_eq!(l.device_index(&a), Some(0));
    assert_eq!(l.device_index(&b), Some(1));
    assert_eq!(l.device_index(&a), Some(0));
    assert_eq!(l.device_uuid(1), b);
    assert_ne!(uuid_key(&[0; 16]), 0);
}

#[test]
fn reservation_stops_at_the_limit() {
    let l = ledger();
    assert_eq!(l.try_reserve(0, 3, 600, 1000), Ok(600));
    assert_eq!(l.try_reserve(0, 3, 400, 1000), Ok(1000));
    assert_eq!(
        l.try_reserve(0, 3, 1, 1000),
        Err(Denied {
            used: 1000,
            limit: 1000
        })
    );
    l.release(0, 3, 400);
    assert_eq!(l.used(0), 600);
    // Never more than the slot holds.
    l.release(0, 3, 10_000);
    assert_eq!(l.used(0), 0);
    assert_eq!(l.usage.devices[0].peak.load(SeqCst), 1000);
}

#[test]
fn dead_slots_are_reclaimed() {
    let l = ledger();
    l.try_reserve(0, 1, 100, NO_LIMIT).unwrap();
    l.try_reserve(1, 1, 50, NO_LIMIT).unwrap();
    l.charge(0, 2, 7);
    assert!(l.slot_in_use(1));
    assert_eq!(l.claim(1, 42), 150);
    assert!(!l.slot_in_use(1));
    assert_eq!(l.used(0), 7);
    assert_eq!(l.used(1), 0);
    assert_eq!(l.release_device(0, 2), 7);
    assert_eq!(l.used(0), 0);
}

#[test]
fn racing_threads_never_overshoot() {
    let l: Arc<Ledger> = Arc::from(ledger());
    let limit = 1000 * 64 + 63;
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let mut got = 0u64;
                while l.try_reserve(0, t, 64, limit).is_ok() {
                    got += 64;
                    assert!(l.used(0) <= limit);
                }
                got
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, 64_000);
    assert_eq!(l.used(0), 64_000);
}

#[test]
fn turns_start_closed_and_every_change_bumps_the_word() {
    let l = ledger();
    let t = l.turn(3);
    assert_eq!(t.state.load(SeqCst), TURN_CLOSED);
    assert!(!t.is_open());
    assert!(t.set(TURN_OPEN));
    assert!(t.is_open());
    assert_eq!(t.grant.load(SeqCst), 1);
    assert!(!t.set(TURN_OPEN), "no change, no grant");
    assert_eq!(t.grant.load(SeqCst), 1);
    assert!(t.set(TURN_CLOSED));
    assert_eq!(
        t.grant.load(SeqCst),
        2,
        "closing bumps it too (the watchers wake)"
    );
    assert!(t.set(TURN_CORUN));
    assert_eq!(t.grant.load(SeqCst), 3);
}

#[test]
fn activity_counts_fresh_stamps_only() {
    let l = ledger();
    l.claim(0, 10);
    l.claim(5, 11);
    l.claim(9, 12);
    l.slot_compute(0, 1).wait_stamp(100);
    l.slot_compute(5, 1).wait_stamp(80); // stopped long ago
    l.slot_compute(9, 1).wait_stamp(1 << 40); // from the future: forged
    l.slot_compute(5, 1).queued(3_000_000);
    l.slot_compute(0, 1).launched(99);
    let a = l.activity(1, 100, 10);
    assert_eq!(a.waiting, 1);
    assert_eq!(a.last_launch, 99);
    assert_eq!(a.inflight, 1);
    assert_eq!(a.queued_ns, 3_000_000);
    // Slot 0 launched a beat ago; slot 5 stopped long ago but its batch is still in flight;
    // slot 9 only waits (with a forged stamp).
    assert_eq!(a.active, 2);
    // Another device is untouched.
    assert_eq!(l.activity(2, 100, 10), Activity::default());
}

#[test]
fn activity_is_bounded_against_forged_values() {
    let l = ledger();
    l.claim(0, 1);
    l.usage.slots_hwm.store(u32::MAX, SeqCst);
    let c = l.slot_compute(0, 0);
    c.inflight.store(i64::MAX, SeqCst);
    c.queued_ns.store(i64::MAX, SeqCst);
    l.slot_compute(1, 0).inflight.store(-5, SeqCst);
    l.slot_compute(1, 0).launched(u64::MAX); // from the future: not fresh
    let a = l.activity(0, 10, 5);
    assert_eq!(
        a.active, 1,
        "one real slot; the forged stamp and count add nobody"
    );
    assert_eq!(a.inflight, 1 << 16);
    assert_eq!(a.queued_ns, 1_000_000_000);
    assert_eq!(l.slots_in_range(), MAX_SLOTS);
}

#[test]
fn reclaim_forgets_a_dead_processs_compute_state() {
    let l = ledger();
    l.claim(2, 7);
    let c = l.slot_compute(2, 4);
    c.wait_stamp(50);
    c.queued(1000);
    c.launched(50);
    l.claim(2, 8);
    assert_eq!(l.activity(4, 50, 10), Activity::default());
    assert_eq!(l.slots_in_range(), 3);
}

#[test]
fn forged_parked_figures_are_capped_and_never_overflow() {
    let l = ledger();
    l.claim(0, 100);
    l.claim(1, 101);
    let gpu = [7u8; 16];
    assert_eq!(l.device_index(&gpu), Some(0));
    // A record the container bound to a GPU that is not here.
    assert_eq!(l.device_index(&[9u8; 16]), Some(1));
    let sizes = |u: &[u8; 16]| (*u == gpu).then_some(140u64 << 30);
    // Two slots claim everything on every device.
    for s in [0, 1] {
        for d in 0..MAX_DEVICES {
            l.slots[s].park.parked[d].store(u64::MAX, SeqCst);
        }
    }
    // Not parkable: nothing counts (no such container is ever parked).
    assert_eq!(l.parked_total(sizes), 0);
    l.limits.park.park_after_ms.store(1000, SeqCst);
    // No limit: at most the real GPU's size; the record of no real GPU: nothing.
    assert_eq!(l.parked_total(sizes), 140 << 30);
    // A limit of 1 GiB: at most that.
    l.limits.devices[0].memory_limit.store(1 << 30, SeqCst);
    assert_eq!(l.parked_total(sizes), 1 << 30);
    // A slot's own figure: capped by the limit, never overflowing.
    assert_eq!(l.parked_bytes(0), (1 << 30) + 15 * park::PARKED_CLAIM_CAP);
    // Honest figures pass unchanged.
    for s in [0, 1] {
        for d in 0..MAX_DEVICES {
            l.slots[s].park.parked[d].store(0, SeqCst);
        }
    }
    l.slots[0].park.parked[0].store(300 << 20, SeqCst);
    l.slots[1].park.parked[0].store(200 << 20, SeqCst);
    assert_eq!(l.parked_total(sizes), 500 << 20);
    assert_eq!(l.parked_bytes(1), 200 << 20);
}
