//! HIP (AMD): the same memory limits for programs on AMD's HIP runtime (`libamdhip64.so`) and
//! the same memory answers for ROCm SMI (`librocm_smi64.so`, used by `rocm-smi`). See
//! docs/amd.md.
//!
//! Every HIP allocation path reserves in the same ledger as CUDA's (crate::account) before
//! the runtime is called and releases if it failed; refusals return exactly
//! `hipErrorOutOfMemory` (2). HIP devices are bound to ledger records by the 16 bytes of
//! `hipDeviceGetUuid`, and HIP ordinals (after `HIP_VISIBLE_DEVICES` / `ROCR_VISIBLE_DEVICES`,
//! which the runtime applies) index `FGPU_MEMORY_LIMIT`'s per-device list.
//!
//! Re-entrancy: with LD_PRELOAD our exported `hip*` names also capture calls that the HIP
//! runtime makes to its own exported functions (ROCm 7 resolves some of its internal calls
//! through its dynamic symbol table). A per-thread guard makes such a nested call pass
//! straight to the real function, so it is neither counted twice nor recursed into.
//! `FGPU_HIP=off` turns all of it off (HIP calls pass through; the kernel backstop remains).
//!
//! - [`real`]: the real entry points; [`alloc`]: linear, pitched, managed and stream-ordered
//!   allocations and frees; [`vmm`]: hipMemCreate/Map/Unmap/Release and arrays; [`info`]:
//!   hipMemGetInfo, hipDeviceTotalMem and the SMI answers; [`gpa`]: hipGetProcAddress and the
//!   table of wrapped names; [`launch`]: the launch entry points, gated like CUDA's
//!   (crate::gate).

pub mod alloc;
pub mod amdsmi;
pub mod gpa;
pub mod info;
pub mod launch;
pub mod vmm;

use crate::account::{self, Charge};
use crate::config::MAX_ORDINALS;
use crate::ledger;
use crate::real::hip as real;
use fgpu_common::ledger::Denied;
use fgpu_common::ledger::Ledger;
use std::cell::Cell;
use std::ffi::c_int;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

pub use gpa::wrapper_by_name;

/// HIP ordinal → ledger device index + 1 (0: not known yet).
static ORD_IDX: [AtomicU32; MAX_ORDINALS] = [const { AtomicU32::new(0) }; MAX_ORDINALS];

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// `FGPU_HIP=off`: every HIP and SMI wrapper passes straight through.
pub fn off() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| {
        std::env::var("FGPU_HIP").is_ok_and(|v| v.trim().eq_ignore_ascii_case("off"))
    })
}

/// Whether HIP calls are accounted: the shim is active and `FGPU_HIP` is not `off`.
pub fn enabled() -> bool {
    !off() && crate::ledger::active()
}

/// Whether this thread is inside one of our HIP wrappers (a HIP call arriving now is the
/// runtime's own).
pub fn inside() -> bool {
    INSIDE.with(Cell::get)
}

/// Runs `f` marked as inside our HIP wrappers (see [`guarded`]).
pub fn nested<R>(f: impl FnOnce() -> R) -> R {
    let was = INSIDE.with(|i| i.replace(true));
    let r = f();
    INSIDE.with(|i| i.set(was));
    r
}

/// Runs `accounted` unless this thread is already inside one of our HIP wrappers (then
/// `direct`: the runtime calling its own exported entry point).
pub fn guarded<R>(direct: impl FnOnce() -> R, accounted: impl FnOnce() -> R) -> R {
    if INSIDE.with(Cell::get) || !enabled() {
        return direct();
    }
    INSIDE.with(|i| i.set(true));
    let r = accounted();
    INSIDE.with(|i| i.set(false));
    r
}

/// What the gate needs of HIP (registered by lib.rs at load time).
pub static GATE_API: crate::gate::GateApi = crate::gate::GateApi {
    current_ordinal,
    dev_index,
    stream_is_capturing: &real::HIP_STREAM_IS_CAPTURING,
    exchange_capture_mode: &real::HIP_THREAD_EXCHANGE_STREAM_CAPTURE_MODE,
    event_create: &real::HIP_EVENT_CREATE_WITH_FLAGS,
    event_destroy: &real::HIP_EVENT_DESTROY,
    event_record: &real::HIP_EVENT_RECORD,
    event_query: &real::HIP_EVENT_QUERY,
    event_elapsed_time: &[&real::HIP_EVENT_ELAPSED_TIME],
    stream_query: &real::HIP_STREAM_QUERY,
    context: crate::gate::Contexts::Device {
        set_device: &real::HIP_SET_DEVICE,
    },
};

/// The calling thread's current HIP device.
pub fn current_ordinal() -> Option<c_int> {
    let f = real::HIP_GET_DEVICE.get()?;
    let mut d: c_int = -1;
    // SAFETY: hipGetDevice(int *) with a valid out-pointer.
    let rc = unsafe { f(&mut d) };
    (rc == 0 && d >= 0).then_some(d)
}

/// The ledger record of HIP device `ord`, bound by its HIP UUID on first use.
pub fn dev_index(l: &Ledger, ord: c_int) -> Option<usize> {
    let o = usize::try_from(ord).ok().filter(|&o| o < MAX_ORDINALS)?;
    if let n @ 1.. = ORD_IDX[o].load(SeqCst) {
        return Some(n as usize - 1);
    }
    let f = real::HIP_DEVICE_GET_UUID.get()?;
    let mut u = [0u8; 16];
    // SAFETY: hipDeviceGetUuid(hipUUID *, int): a 16-byte out-buffer.
    if unsafe { f(&mut u, ord) } != 0 {
        return None;
    }
    let idx = l.device_index(&u);
    match idx {
        Some(i) => {
            ORD_IDX[o].store(i as u32 + 1, SeqCst);
            charge_context(i);
        }
        None => crate::log::error!("too many devices: HIP device {ord} is not accounted"),
    }
    idx
}

/// Ledger records whose HIP context overhead this process has charged (bit per record).
static CONTEXT_CHARGED: AtomicU32 = AtomicU32::new(0);

/// Charges `FGPU_CONTEXT_OVERHEAD` once per process and device, when the process first uses
/// the device through HIP (nothing measures a HIP context: without the variable, 0). Like
/// CUDA's overhead it is charged even over the limit (the memory is in use).
fn charge_context(idx: usize) {
    let Some(n) = crate::config::get().context_overhead else {
        return;
    };
    if CONTEXT_CHARGED.fetch_or(1 << idx, SeqCst) & (1 << idx) != 0 {
        return;
    }
    if let Some((l, slot)) = ledger::get() {
        l.charge(idx, slot, n);
        l.slots[slot].overhead[idx].fetch_add(n, SeqCst);
    }
}

/// Reserves `bytes` on HIP device `ord` (None: the current device) for `api`.
/// Ok(None): nothing to account; Err: denied (the caller returns hipErrorOutOfMemory).
pub fn reserve(api: &str, ord: Option<c_int>, bytes: u64) -> Result<Option<Charge>, Denied> {
    let Some(ord) = ord.or_else(current_ordinal) else {
        return Ok(None);
    };
    crate::ledger::tick();
    let Some((l, slot)) = ledger::get() else {
        return Ok(None);
    };
    let Some(idx) = dev_index(l, ord) else {
        return Ok(None);
    };
    account::reserve_at(api, (l, slot), ord, idx, bytes, |_| {})
}

/// Reads a pointer the runtime just wrote through `p` (NULL-safe).
pub fn read_ptr<T>(p: *const *mut T) -> *mut T {
    if p.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: non-NULL out-pointer the runtime just wrote (HIP API contract).
    unsafe { p.read_unaligned() }
}
