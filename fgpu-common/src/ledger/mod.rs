//! The per-container ledger: `#[repr(C)]` records of atomics that every process of a
//! container maps from one shared-memory file (standalone shim) or two memfds (handed over by
//! the agent). This module is the layout and the arithmetic on it, shared by the agent and
//! the shim; the files, seals, mappings and slot locks are in the `fgpu-ledger` crate.
//!
//! Layout (all offsets fixed, checked at compile time):
//!
//! | offset | part | written by |
//! |---|---|---|
//! | 0 | [`Limits`]: magic, version, sizes, per-device limits and compute turns (one page) | the creator / the agent; read-only to shims under an agent |
//! | 4096 | [`Usage`]: per-device identity, used bytes, peak, denials, measured GPU time (one page) | every shim (atomics) |
//! | 8192 | [`Slot`] × [`MAX_SLOTS`]: one per live process, its bytes, its compute and parking state | its owner |
//!
//! Limits live in their own page so that the agent can map that page read-only into the
//! container while usage stays writable for lock-free reservation. Everything the compute
//! controller decides (whose turn it is, the controller's heartbeat, how much work may be
//! queued) is in that read-only page too: a container cannot open its own turn or close
//! another's by writing its page.
//!
//! Memory ([`memory`]): reservation is a compare-and-swap on the device's `used` counter: it
//! succeeds only if `used + n <= limit`, *before* the driver is called, and is released if the
//! driver call fails. Each process also keeps its own share in its [`Slot`], so that when it
//! dies (however it dies) its bytes can be taken back from the device counter. Which process
//! owns a slot is not recorded here: the shim holds an OFD lock on byte [`LOCK_BASE`] + slot of
//! the file for its whole life, and anybody can test that lock.
//!
//! Compute ([`compute`]): per process and device, what the controller needs to know and must
//! be able to forget when the process dies or stops: whether it waits for a turn, when it
//! last launched, what it has queued — stamped with the controller's own heartbeat, so that
//! a stamp that stops moving (SIGKILL, SIGSTOP, a frozen cgroup) goes stale by the
//! controller's clock, never by the tenant's.

pub mod compute;
pub mod memory;
pub mod park;

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::SeqCst};

pub use memory::Denied;

/// "fgpuldg1", little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"fgpuldg1");
pub const VERSION: u32 = 4;
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

/// One device's compute turn, decided by the agent's controller (read-only to shims).
#[repr(C, align(64))]
pub struct DeviceTurn {
    /// [`compute::TURN_CLOSED`] (launches wait), [`compute::TURN_OPEN`] (the container holds
    /// the device) or [`compute::TURN_CORUN`] (it may run beside the holder).
    pub state: AtomicI64,
    /// Bumped by the agent after every change of `state` toward open; waiting shims sleep on
    /// it (a futex on the shared memfd, woken at once).
    pub grant: AtomicU32,
    _pad: u32,
    /// Bumped by the controller on every tick while the device is gated: the clock every
    /// per-process stamp is read against, and a shim that sees it stand still for a second
    /// caps itself locally.
    pub heartbeat: AtomicU64,
    /// The most estimated GPU time, ns, a process may have queued on the device (0: the
    /// shim's default). Small while another container runs beside the holder.
    pub queue_ns: AtomicU64,
}

/// Page 0: identification, limits and compute turns.
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
    pub turns: [DeviceTurn; MAX_DEVICES],
    /// Parking: whether, and what the agent asks ([`park`]).
    pub park: park::ParkControl,
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
    _reserved: AtomicU64,
}

/// One device's measured compute, summed over the container's processes.
#[repr(C, align(64))]
pub struct DeviceCompute {
    /// GPU time measured by the container's shims on this device, ns (only grows).
    pub gpu_ns: AtomicU64,
    /// Gated launches of the container's processes on this device, counted as their
    /// batches complete (only grows): the controller's measure of a tenant's progress when
    /// it compares turns with co-running (tenant-written: it only ever decides for the
    /// tenant's own rate, see the agent's `sched::probe`).
    pub launches: AtomicU64,
}

/// Page 1: usage per device.
#[repr(C, align(4096))]
pub struct Usage {
    pub devices: [DeviceUsage; MAX_DEVICES],
    /// Measured compute, same index as `devices`.
    pub compute: [DeviceCompute; MAX_DEVICES],
    /// One more than the highest slot ever claimed (readers scan slots below it only).
    pub slots_hwm: AtomicU32,
}

/// One process's compute state on one device. Stamps hold the device's
/// [`DeviceTurn::heartbeat`] as the process saw it (0: never).
#[repr(C)]
pub struct SlotCompute {
    /// While a thread of the process waits for a turn: the heartbeat at its latest look
    /// (re-stamped at least every millisecond); 0 when nobody waits.
    pub wait_beat: AtomicU64,
    /// The heartbeat at the process's latest gated launch.
    pub launch_beat: AtomicU64,
    /// Batches queued on the device and not yet seen complete.
    pub inflight: AtomicI64,
    /// Their estimated GPU time, ns.
    pub queued_ns: AtomicI64,
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
    /// Compute state per device.
    pub compute: [SlotCompute; MAX_DEVICES],
    /// Parking state ([`park`]).
    pub park: park::SlotPark,
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
/// Bytes of the usage part (everything after the limits page).
pub const USAGE_SIZE: usize = LEDGER_SIZE - PAGE;

const _: () = {
    assert!(LIMITS_OFFSET == 0);
    assert!(std::mem::size_of::<Limits>() == PAGE);
    assert!(USAGE_OFFSET == PAGE);
    assert!(std::mem::size_of::<Usage>() == PAGE);
    assert!(SLOTS_OFFSET == 2 * PAGE);
    assert!(std::mem::size_of::<DeviceTurn>() == 64);
    assert!(std::mem::size_of::<DeviceUsage>() == 64);
    assert!(std::mem::size_of::<DeviceCompute>() == 64);
    assert!(std::mem::size_of::<SlotCompute>() == 32);
    assert!(std::mem::size_of::<Slot>() == 1088);
    assert!(LEDGER_SIZE == 2 * PAGE + 1088 * MAX_SLOTS);
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

/// A 64-bit key for a 16-byte device UUID; never 0 (0 marks an unbound device record).
pub fn uuid_key(uuid: &[u8; 16]) -> u64 {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&uuid[..8]);
    hi.copy_from_slice(&uuid[8..]);
    let k = u64::from_le_bytes(lo) ^ u64::from_le_bytes(hi).rotate_left(29);
    if k == 0 { 1 } else { k }
}

impl Ledger {
    /// Initialises a freshly zeroed ledger (no limits, no devices, no slots, every turn
    /// closed); the magic is written last so that a reader never sees a half-initialised
    /// ledger as valid.
    pub fn init(&self) {
        let l = &self.limits;
        l.version.store(VERSION, SeqCst);
        l.max_devices.store(MAX_DEVICES as u32, SeqCst);
        l.max_slots.store(MAX_SLOTS as u32, SeqCst);
        l.layout_size.store(LEDGER_SIZE as u64, SeqCst);
        for d in &l.devices {
            d.memory_limit.store(NO_LIMIT, SeqCst);
        }
        for t in &l.turns {
            t.state.store(compute::TURN_CLOSED, SeqCst);
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

    /// Slots that may be in use: below the high-water mark, never past [`MAX_SLOTS`] (the
    /// mark is written by the container and not trusted).
    pub fn slots_in_range(&self) -> usize {
        (self.usage.slots_hwm.load(SeqCst) as usize).min(MAX_SLOTS)
    }

    /// Takes `slot` for a new owner (the caller holds its lock): reclaims what a dead
    /// predecessor left (bytes and compute state), records the pid. Returns the bytes
    /// reclaimed.
    pub fn claim(&self, slot: usize, pid: u32) -> u64 {
        let reclaimed = self.reclaim(slot);
        let s = &self.slots[slot];
        s.alloc_denied.store(0, SeqCst);
        s.pid.store(pid, SeqCst);
        s.generation.fetch_add(1, SeqCst);
        self.usage.slots_hwm.fetch_max(slot as u32 + 1, SeqCst);
        reclaimed
    }

    /// Takes back everything `slot` holds (its owner is gone; the caller holds the slot's
    /// lock): its bytes, and its compute state (a dead process neither waits nor has work
    /// queued). Returns the bytes given back.
    pub fn reclaim(&self, slot: usize) -> u64 {
        for c in &self.slots[slot].compute {
            c.clear();
        }
        self.slots[slot].park.clear();
        self.reclaim_bytes(slot)
    }
}

#[cfg(test)]
pub(crate) mod tests;
