//! Which devices may touch backed memory.
//!
//! Memory from `cuMemAlloc` can be reached from every device of the process: copies between
//! devices always work, and kernels once peer access is enabled (`cuCtxEnablePeerAccess`).
//! Memory mapped through the virtual-memory API can be reached only from the devices
//! `cuMemSetAccess` names, and peer access does not extend to it (CUDA Programming Guide,
//! Virtual Memory Management, "Controlling Access Rights"). So that backed memory behaves
//! as the program's `cuMemAlloc` would, it is opened to the device that holds it and to
//! every other device this process holds a context on that can reach it
//! (`cuDeviceCanAccessPeer`): when it is mapped (allocation, unpark), and, when the process
//! takes a context on one more device, the resident records are opened to that device too.
//! PyTorch's expandable segments do the same when peer access is enabled
//! (c10/cuda/CUDACachingAllocator.cpp, `ExpandableSegment::addPeer`).
//!
//! The set only grows: a context released on one device leaves the access in place (the
//! process may take a context there again, and would then reach the memory at once).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

use crate::real::{
    self, AccessDesc, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_LOCATION_TYPE_DEVICE,
};
use crate::real::{CUdevice, CUdeviceptr};

use super::backing::RECORDS;

/// Ordinals this process holds (or held) a context on: bit per ordinal below 64.
static DEVICES: AtomicU64 = AtomicU64::new(0);
const MAX: usize = 64;
/// `cuDeviceCanAccessPeer(a, b)` per pair: 0 not asked yet, 1 yes, 2 no.
static CAN: [[AtomicU8; MAX]; MAX] = [const { [const { AtomicU8::new(0) }; MAX] }; MAX];

fn bit(ord: CUdevice) -> Option<u64> {
    usize::try_from(ord)
        .ok()
        .filter(|&o| o < MAX)
        .map(|o| 1u64 << o)
}

/// The devices this process holds a context on, as [`open_to`] takes them.
pub fn devices() -> u64 {
    DEVICES.load(SeqCst)
}

/// Whether device `from` can reach memory on device `on`.
fn can_reach(from: usize, on: usize) -> bool {
    if from == on {
        return true;
    }
    let cell = &CAN[from][on];
    match cell.load(Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    let mut v = 0;
    let yes = real::CU_DEVICE_CAN_ACCESS_PEER.get().is_some_and(|f| {
        // SAFETY: cuDeviceCanAccessPeer(int*, CUdevice, CUdevice): a valid out-pointer and
        // two ordinals below 64.
        unsafe { f(&mut v, from as CUdevice, on as CUdevice) == 0 && v == 1 }
    });
    cell.store(if yes { 1 } else { 2 }, Relaxed);
    yes
}

fn desc(ord: usize) -> AccessDesc {
    AccessDesc {
        location_type: CU_MEM_LOCATION_TYPE_DEVICE,
        location_id: ord as CUdevice,
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// The access descriptors for memory on `owner`: `owner` first, then every device of
/// `devices` that can reach it.
pub fn open_to(owner: CUdevice, devices: u64) -> Vec<AccessDesc> {
    let own = usize::try_from(owner).unwrap_or(0);
    let mut out = vec![desc(own)];
    out.extend(
        (0..MAX)
            .filter(|&d| d != own && devices & (1 << d) != 0 && can_reach(d, own))
            .map(desc),
    );
    out
}

/// Opens `size` bytes at `va` (on device `owner`) to the devices in `add` that can reach it;
/// failures are logged (the program then sees the driver's own error on that device).
pub fn open(va: CUdeviceptr, size: u64, owner: CUdevice, add: u64) {
    let Some(f) = real::CU_MEM_SET_ACCESS.get() else {
        return;
    };
    let own = usize::try_from(owner).unwrap_or(0);
    for d in (0..MAX).filter(|&d| d != own && add & (1 << d) != 0 && can_reach(d, own)) {
        let a = desc(d);
        // SAFETY: a range we mapped; one descriptor.
        let rc = unsafe { f(va, size as usize, &a, 1) };
        if rc != 0 {
            crate::log::warning!(
                "parking: cuMemSetAccess({va:#x}) for device {d} failed: {rc}; that device cannot reach this memory"
            );
        }
    }
}

/// The process holds a context on `ord`: memory mapped from now on is opened to it, and so
/// is every resident record already made. Called on every context retained; a device
/// already known costs one load.
pub fn note_device(ord: CUdevice) {
    let Some(b) = bit(ord) else {
        return;
    };
    if DEVICES.load(Relaxed) & b != 0 || DEVICES.fetch_or(b, SeqCst) & b != 0 {
        return;
    }
    // Set before the records are walked: a record mapped after this sees the bit (an
    // unpark maps under this lock; an allocation checks again once its record is in).
    let recs = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    for r in recs.iter().filter(|r| r.handle != 0) {
        open(r.va, r.size, r.ord, b);
    }
}

/// In a fork child: the child holds no context.
pub fn reset_in_child() {
    DEVICES.store(0, SeqCst);
}
