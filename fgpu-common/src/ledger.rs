//! The per-container GPU-memory ledger: `#[repr(C)]` records of atomics that every process
//! of a container maps from one shared-memory file (standalone shim) or memfd (handed over by
//! the agent).
//!
//! Layout (all offsets fixed, checked at compile time):
//!
//! | offset | part | written by |
//! |---|---|---|
//! | 0 | [`Limits`]: magic, version, sizes, per-device limits (one page) | the creator / the agent; read-only to shims under an agent |
//! | 4096 | [`Usage`]: per-device identity, used bytes, peak, denials (one page) | every shim (atomics) |
//! | 8192 | [`Slot`] × [`MAX_SLOTS`]: one per live process | its owner |
//!
//! Limits live in their own page so that the agent can map that page read-only into the
//! container while usage stays writable for lock-free reservation.
//!
//! Reservation is a compare-and-swap on the device's `used` counter: it succeeds only if
//! `used + n <= limit`, *before* the driver is called, and is released if the driver call
//! fails. Each process also keeps its own share in its [`Slot`], so that when it dies (however
//! it dies) its bytes can be taken back from the device counter. Which process owns a slot is
//! not recorded here: the shim holds an OFD lock on byte [`LOCK_BASE`] + slot of the file for
//! its whole life, and anybody can test that lock. This module does no I/O; it only defines the
//! records and the arithmetic on them.
//!
//! Ordering of the two counters is chosen so that a process killed between two steps can
//! only ever leave the device counter too *high* (a few bytes of one in-flight allocation
//! stay charged), never too low: reserve = device first, then slot; release = slot first,
//! then device; reclaim of a dead slot = swap the slot to zero, then subtract.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::SeqCst};

/// "fgpuldg1", little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"fgpuldg1");
pub const VERSION: u32 = 2;
/// Devices per ledger (bound to device UUIDs on first use).
pub const MAX_DEVICES: usize = 16;
/// Processes per container at the same time.
pub const MAX_SLOTS: usize = 1024;
pub const PAGE: usize = 4096;
/// A limit field holding this value means "no limit".
pub const NO_LIMIT: u64 = u64::MAX;
/// Byte offset of slot 0's OFD lock in the ledger file (far beyond its end: locks do not need
/// the bytes to exist).
pub const LOCK_BASE: i64 = 1 << 40;

/// One device's limits. Written only by the ledger's creator or the agent.
#[repr(C)]
pub struct DeviceLimit {
    /// Bytes; [`NO_LIMIT`] when unlimited.
    pub memory_limit: AtomicU64,
    /// Guaranteed compute share in percent (0 = none set; 1-99 = gated by the agent's
    /// controller, docs/compute.md).
    pub compute_share: AtomicU32,
    /// Hard compute cap in percent (0 = none set; 1-99 = gated).
    pub compute_cap: AtomicU32,
}

/// Page 0: identification and limits.
#[repr(C, align(4096))]
pub struct Limits {
    /// [`MAGIC`], stored last when the ledger is initialised.
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub max_devices: AtomicU32,
    pub max_slots: AtomicU32,
    _pad: u32,
    /// `size_of::<Ledger>()`.
    pub layout_size: AtomicU64,
    /// Bumped by the writer after changing any limit.
    pub generation: AtomicU64,
    pub devices: [DeviceLimit; MAX_DEVICES],
}

/// One device's shared usage.
#[repr(C, align(64))]
pub struct DeviceUsage {
    /// [`uuid_key`] of the device this record is bound to; 0 while unbound.
    pub key: AtomicU64,
    /// The device UUID (16 bytes, little-endian halves), for display; valid once `key` is set.
    pub uuid: [AtomicU64; 2],
    /// Bytes charged by all processes of the container, context overhead included.
    pub used: AtomicU64,
    /// Highest `used` ever seen.
    pub peak: AtomicU64,
    /// Allocations refused because of the limit.
    pub alloc_denied: AtomicU64,
    /// Kernel-observed usage written by the agent (0 in standalone mode).
    pub kernel_used: AtomicU64,
    /// Launch budget of the compute gate in ns of GPU time: granted by the agent's
    /// controller (a turn on the device), charged by the shims; launches wait while negative.
    pub launch_budget: AtomicI64,
}

/// One device's compute-gate exchange between the shims and the agent's controller
/// (docs/compute.md, "Agent-driven mode").
#[repr(C, align(64))]
pub struct DeviceCompute {
    /// Threads of the container waiting for budget on this device (shims count themselves
    /// in and out around a wait): the container wants a turn.
    pub waiting: AtomicU32,
    /// Bumped by the agent after every grant; waiting shims sleep on it (a futex).
    pub grant: AtomicU32,
    /// GPU time measured by the container's shims on this device, ns (only grows).
    pub gpu_ns: AtomicU64,
    /// Bumped by the agent's controller on every tick while the device is gated: a shim
    /// that sees it stand still for a second caps itself locally.
    pub heartbeat: AtomicU64,
    /// Batches the container's shims have queued on the device and not yet seen complete
    /// (the controller hands the next turn over once the holder's work has drained).
    pub inflight: AtomicI64,
    /// Their estimated GPU time, ns.
    pub queued_ns: AtomicI64,
}

/// Page 1: usage per device.
#[repr(C, align(4096))]
pub struct Usage {
    pub devices: [DeviceUsage; MAX_DEVICES],
    /// Compute-gate exchange, same index as `devices`.
    pub compute: [DeviceCompute; MAX_DEVICES],
}

/// One process's share. Written only by the process holding the slot's OFD lock (or by
/// whoever reclaims it after that process died).
#[repr(C, align(64))]
pub struct Slot {
    /// The owner's pid as it sees itself (namespace pid); informative only.
    pub pid: AtomicU32,
    _pad: u32,
    /// Bumped each time the slot is claimed.
    pub generation: AtomicU64,
    /// Bytes charged per device by this process, context overhead included.
    pub used: [AtomicU64; MAX_DEVICES],
    /// The context-overhead part of `used`.
    pub overhead: [AtomicU64; MAX_DEVICES],
    pub alloc_denied: AtomicU64,
}

/// The whole ledger.
#[repr(C)]
pub struct Ledger {
    pub limits: Limits,
    pub usage: Usage,
    pub slots: [Slot; MAX_SLOTS],
}

pub const LIMITS_OFFSET: usize = std::mem::offset_of!(Ledger, limits);
pub const USAGE_OFFSET: usize = std::mem::offset_of!(Ledger, usage);
pub const SLOTS_OFFSET: usize = std::mem::offset_of!(Ledger, slots);
pub const LEDGER_SIZE: usize = std::mem::size_of::<Ledger>();

const _: () = {
    assert!(LIMITS_OFFSET == 0);
    assert!(std::mem::size_of::<Limits>() == PAGE);
    assert!(USAGE_OFFSET == PAGE);
    assert!(std::mem::size_of::<Usage>() == PAGE);
    assert!(SLOTS_OFFSET == 2 * PAGE);
    assert!(std::mem::size_of::<DeviceUsage>() == 64);
    assert!(std::mem::size_of::<DeviceCompute>() == 64);
    assert!(std::mem::size_of::<Slot>() == 320);
    assert!(LEDGER_SIZE == 2 * PAGE + 320 * MAX_SLOTS);
    assert!(LEDGER_SIZE.is_multiple_of(PAGE));
};

/// Why a mapped ledger cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("not an fgpu ledger (magic {0:#x})")]
    Magic(u64),
    #[error("ledger version {0}, this build understands {VERSION}")]
    Version(u32),
    #[error("ledger layout size {0}, this build expects {LEDGER_SIZE}")]
    Size(u64),
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    /// Bytes in use on the device when the reservation was refused.
    pub used: u64,
    /// The limit it was checked against.
    pub limit: u64,
}

/// A 64-bit key for a 16-byte device UUID; never 0 (0 marks an unbound device record).
pub fn uuid_key(uuid: &[u8; 16]) -> u64 {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&uuid[..8]);
    hi.copy_from_slice(&uuid[8..]);
    let k = u64::from_le_bytes(lo) ^ u64::from_le_bytes(hi).rotate_left(29);
    if k == 0 { 1 } else { k }
}

fn sub_saturating(a: &AtomicU64, n: u64) -> u64 {
    // The closure always returns Some, so this never fails; the previous value comes back.
    match a.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(n))) {
        Ok(prev) | Err(prev) => prev,
    }
}

impl Ledger {
    /// Initialises a freshly zeroed ledger (no limits, no devices, no slots); the magic is
    /// written last so that a reader never sees a half-initialised ledger as valid.
    pub fn init(&self) {
        let l = &self.limits;
        l.version.store(VERSION, SeqCst);
        l.max_devices.store(MAX_DEVICES as u32, SeqCst);
        l.max_slots.store(MAX_SLOTS as u32, SeqCst);
        l.layout_size.store(LEDGER_SIZE as u64, SeqCst);
        for d in &l.devices {
            d.memory_limit.store(NO_LIMIT, SeqCst);
        }
        l.magic.store(MAGIC, SeqCst);
    }

    /// Checks magic, version and size.
    pub fn validate(&self) -> Result<(), LayoutError> {
        let l = &self.limits;
        let magic = l.magic.load(SeqCst);
        if magic != MAGIC {
            return Err(LayoutError::Magic(magic));
        }
        let version = l.version.load(SeqCst);
        if version != VERSION {
            return Err(LayoutError::Version(version));
        }
        let size = l.layout_size.load(SeqCst);
        if size != LEDGER_SIZE as u64 {
            return Err(LayoutError::Size(size));
        }
        Ok(())
    }

    /// The device record for `uuid`, binding a free record to it if none is bound yet.
    /// None if all [`MAX_DEVICES`] records are bound to other devices.
    pub fn device_index(&self, uuid: &[u8; 16]) -> Option<usize> {
        let key = uuid_key(uuid);
        for (i, d) in self.usage.devices.iter().enumerate() {
            let k = d.key.load(SeqCst);
            if k == key {
                return Some(i);
            }
            if k == 0 {
                match d.key.compare_exchange(0, key, SeqCst, SeqCst) {
                    Ok(_) => {
                        let (lo, hi) = uuid.split_at(8);
                        let half = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
                        d.uuid[0].store(half(lo), SeqCst);
                        d.uuid[1].store(half(hi), SeqCst);
                        return Some(i);
                    }
                    Err(actual) if actual == key => return Some(i),
                    Err(_) => continue,
                }
            }
        }
        None
    }

    /// The UUID a device record is bound to (zeros while unbound).
    pub fn device_uuid(&self, dev: usize) -> [u8; 16] {
        let d = &self.usage.devices[dev];
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&d.uuid[0].load(SeqCst).to_le_bytes());
        out[8..].copy_from_slice(&d.uuid[1].load(SeqCst).to_le_bytes());
        out
    }

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

    /// Takes back everything `slot` holds (its owner is gone; the caller holds the slot's
    /// lock). Returns the bytes given back.
    pub fn reclaim(&self, slot: usize) -> u64 {
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

    /// Takes `slot` for a new owner (the caller holds its lock): reclaims what a dead
    /// predecessor left, records the pid.
    pub fn claim(&self, slot: usize, pid: u32) -> u64 {
        let reclaimed = self.reclaim(slot);
        let s = &self.slots[slot];
        s.alloc_denied.store(0, SeqCst);
        s.pid.store(pid, SeqCst);
        s.generation.fetch_add(1, SeqCst);
        reclaimed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
}
