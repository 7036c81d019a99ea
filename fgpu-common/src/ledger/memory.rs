//! Memory accounting on the ledger: reservation against the limit, charges, releases, and
//! taking back what dead processes held.
//!
//! Ordering of the two counters is chosen so that a process killed between two steps can
//! only ever leave the device counter too *high* (a few bytes of one in-flight allocation
//! stay charged), never too low: reserve = device first, then slot; release = slot first,
//! then device; reclaim of a dead slot = swap the slot to zero, then subtract.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use super::{Ledger, MAX_DEVICES};

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    /// Bytes in use on the device when the reservation was refused.
    pub used: u64,
    /// The limit it was checked against.
    pub limit: u64,
}

fn sub_saturating(a: &AtomicU64, n: u64) -> u64 {
    // The closure always returns Some, so this never fails; the previous value comes back.
    match a.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(n))) {
        Ok(prev) | Err(prev) => prev,
    }
}

impl Ledger {
    /// The limit stored in the ledger for `dev` ([`NO_LIMIT`] if none).
    pub fn limit(&self, dev: usize) -> u64 {
        self.limits.devices[dev].memory_limit.load(SeqCst)
    }

    /// Bytes charged on `dev` by all processes.
    pub fn used(&self, dev: usize) -> u64 {
        self.usage.devices[dev].used.load(SeqCst)
    }

    /// Reserves `bytes` on `dev` for `slot` if that keeps the device at or below `limit`.
    /// Returns the new usage.
    pub fn try_reserve(
        &self,
        dev: usize,
        slot: usize,
        bytes: u64,
        limit: u64,
    ) -> Result<u64, Denied> {
        let d = &self.usage.devices[dev];
        let mut used = d.used.load(SeqCst);
        loop {
            let next = match used.checked_add(bytes) {
                Some(n) if n <= limit => n,
                _ => return Err(Denied { used, limit }),
            };
            match d.used.compare_exchange_weak(used, next, SeqCst, SeqCst) {
                Ok(_) => {
                    self.slots[slot].used[dev].fetch_add(bytes, SeqCst);
                    d.peak.fetch_max(next, SeqCst);
                    return Ok(next);
                }
                Err(now) => used = now,
            }
        }
    }

    /// Charges `bytes` whatever the limit (memory the driver already handed out, such as a
    /// context's overhead).
    pub fn charge(&self, dev: usize, slot: usize, bytes: u64) {
        let d = &self.usage.devices[dev];
        let next = d.used.fetch_add(bytes, SeqCst).saturating_add(bytes);
        self.slots[slot].used[dev].fetch_add(bytes, SeqCst);
        d.peak.fetch_max(next, SeqCst);
    }

    /// Gives back `bytes` of `slot` on `dev` (never more than the slot holds).
    pub fn release(&self, dev: usize, slot: usize, bytes: u64) {
        let prev = sub_saturating(&self.slots[slot].used[dev], bytes);
        sub_saturating(&self.usage.devices[dev].used, bytes.min(prev));
    }

    /// Counts a refused allocation.
    pub fn count_denied(&self, dev: usize, slot: Option<usize>) {
        self.usage.devices[dev].alloc_denied.fetch_add(1, SeqCst);
        if let Some(s) = slot {
            self.slots[s].alloc_denied.fetch_add(1, SeqCst);
        }
    }

    /// Whether `slot` holds any bytes.
    pub fn slot_in_use(&self, slot: usize) -> bool {
        self.slots[slot].used.iter().any(|u| u.load(SeqCst) != 0)
    }

    /// Takes back the bytes `slot` holds (its owner is gone; the caller holds the slot's
    /// lock). Returns the bytes given back. [`Ledger::reclaim`] also clears its compute state.
    pub fn reclaim_bytes(&self, slot: usize) -> u64 {
        let s = &self.slots[slot];
        let mut total = 0u64;
        for dev in 0..MAX_DEVICES {
            let n = s.used[dev].swap(0, SeqCst);
            s.overhead[dev].store(0, SeqCst);
            if n != 0 {
                sub_saturating(&self.usage.devices[dev].used, n);
                total = total.saturating_add(n);
            }
        }
        total
    }

    /// Gives back everything `slot` holds on one device (its context there was destroyed).
    pub fn release_device(&self, dev: usize, slot: usize) -> u64 {
        let s = &self.slots[slot];
        let n = s.used[dev].swap(0, SeqCst);
        s.overhead[dev].store(0, SeqCst);
        sub_saturating(&self.usage.devices[dev].used, n);
        n
    }
}
