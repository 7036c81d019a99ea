//! The HIP runtime API (`libamdhip64.so`), a thin personality over the CUDA simulation: the
//! same shared state file, so HIP and CUDA processes see (and are seen by) the same devices,
//! memory, processes and device timeline.
//!
//! HIP has no explicit contexts: every call works on the calling thread's current device
//! (`hipSetDevice`, default 0), whose primary context is retained on first use (the context
//! overhead is charged then, as for CUDA). HIP ordinals are positions in the visible list:
//! `ROCR_VISIBLE_DEVICES` selects physical devices (indices or `GPU-<uuid hex>`), then
//! `HIP_VISIBLE_DEVICES` selects among those (indices). Error codes are HIP's, which for
//! every code used here equal CUDA's (hipErrorOutOfMemory = 2).

pub mod amdsmi;
pub mod device;
pub mod exec;
pub mod memory;
pub mod smi;

use crate::cuda::{self, CUresult, context};
use crate::process::{CTX_BASE, init};
use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

pub type HipError = i32;
pub const HIP_SUCCESS: HipError = 0;
pub const HIP_ERROR_INVALID_VALUE: HipError = 1;
pub const HIP_ERROR_NOT_INITIALIZED: HipError = 3;
pub const HIP_ERROR_NO_DEVICE: HipError = 100;
pub const HIP_ERROR_INVALID_DEVICE: HipError = 101;
pub const HIP_ERROR_INVALID_DEVICE_FUNCTION: HipError = 98;
pub const HIP_ERROR_NOT_FOUND: HipError = 500;

thread_local! {
    static DEVICE: Cell<i32> = const { Cell::new(0) };
}

/// Physical devices whose primary context this process retained through HIP.
static RETAINED: AtomicU64 = AtomicU64::new(0);

/// Physical device indices in HIP ordinal order.
pub fn visible() -> &'static [usize] {
    static VISIBLE: OnceLock<Vec<usize>> = OnceLock::new();
    VISIBLE.get_or_init(|| {
        let n = crate::state::shared().map_or(0, crate::state::Shared::devices);
        let all: Vec<usize> = (0..n).collect();
        let rocr = select(&all, std::env::var("ROCR_VISIBLE_DEVICES").ok().as_deref());
        select(&rocr, std::env::var("HIP_VISIBLE_DEVICES").ok().as_deref())
    })
}

/// Applies a visibility list (indices into `from`, or `GPU-<hex>` UUID prefixes) to `from`;
/// an entry that matches nothing ends the list, as the real runtimes do.
fn select(from: &[usize], list: Option<&str>) -> Vec<usize> {
    let Some(list) = list else {
        return from.to_vec();
    };
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim) {
        let hit = if let Some(hex) = item.strip_prefix("GPU-") {
            from.iter().copied().find(|&p| {
                device::uuid_hex(p).starts_with(&hex.to_ascii_lowercase()) && !hex.is_empty()
            })
        } else {
            item.parse::<usize>()
                .ok()
                .and_then(|i| from.get(i).copied())
        };
        match hit {
            Some(p) if !out.contains(&p) => out.push(p),
            _ => break,
        }
    }
    out
}

/// The CUDA ordinal of physical device `phys` in this process: the HIP layer calls the CUDA
/// simulation's entry points, which take CUDA ordinals (after `CUDA_VISIBLE_DEVICES`, which
/// the real HIP runtime also honours). A device hidden from CUDA is invalid for HIP too.
pub fn cuda_ord(phys: usize) -> Result<i32, HipError> {
    crate::cuda::device::ordinal_of(phys).ok_or(HIP_ERROR_INVALID_DEVICE)
}

/// The physical device of HIP ordinal `ord`.
pub fn physical(ord: i32) -> Result<usize, HipError> {
    usize::try_from(ord)
        .ok()
        .and_then(|o| visible().get(o).copied())
        .ok_or(HIP_ERROR_INVALID_DEVICE)
}

pub fn current_ordinal() -> i32 {
    DEVICE.with(Cell::get)
}

pub fn set_current_ordinal(ord: i32) {
    DEVICE.with(|d| d.set(ord));
}

/// Initialises the runtime (as hipInit does implicitly on first use).
pub fn initialize() -> Result<(), HipError> {
    init().map(|_| ()).ok_or(HIP_ERROR_NOT_INITIALIZED)?;
    if visible().is_empty() {
        return Err(HIP_ERROR_NO_DEVICE);
    }
    Ok(())
}

/// Every device call starts here: the runtime initialised, the current device's primary
/// context retained and current on this thread. Returns the physical device.
pub fn enter() -> Result<usize, HipError> {
    initialize()?;
    let dev = physical(current_ordinal())?;
    if RETAINED.load(SeqCst) & (1 << dev) == 0 {
        let mut ctx = 0usize;
        let ord = cuda_ord(dev)?;
        let rc = context::cu_device_primary_ctx_retain(&mut ctx, ord);
        if rc != cuda::CUDA_SUCCESS {
            return Err(rc);
        }
        if RETAINED.fetch_or(1 << dev, SeqCst) & (1 << dev) != 0 {
            // Another thread retained it meanwhile: keep one reference.
            context::cu_device_primary_ctx_release(ord);
        }
    }
    context::cu_ctx_set_current(CTX_BASE + dev);
    Ok(dev)
}

/// Runs `f` after [`enter`], passing its CUDA result through as the HIP one.
pub fn call(f: impl FnOnce(usize) -> CUresult) -> HipError {
    match enter() {
        Ok(dev) => f(dev),
        Err(e) => e,
    }
}

const ERRORS: &[(HipError, &str)] = &[
    (0, "hipSuccess\0"),
    (1, "hipErrorInvalidValue\0"),
    (2, "hipErrorOutOfMemory\0"),
    (3, "hipErrorNotInitialized\0"),
    (98, "hipErrorInvalidDeviceFunction\0"),
    (100, "hipErrorNoDevice\0"),
    (101, "hipErrorInvalidDevice\0"),
    (201, "hipErrorInvalidContext\0"),
    (400, "hipErrorInvalidHandle\0"),
    (401, "hipErrorIllegalState\0"),
    (500, "hipErrorNotFound\0"),
    (600, "hipErrorNotReady\0"),
];

pub extern "C" fn get_error_name(code: HipError) -> *const std::ffi::c_char {
    ERRORS
        .iter()
        .find(|e| e.0 == code)
        .map_or("hipErrorUnknown\0", |e| e.1)
        .as_ptr()
        .cast()
}
