//! Process-local bookkeeping: contexts, allocations, streams, events, modules, graphs.
//! Lives behind one mutex; none of this is on a hot path that matters in a simulator.

use crate::cuda::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY, CUresult,
};
use crate::state::{MAX_DEVICES, Shared, shared};
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

pub const CTX_BASE: usize = 0xC7C0_0000;
/// Device pointers: `(slot + 1) << VA_SHIFT` plus a per-process bump offset.
const VA_SHIFT: u32 = 40;
pub const ALIGN: u64 = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocKind {
    /// Charged on the device (cuMemAlloc, pitch).
    Device,
    /// cuMemAllocManaged: charges nothing until touched, and the simulator never touches.
    Managed,
    /// Stream-ordered allocation from a pool (the pool holds the charge).
    Pool(usize),
}

pub struct Alloc {
    pub dev: usize,
    pub size: u64,
    pub kind: AllocKind,
}

#[derive(Default)]
pub struct Stream {
    pub dev: usize,
    pub last_ns: u64,
    pub pending: VecDeque<u64>,
    /// Durations captured while in stream capture.
    pub capture: Option<Vec<u64>>,
}

pub struct Pool {
    pub dev: usize,
    /// Bytes charged on the device by this pool.
    pub reserved: u64,
    /// Bytes handed out to live allocations.
    pub in_use: u64,
    pub is_default: bool,
}

pub struct VmmHandle {
    pub dev: Option<usize>,
    pub size: u64,
    pub released: bool,
    pub mappings: u32,
}

#[derive(Default)]
pub struct Local {
    pub initialized: bool,
    pub slot: Option<usize>,
    pub ctx_refs: [u32; MAX_DEVICES],
    next_va: u64,
    next_handle: usize,
    pub allocs: BTreeMap<u64, Alloc>,
    pub streams: BTreeMap<usize, Stream>,
    /// Event handle → recorded completion time (None: never recorded).
    pub events: BTreeMap<usize, Option<u64>>,
    pub modules: BTreeMap<usize, ()>,
    /// Function handle → duration in ns.
    pub functions: BTreeMap<usize, u64>,
    /// Graph handle → captured kernel durations.
    pub graphs: BTreeMap<usize, Vec<u64>>,
    /// Executable graph handle → total duration.
    pub execs: BTreeMap<usize, u64>,
    pub pools: BTreeMap<usize, Pool>,
    pub vmm: BTreeMap<u64, VmmHandle>,
    /// Reserved VA ranges: start → size.
    pub reservations: BTreeMap<u64, u64>,
    /// Mapped ranges: start → (size, handle).
    pub mappings: BTreeMap<u64, (u64, u64)>,
    /// Arrays and mipmapped arrays: handle → (device, bytes).
    pub arrays: BTreeMap<usize, (usize, u64)>,
    /// `FGPU_SIM_REUSE_VA=1`: freed linear ranges by size, handed out again last-in
    /// first-out, as a real driver's address allocator does (off by default: most tests
    /// read clearer with addresses that never repeat).
    pub reuse: Option<BTreeMap<u64, Vec<u64>>>,
    /// Function handle → the local memory a launch of it needs (`lmem_<N>mib` in its name).
    pub local_mem: BTreeMap<usize, u64>,
    /// Local memory held per device: grown by launches that need more, never shrunk (as the
    /// real driver does), charged like any allocation but through no allocation call.
    pub local_held: [u64; MAX_DEVICES],
}

static LOCAL: Mutex<Option<Local>> = Mutex::new(None);
static FORKED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

pub struct Guard(MutexGuard<'static, Option<Local>>);

impl std::ops::Deref for Guard {
    type Target = Local;
    fn deref(&self) -> &Local {
        self.0.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl std::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut Local {
        self.0.as_mut().unwrap_or_else(|| unreachable!())
    }
}

pub fn local() -> Guard {
    let mut g = LOCAL.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        let reuse = std::env::var_os("FGPU_SIM_REUSE_VA").is_some_and(|v| v == "1");
        *g = Some(Local {
            next_va: 2 << 20,
            next_handle: 0x10_0000,
            reuse: reuse.then(BTreeMap::new),
            ..Local::default()
        });
    }
    Guard(g)
}

extern "C" fn atfork_child() {
    FORKED.store(true, SeqCst);
    if let Some(s) = crate::state::shared_if_open() {
        s.close_in_child();
    }
}

/// Opens the shared state (cuInit / nvmlInit).
pub fn init() -> Option<&'static Shared> {
    if FORKED.load(SeqCst) {
        return None;
    }
    let s = shared()?;
    let mut l = local();
    if !l.initialized {
        l.initialized = true;
        // SAFETY: registering a plain extern "C" handler with no prepare/parent hooks.
        unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    }
    Some(s)
}

pub fn current_ctx() -> usize {
    CURRENT.with(Cell::get)
}

pub fn set_current_ctx(ctx: usize) {
    CURRENT.with(|c| c.set(ctx));
}

impl Local {
    pub fn handle(&mut self) -> usize {
        self.next_handle += 16;
        self.next_handle
    }

    /// A fresh device address range, unique across processes (slot in the high bits).
    pub fn va(&mut self, size: u64, align: u64) -> u64 {
        let align = align.max(ALIGN).next_power_of_two();
        let start = self.next_va.div_ceil(align) * align;
        self.next_va = start + size.max(1).div_ceil(ALIGN) * ALIGN;
        ((self.slot.unwrap_or(0) as u64 + 1) << VA_SHIFT) + start
    }

    /// A linear range of `size`: the last one freed of that size when addresses are reused,
    /// else a fresh one.
    pub fn linear_va(&mut self, size: u64) -> u64 {
        let again = self
            .reuse
            .as_mut()
            .and_then(|r| r.get_mut(&size))
            .and_then(Vec::pop);
        again.unwrap_or_else(|| self.va(size, ALIGN))
    }

    /// Gives a freed linear range back for [`Local::linear_va`] (when addresses are reused).
    pub fn release_va(&mut self, ptr: u64, size: u64) {
        if let Some(r) = self.reuse.as_mut() {
            r.entry(size).or_default().push(ptr);
        }
    }

    /// The device of the calling thread's current context.
    pub fn current_dev(&self) -> Result<usize, CUresult> {
        if !self.initialized || FORKED.load(SeqCst) {
            return Err(CUDA_ERROR_NOT_INITIALIZED);
        }
        ctx_dev(current_ctx())
            .filter(|&d| self.ctx_refs[d] > 0)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    pub fn charge(&self, dev: usize, bytes: u64) -> Result<(), CUresult> {
        let (Some(s), Some(slot)) = (shared(), self.slot) else {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        };
        if bytes == 0 || s.charge(slot, dev, bytes) {
            Ok(())
        } else {
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }

    pub fn uncharge(&self, dev: usize, bytes: u64) {
        if let (Some(s), Some(slot)) = (shared(), self.slot) {
            s.uncharge(slot, dev, bytes);
        }
    }
}

pub fn ctx_dev(ctx: usize) -> Option<usize> {
    let dev = ctx.checked_sub(CTX_BASE)?;
    (dev < MAX_DEVICES && shared().is_some_and(|s| dev < s.devices())).then_some(dev)
}
