//! Device memory backed for parking: a parkable process's `cuMemAlloc_v2` made of a reserved
//! virtual range with physical memory mapped into it (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`), so that the physical memory can be given back while the
//! program keeps its pointer, and mapped again at the same address later.
//!
//! The records are a `Mutex<Vec>`: only parkable processes' allocations and frees take it
//! (each of which makes four driver calls anyway), and the park and unpark that walk them.

use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::real::{
    self, AllocProp, AllocPropHead, CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
    CUdevice, CUdeviceptr, CUresult, Handle, MemHandle,
};

/// Records at most (a process with more parkable allocations than this pins itself: the
/// rest are made the ordinary way).
pub const MAX_RECORDS: usize = 1 << 16;

/// One allocation backed for parking.
#[derive(Clone, Copy, Debug)]
pub struct Rec {
    /// The address the program holds (start of the reserved range).
    pub va: CUdeviceptr,
    /// Bytes reserved, mapped and charged (the request rounded up to the granularity).
    pub size: u64,
    /// The physical memory while resident (0 while parked).
    pub handle: MemHandle,
    pub ord: CUdevice,
    /// The ledger's device record.
    pub idx: usize,
    /// The context it was made in (copies in and out run there).
    pub ctx: Handle,
    /// The host copy while parked (null while resident).
    pub host: *mut c_void,
}

// SAFETY: the raw pointers are driver handles and a pinned host buffer owned by the record;
// they are only used under RECORDS' lock or after being taken out of it.
unsafe impl Send for Rec {}

pub static RECORDS: Mutex<Vec<Rec>> = Mutex::new(Vec::new());

/// Granularity per ordinal (0: not asked yet).
static GRAN: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
/// When the driver does not say (2 MiB is every current GPU's minimum).
const DEFAULT_GRAN: usize = 2 << 20;

fn prop(ord: CUdevice) -> AllocProp {
    AllocProp {
        head: AllocPropHead {
            alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
            handle_types: 0,
            location_type: CU_MEM_LOCATION_TYPE_DEVICE,
            location_id: ord,
        },
        win32_meta: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// The minimum granularity of physical memory on device `ord`.
pub fn granularity(ord: CUdevice) -> usize {
    let slot = GRAN.get(ord.max(0) as usize);
    if let Some(g) = slot.map(|g| g.load(Relaxed)).filter(|&g| g != 0) {
        return g;
    }
    let mut g = 0usize;
    let p = prop(ord);
    if let Some(f) = real::CU_MEM_GET_ALLOCATION_GRANULARITY.get() {
        // SAFETY: valid out-pointer and a complete CUmemAllocationProp; option 0 = MINIMUM.
        if unsafe { f(&mut g, &p, 0) } != 0 {
            g = 0;
        }
    }
    let g = if g == 0 || !g.is_power_of_two() {
        DEFAULT_GRAN
    } else {
        g
    };
    if let Some(s) = slot {
        s.store(g, Relaxed);
    }
    g
}

/// `bytes` rounded up to device `ord`'s granularity (None on overflow).
pub fn rounded(ord: CUdevice, bytes: usize) -> Option<usize> {
    let g = granularity(ord);
    bytes.checked_add(g - 1).map(|b| b & !(g - 1))
}

/// A call that failed: which, and the driver's code.
#[derive(Clone, Copy, Debug)]
pub struct Failed {
    pub call: &'static str,
    pub rc: CUresult,
}

fn check(call: &'static str, rc: CUresult) -> Result<(), Failed> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Failed { call, rc })
    }
}

fn sym<F: Copy>(s: &real::Sym<F>, call: &'static str) -> Result<F, Failed> {
    s.get().ok_or(Failed { call, rc: 3 })
}

/// New physical memory of `size` bytes on `ord`.
pub fn create(ord: CUdevice, size: u64) -> Result<MemHandle, Failed> {
    let f = sym(&real::CU_MEM_CREATE, "cuMemCreate")?;
    let p = prop(ord);
    let mut h: MemHandle = 0;
    // SAFETY: valid out-pointer and a complete CUmemAllocationProp; flags 0.
    check("cuMemCreate", unsafe {
        f(&mut h, size as usize, &p.head, 0)
    })?;
    Ok(h)
}

/// Maps `h` at `va` and makes it readable and writable from `ord` and from the other devices
/// this process holds a context on that can reach it ([`super::peers`]); on failure nothing
/// stays mapped (the handle is the caller's still). Returns the devices it was opened to.
pub fn map(va: CUdeviceptr, size: u64, h: MemHandle, ord: CUdevice) -> Result<u64, Failed> {
    let m = sym(&real::CU_MEM_MAP, "cuMemMap")?;
    let a = sym(&real::CU_MEM_SET_ACCESS, "cuMemSetAccess")?;
    // SAFETY: a range we reserved and physical memory of the same size.
    check("cuMemMap", unsafe { m(va, size as usize, 0, h, 0) })?;
    let devices = super::peers::devices();
    let desc = super::peers::open_to(ord, devices);
    // SAFETY: the range just mapped; `desc.len()` descriptors.
    if let Err(e) = check("cuMemSetAccess", unsafe {
        a(va, size as usize, desc.as_ptr(), desc.len())
    }) {
        unmap(va, size);
        return Err(e);
    }
    Ok(devices)
}

/// Unmaps `va`; failures are logged (nothing else can be done).
pub fn unmap(va: CUdeviceptr, size: u64) {
    if let Some(f) = real::CU_MEM_UNMAP.get() {
        // SAFETY: a range we mapped.
        let rc = unsafe { f(va, size as usize) };
        if rc != 0 {
            crate::log::warning!("parking: cuMemUnmap({va:#x}) failed: {rc}");
        }
    }
}

/// Releases physical memory; failures are logged.
pub fn release(h: MemHandle) {
    if let Some(f) = real::CU_MEM_RELEASE.get() {
        // SAFETY: a handle we created and no longer map.
        let rc = unsafe { f(h) };
        if rc != 0 {
            crate::log::warning!("parking: cuMemRelease failed: {rc}");
        }
    }
}

/// Reserves a virtual range of `size` bytes aligned to the granularity of `ord`.
pub fn reserve_range(ord: CUdevice, size: u64) -> Result<CUdeviceptr, Failed> {
    let f = sym(&real::CU_MEM_ADDRESS_RESERVE, "cuMemAddressReserve")?;
    let mut va: CUdeviceptr = 0;
    // SAFETY: valid out-pointer; alignment the granularity, no fixed address, no flags.
    check("cuMemAddressReserve", unsafe {
        f(&mut va, size as usize, granularity(ord), 0, 0)
    })?;
    Ok(va)
}

/// Gives a reserved range back.
pub fn free_range(va: CUdeviceptr, size: u64) {
    if let Some(f) = real::CU_MEM_ADDRESS_FREE.get() {
        // SAFETY: a range we reserved and no longer map.
        let rc = unsafe { f(va, size as usize) };
        if rc != 0 {
            crate::log::warning!("parking: cuMemAddressFree({va:#x}) failed: {rc}");
        }
    }
}

/// Host memory for one park: an anonymous mapping (transparent huge pages asked for),
/// faulted in by several threads at once, then page-locked for the device
/// (`cuMemHostRegister_v2`, portable), so that copies in both directions run at the link's
/// speed. One region per park: one registration instead of one per allocation.
pub struct HostRegion {
    pub base: *mut c_void,
    pub len: usize,
    /// How long faulting it in and registering it took, ms.
    pub fault_ms: u64,
    pub register_ms: u64,
}

// SAFETY: the region is plain memory owned by whoever holds the value.
unsafe impl Send for HostRegion {}

/// Threads that fault a region in.
const FAULT_THREADS: usize = 8;
const HUGE: usize = 2 << 20;

/// A [`HostRegion`] of at least `len` bytes, registered in the current context's driver;
/// None if the memory or the registration could not be had.
pub fn host_region(len: u64) -> Result<HostRegion, Failed> {
    let len = (len as usize).div_ceil(HUGE) * HUGE;
    // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Failed {
            call: "mmap",
            rc: 2,
        });
    }
    // SAFETY: advice on the mapping just made (ignored where THP is off).
    unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
    let t0 = fgpu_common::clock::mono_ns();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, FAULT_THREADS);
    let per = len.div_ceil(threads).div_ceil(HUGE) * HUGE;
    let base = p as usize;
    std::thread::scope(|sc| {
        for t in 0..threads {
            let (from, to) = ((t * per).min(len), ((t + 1) * per).min(len));
            sc.spawn(move || {
                let mut off = from;
                while off < to {
                    // SAFETY: inside the mapping; one write per page faults it in.
                    unsafe { ((base + off) as *mut u8).write_volatile(0) };
                    off += 4096;
                }
            });
        }
    });
    let t1 = fgpu_common::clock::mono_ns();
    let reg = sym(&real::CU_MEM_HOST_REGISTER, "cuMemHostRegister_v2");
    // SAFETY: the whole mapping, faulted in; portable (every context may copy with it).
    let rc = reg.map(|f| unsafe { f(p, len, real::CU_MEMHOSTREGISTER_PORTABLE) });
    match rc {
        Ok(0) => Ok(HostRegion {
            base: p,
            len,
            fault_ms: t1.saturating_sub(t0) / 1_000_000,
            register_ms: fgpu_common::clock::mono_ns().saturating_sub(t1) / 1_000_000,
        }),
        Ok(rc) | Err(Failed { rc, .. }) => {
            // SAFETY: the mapping made above, not registered.
            unsafe { libc::munmap(p, len) };
            Err(Failed {
                call: "cuMemHostRegister_v2",
                rc,
            })
        }
    }
}

/// Unregisters and unmaps a region (in a context of the process's driver).
pub fn host_region_free(r: HostRegion) {
    if let Some(f) = real::CU_MEM_HOST_UNREGISTER.get() {
        // SAFETY: a region host_region registered, unregistered once.
        let rc = unsafe { f(r.base) };
        if rc != 0 {
            crate::log::warning!("parking: cuMemHostUnregister failed: {rc}");
        }
    }
    // SAFETY: the mapping host_region made, no longer registered or referenced.
    unsafe { libc::munmap(r.base, r.len) };
}

/// A stream of the current context for the copies of one park or unpark.
pub fn stream() -> Result<Handle, Failed> {
    let f = sym(&real::CU_STREAM_CREATE, "cuStreamCreate")?;
    let mut s: Handle = std::ptr::null_mut();
    // SAFETY: valid out-pointer; a non-blocking stream of the current context.
    check("cuStreamCreate", unsafe {
        f(&mut s, real::CU_STREAM_NON_BLOCKING)
    })?;
    Ok(s)
}

/// Waits for `s`'s copies and destroys it.
pub fn finish(s: Handle) -> Result<(), Failed> {
    let sync = sym(&real::CU_STREAM_SYNCHRONIZE, "cuStreamSynchronize")?;
    // SAFETY: a stream `stream` made.
    let rc = check("cuStreamSynchronize", unsafe { sync(s) });
    if let Some(d) = real::CU_STREAM_DESTROY.get() {
        // SAFETY: the same stream, destroyed once.
        unsafe { d(s) };
    }
    rc
}

/// Device → host on `s` (queued; [`finish`] waits).
pub fn copy_out(host: *mut c_void, va: CUdeviceptr, size: u64, s: Handle) -> Result<(), Failed> {
    let f = sym(&real::CU_MEMCPY_DTOH_ASYNC, "cuMemcpyDtoHAsync_v2")?;
    // SAFETY: `host` holds `size` bytes of registered memory; the device range is ours and
    // mapped.
    check("cuMemcpyDtoHAsync_v2", unsafe {
        f(host, va, size as usize, s)
    })
}

/// Host → device on `s` (queued; [`finish`] waits).
pub fn copy_in(va: CUdeviceptr, host: *const c_void, size: u64, s: Handle) -> Result<(), Failed> {
    let f = sym(&real::CU_MEMCPY_HTOD_ASYNC, "cuMemcpyHtoDAsync_v2")?;
    // SAFETY: `host` holds `size` bytes of registered memory; the device range is ours and
    // mapped again.
    check("cuMemcpyHtoDAsync_v2", unsafe {
        f(va, host, size as usize, s)
    })
}

/// Runs `f` with `ctx` current on this thread, restoring what was current.
pub fn in_ctx<T>(ctx: Handle, f: impl FnOnce() -> T) -> Result<T, Failed> {
    let push = sym(&real::CU_CTX_PUSH_CURRENT, "cuCtxPushCurrent_v2")?;
    let pop = sym(&real::CU_CTX_POP_CURRENT, "cuCtxPopCurrent_v2")?;
    // SAFETY: a context the program made current itself when it allocated.
    check("cuCtxPushCurrent_v2", unsafe { push(ctx) })?;
    let out = f();
    let mut was: Handle = std::ptr::null_mut();
    // SAFETY: pops what we pushed.
    unsafe { pop(&mut was) };
    Ok(out)
}

/// The calling thread's current context (null if none).
pub fn current_ctx() -> Handle {
    let mut c: Handle = std::ptr::null_mut();
    if let Some(f) = real::CU_CTX_GET_CURRENT.get() {
        // SAFETY: valid out-pointer.
        unsafe { f(&mut c) };
    }
    c
}

/// Waits for all work of the current context.
pub fn sync() -> Result<(), Failed> {
    let f = sym(&real::CU_CTX_SYNCHRONIZE, "cuCtxSynchronize")?;
    // SAFETY: no arguments.
    check("cuCtxSynchronize", unsafe { f() })
}
