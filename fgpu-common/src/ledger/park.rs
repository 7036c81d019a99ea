//! Parking (docs/parking.md): a parkable container's idle processes copy their device memory
//! to host memory and give the physical GPU memory back, keeping every device address valid;
//! their next launch, copy or allocation brings it back first.
//!
//! The exchange with the agent, in the ledger:
//!
//! - page 0 ([`ParkControl`], written by the agent, read-only to shims): whether the
//!   container may be parked at all (`park_after_ms`), the latest park request (`command`,
//!   an epoch), and the agent's answer to a process that asked for room (`room_for`,
//!   `room_verdict`);
//! - each process's slot ([`SlotPark`], written by its owner): its phase, why it cannot be
//!   parked (`pinned`), the last request it answered and how, its parked bytes per device,
//!   when it last used the GPU, a request for room, and counters and durations the agent
//!   turns into metrics.
//!
//! Every value a shim writes is the container's word, not a fact: the agent uses it to pick
//! whom to park and to report, never to give one container another's memory (a false
//! "parked" only makes the agent see less memory held by that container, which the kernel's
//! own count, `kernel_used`, contradicts; the decision to park is the agent's).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

use super::{Ledger, MAX_DEVICES};

/// The most a slot is taken at its word for having parked from one device it has no memory
/// limit on (1 TiB: more than any GPU holds), so that its figures never overflow a sum.
pub const PARKED_CLAIM_CAP: u64 = 1 << 40;

/// [`SlotPark::phase`]: the process's device memory is on the device.
pub const RESIDENT: u32 = 0;
/// Copying out (its launches and copies wait).
pub const PARKING: u32 = 1;
/// In host memory; the next launch, copy or allocation brings it back.
pub const PARKED: u32 = 2;
/// Copying back in.
pub const UNPARKING: u32 = 3;

/// [`SlotPark::result`]: the last park request was carried out.
pub const PARK_OK: u32 = 1;
/// Not parked: something of the process cannot move ([`SlotPark::pinned`] says what).
pub const PARK_PINNED: u32 = 2;
/// Not parked: a launch, copy or allocation was under way and did not finish in time, or
/// the process used the GPU after the agent decided.
pub const PARK_BUSY: u32 = 3;
/// Not parked: host memory could not be had (the container's memory cgroup, or pinning).
pub const PARK_NO_HOST_MEMORY: u32 = 4;
/// Not parked: a driver call failed (the process stays resident; the log says which).
pub const PARK_DRIVER_ERROR: u32 = 5;
/// Nothing to park (no device memory of the process is backed for parking).
pub const PARK_NOTHING: u32 = 6;

/// [`SlotPark::pinned`] bits: why a process's memory cannot be parked.
pub mod pin {
    /// Device memory allocated before the container was parkable (not backed for parking).
    pub const EARLY: u32 = 1 << 0;
    /// Stream-ordered allocations or memory pools (`cuMemAllocAsync`, `cuMemPoolCreate`).
    pub const POOL: u32 = 1 << 1;
    /// The program's own virtual memory management (`cuMemCreate`).
    pub const VMM: u32 = 1 << 2;
    /// Managed (unified) memory.
    pub const MANAGED: u32 = 1 << 3;
    /// CUDA arrays.
    pub const ARRAY: u32 = 1 << 4;
    /// Pitched allocations (`cuMemAllocPitch`).
    pub const PITCH: u32 = 1 << 5;
    /// Memory exported with `cuIpcGetMemHandle`.
    pub const IPC: u32 = 1 << 6;
    /// More parkable allocations than the shim's table holds.
    pub const FULL: u32 = 1 << 7;

    /// The names of the bits set in `bits`, for `fgpu status` and logs.
    pub fn names(bits: u32) -> Vec<&'static str> {
        [
            (EARLY, "memory allocated before parking was enabled"),
            (POOL, "stream-ordered allocations or memory pools"),
            (VMM, "the program's own cuMemCreate memory"),
            (MANAGED, "managed memory"),
            (ARRAY, "CUDA arrays"),
            (PITCH, "pitched allocations"),
            (IPC, "memory exported with cuIpcGetMemHandle"),
            (FULL, "more allocations than the shim tracks for parking"),
        ]
        .into_iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| n)
        .collect()
    }
}

/// [`ParkControl::room_verdict`]: the agent is parking another container to make the room
/// asked for; retry once it says [`ROOM_DONE`].
pub const ROOM_COMING: u32 = 1;
/// Nothing can be parked to make room: the allocation fails as it would without parking.
pub const ROOM_NONE: u32 = 2;
/// Another container was parked; retry.
pub const ROOM_DONE: u32 = 3;

/// Page 0's parking record (written by the agent; read-only to shims under an agent).
#[repr(C, align(64))]
pub struct ParkControl {
    /// How long, ms, a process must have left the GPU alone before the agent may park it;
    /// 0: the container is not parkable.
    pub park_after_ms: AtomicU64,
    /// The latest park request: an epoch the agent bumps to ask every process of the
    /// container to park (0: never asked).
    pub command: AtomicU64,
    /// Which request for room the verdict answers: `(slot + 1) << 32 | (need_seq as u32)`.
    pub room_for: AtomicU64,
    /// [`ROOM_COMING`], [`ROOM_NONE`] or [`ROOM_DONE`].
    pub room_verdict: AtomicU32,
    _pad: u32,
    /// How many *other* containers on the node are parkable (the broker keeps it current):
    /// 0 means no request for room can be answered with room, and a shim does not ask.
    pub parkable_peers: AtomicU64,
    _reserved: [AtomicU64; 3],
}

/// One process's parking state (written by its owner).
#[repr(C, align(64))]
pub struct SlotPark {
    /// [`RESIDENT`], [`PARKING`], [`PARKED`] or [`UNPARKING`].
    pub phase: AtomicU32,
    /// [`pin`] bits.
    pub pinned: AtomicU32,
    /// The latest [`ParkControl::command`] this process answered.
    pub done: AtomicU64,
    /// How: [`PARK_OK`], [`PARK_PINNED`], ...
    pub result: AtomicU32,
    /// The device a request for room is for.
    pub need_dev: AtomicU32,
    /// Bytes a request for room asks for (0: none open).
    pub need_bytes: AtomicU64,
    /// Bumped with every new request for room.
    pub need_seq: AtomicU64,
    /// CLOCK_MONOTONIC, ms, of the process's latest launch, copy or allocation while
    /// parkable.
    pub last_active_ms: AtomicU64,
    /// Parks and unparks carried out.
    pub parks: AtomicU64,
    pub unparks: AtomicU64,
    /// The latest park's and unpark's duration, ns.
    pub last_park_ns: AtomicU64,
    pub last_unpark_ns: AtomicU64,
    /// Time the process's launches, copies and allocations waited for an unpark, ns (only
    /// grows).
    pub wait_ns: AtomicU64,
    /// Bytes in host memory per device while parked.
    pub parked: [AtomicU64; MAX_DEVICES],
}

const _: () = {
    assert!(std::mem::size_of::<ParkControl>() == 64);
    assert!(std::mem::size_of::<SlotPark>() == 256);
};

impl Ledger {
    /// The container's parking record.
    pub fn park(&self) -> &ParkControl {
        &self.limits.park
    }

    /// Whether the container is parkable, and after how long, ms.
    pub fn park_after_ms(&self) -> Option<u64> {
        match self.limits.park.park_after_ms.load(SeqCst) {
            0 => None,
            ms => Some(ms),
        }
    }

    /// `slot`'s parking state.
    pub fn slot_park(&self, slot: usize) -> &SlotPark {
        &self.slots[slot].park
    }

    /// Bytes `slot` says it holds in host memory, all devices, each device's figure capped
    /// at the device's memory limit (at most [`PARKED_CLAIM_CAP`]): the slot's own word, for
    /// its own figures (events, counters); [`Ledger::parked_total`] is what the agent counts.
    pub fn parked_bytes(&self, slot: usize) -> u64 {
        (0..MAX_DEVICES)
            .map(|d| {
                self.slots[slot].park.parked[d]
                    .load(SeqCst)
                    .min(self.claim_cap(d))
            })
            .fold(0, u64::saturating_add)
    }

    /// What the agent counts of the container's memory in host memory (status, the broker's
    /// host budget). Each process writes its own figures into its slot, and a hostile one may
    /// write anything, including device records it bound itself, so: only a parkable
    /// container's figures count (no other is ever parked), and each device's sum over the
    /// slots (saturating) is capped at what the container could have had there to park: the
    /// device's memory limit, and the size of the real GPU the record is bound to
    /// (`device_memory` of its UUID; None, an unknown GPU: nothing).
    pub fn parked_total(&self, device_memory: impl Fn(&[u8; 16]) -> Option<u64>) -> u64 {
        if self.park_after_ms().is_none() {
            return 0;
        }
        (0..MAX_DEVICES)
            .map(|d| {
                let cap = device_memory(&self.device_uuid(d)).unwrap_or(0);
                (0..self.slots_in_range())
                    .map(|s| self.slots[s].park.parked[d].load(SeqCst))
                    .fold(0, u64::saturating_add)
                    .min(self.claim_cap(d).min(cap))
            })
            .fold(0, u64::saturating_add)
    }

    /// The most a container's processes can have parked from device `d`.
    fn claim_cap(&self, d: usize) -> u64 {
        self.limit(d).min(PARKED_CLAIM_CAP)
    }
}

impl SlotPark {
    /// Clears everything (a new owner, or its owner is gone: a dead process's host copies
    /// went with it).
    pub fn clear(&self) {
        self.phase.store(RESIDENT, SeqCst);
        self.pinned.store(0, SeqCst);
        self.result.store(0, SeqCst);
        self.need_bytes.store(0, SeqCst);
        for b in &self.parked {
            b.store(0, SeqCst);
        }
    }

    /// Opens a request for `bytes` of room on device `dev`; returns the tag the agent's
    /// verdict will carry (see [`ParkControl::room_for`]).
    pub fn ask_room(&self, slot: usize, dev: usize, bytes: u64) -> u64 {
        self.need_dev.store(dev as u32, SeqCst);
        self.need_bytes.store(bytes, SeqCst);
        let seq = self.need_seq.fetch_add(1, SeqCst) + 1;
        room_tag(slot, seq)
    }

    /// Closes the request for room.
    pub fn room_done(&self) {
        self.need_bytes.store(0, SeqCst);
    }
}

/// The tag of request `seq` of `slot` ([`ParkControl::room_for`]).
pub fn room_tag(slot: usize, seq: u64) -> u64 {
    ((slot as u64 + 1) << 32) | (seq & 0xffff_ffff)
}
