//! Process-local bookkeeping: contexts, allocations, streams, events, modules, graphs.
//! Lives behind one mutex; none of this is on a hot path that matters in a simulator.

use crate::cuda::{
    CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_OUT_OF_MEMORY, CUresult,
};
use crate::data::Bytes;
use crate::state::{MAX_DEVICES, Shared, shared};
use std::cell::{Cell, RefCell};
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
    /// What was written into it (freed with it).
    pub data: Bytes,
}

impl Alloc {
    pub fn new(dev: usize, size: u64, kind: AllocKind) -> Alloc {
        Alloc {
            dev,
            size,
            kind,
            data: Bytes::default(),
        }
    }
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
    /// The physical memory's contents: they follow the handle to wherever it is mapped,
    /// and go when the handle does.
    pub data: Bytes,
}

/// One `cuMemMap`: `size` bytes of `handle`, from `offset` into it, and which devices may
/// read and write it (bit per device index; none until `cuMemSetAccess`, see `cuda::vmm`).
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    pub size: u64,
    pub handle: u64,
    pub offset: u64,
    pub read: u64,
    pub write: u64,
}

/// The object that holds a device address's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A linear allocation, by its start address.
    Linear(u64),
    /// A VMM physical allocation, by its handle.
    Physical(u64),
}

/// A device address resolved: its object and offset there, the allocation or mapping
/// that contains it (`base`, `size`), and the devices that may read and write it (every
/// device for a linear allocation: copies between devices are staged by the driver; a VMM
/// mapping's own access rights otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub backing: Backing,
    pub offset: u64,
    pub base: u64,
    pub size: u64,
    pub read: u64,
    pub write: u64,
}

impl Resolved {
    /// Bytes from the resolved address to the end of its allocation or mapping.
    pub fn left(&self, ptr: u64) -> u64 {
        self.base + self.size - ptr
    }
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
    /// Mapped ranges: start → mapping.
    pub mappings: BTreeMap<u64, Mapping>,
    /// Page-locked host memory (cuMemAllocHost, cuMemHostAlloc): address → size asked for.
    pub host: BTreeMap<usize, usize>,
    /// Per device: the primary context hit a sticky error (an illegal address); every later
    /// call on it fails with that error until the context is destroyed (see
    /// [`Local::current_dev`]).
    pub poisoned: [bool; MAX_DEVICES],
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
    /// The calling thread's current context: the top of its context stack.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    /// The contexts below the top of this thread's context stack (cuCtxPushCurrent).
    static BELOW: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
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

/// Pushes `ctx` onto this thread's context stack (it becomes current).
pub fn push_ctx(ctx: usize) {
    let below = current_ctx();
    if below != 0 {
        BELOW.with(|b| b.borrow_mut().push(below));
    }
    set_current_ctx(ctx);
}

/// Pops the current context: the one below it (or none) becomes current.
pub fn pop_ctx() -> usize {
    let top = current_ctx();
    set_current_ctx(BELOW.with(|b| b.borrow_mut().pop()).unwrap_or(0));
    top
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
    ///
    /// A context that hit an illegal address answers every call that needs it with
    /// CUDA_ERROR_ILLEGAL_ADDRESS from then on: the CUDA Driver API reference (Data types
    /// used by CUDA driver, `CUresult`) says of that error that it "leaves the process in an
    /// inconsistent state and any further CUDA work will return the same error". Modelled
    /// simply, as a flag per process and device ([`Local::poisoned`]) that every call going
    /// through here sees, cleared only when the primary context is destroyed (its last
    /// reference released).
    pub fn current_dev(&self) -> Result<usize, CUresult> {
        if !self.initialized || FORKED.load(SeqCst) {
            return Err(CUDA_ERROR_NOT_INITIALIZED);
        }
        let d = ctx_dev(current_ctx())
            .filter(|&d| self.ctx_refs[d] > 0)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if self.poisoned[d] {
            return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
        }
        Ok(d)
    }

    /// Resolves a device address through the linear allocations and the VMM mappings.
    /// A reserved but unmapped address, or a mapping whose handle is gone, resolves to
    /// nothing.
    pub fn resolve(&self, ptr: u64) -> Option<Resolved> {
        if let Some((&base, a)) = self.allocs.range(..=ptr).next_back()
            && ptr < base + a.size
        {
            return Some(Resolved {
                backing: Backing::Linear(base),
                offset: ptr - base,
                base,
                size: a.size,
                read: u64::MAX,
                write: u64::MAX,
            });
        }
        let (&base, m) = self.mappings.range(..=ptr).next_back()?;
        (ptr < base + m.size && self.vmm.contains_key(&m.handle)).then_some(Resolved {
            backing: Backing::Physical(m.handle),
            offset: m.offset + (ptr - base),
            base,
            size: m.size,
            read: m.read,
            write: m.write,
        })
    }

    /// Whether `ptr` is a device address of this process: allocated or mapped, inside a
    /// VA reservation, or anywhere in the range this process has handed out addresses from
    /// (a freed allocation's address is still a device address, not host memory).
    pub fn is_device_address(&self, ptr: u64) -> bool {
        let base = (self.slot.unwrap_or(0) as u64 + 1) << VA_SHIFT;
        self.resolve(ptr).is_some()
            || (base..base + self.next_va).contains(&ptr)
            || self
                .reservations
                .range(..=ptr)
                .next_back()
                .is_some_and(|(&s, &len)| ptr < s + len)
    }

    pub fn bytes(&self, b: Backing) -> Option<&Bytes> {
        match b {
            Backing::Linear(p) => self.allocs.get(&p).map(|a| &a.data),
            Backing::Physical(h) => self.vmm.get(&h).map(|v| &v.data),
        }
    }

    pub fn bytes_mut(&mut self, b: Backing) -> Option<&mut Bytes> {
        match b {
            Backing::Linear(p) => self.allocs.get_mut(&p).map(|a| &mut a.data),
            Backing::Physical(h) => self.vmm.get_mut(&h).map(|v| &mut v.data),
        }
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
