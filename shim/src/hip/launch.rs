//! HIP's launch entry points — `hipLaunchKernel`, `hipLaunchKernel_spt`,
//! `hipModuleLaunchKernel`, `hipExtLaunchKernel`, `hipGraphLaunch`, `hipGraphLaunch_spt` —
//! through the same gate as CUDA's (crate::gate, docs/compute.md, "HIP").
//!
//! As for CUDA (crate::cuda::launch) they are handed out (exported names, dlsym,
//! hipGetProcAddress) whether or not a limit is set, so that a compute share set later by the
//! agent reaches a running process. Fast path: ONE relaxed atomic load of [`FAST`]`[entry]` —
//! the real function while no launch is gated, 0 otherwise — and a call. Anything else goes
//! to [`gated`]. Streams: the null stream (0) is the current device's default stream,
//! `hipStreamPerThread` (2) — or 0 in `_spt` entries — the calling thread's.
//!
//! `FGPU_HIP=off` makes them pass straight through; a launch that the runtime makes from
//! inside one of our HIP wrappers (its own exported entry point) is not gated either.

#![allow(non_snake_case, clippy::too_many_arguments)]

use crate::cuda::launch::{fast, launch_entry};
use crate::gate::{self, Api, Kind};
use crate::real::hip::{self as real, Dim3, HipError};
use crate::real::real_or_3;
use crate::real::{Handle, Raw};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};

type Params = *mut *mut c_void;

const N: usize = 6;

/// Per entry point: the real function while no launch is gated (call it straight away), 0
/// while the gate decides (unknown yet, or gated).
static FAST: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];

macro_rules! entries {
    ($($real:ident => $wrapper:ident,)*) => {
        const RAWS: [&Raw; N] = [$(&real::$real.raw),*];

        /// (our wrapper, the real entry) for an exported HIP launch name.
        pub fn wrapper_by_name(name: &[u8]) -> Option<(usize, &'static Raw)> {
            $(
                if name == real::$real.raw.name.to_bytes() {
                    return Some(($wrapper as *const () as usize, &real::$real.raw));
                }
            )*
            None
        }

        /// Our wrapper for a real HIP launch entry point's address.
        pub fn wrapper_by_real(p: usize) -> Option<usize> {
            $(
                if p != 0 && p == real::$real.raw.loaded() {
                    return Some($wrapper as *const () as usize);
                }
            )*
            None
        }
    };
}

entries! {
    HIP_LAUNCH_KERNEL => hipLaunchKernel,
    HIP_LAUNCH_KERNEL_SPT => hipLaunchKernel_spt,
    HIP_MODULE_LAUNCH_KERNEL => hipModuleLaunchKernel,
    HIP_EXT_LAUNCH_KERNEL => hipExtLaunchKernel,
    HIP_GRAPH_LAUNCH => hipGraphLaunch,
    HIP_GRAPH_LAUNCH_SPT => hipGraphLaunch_spt,
}

/// `open`: no launch is gated, entry points call the runtime straight away; otherwise every
/// launch goes through the gate. Only entry points already resolved are opened (a process
/// without HIP pays no library lookup here); the others open at their first call.
pub fn publish(open: bool) {
    let open = open || super::off();
    for (f, raw) in FAST.iter().zip(RAWS) {
        let p = if open && raw.loaded() != 0 {
            raw.callable()
        } else {
            0
        };
        f.store(p, Relaxed);
    }
}

/// Opens entry `i`'s fast path if nothing is gated (its first call after the gate decided, or
/// with `FGPU_HIP=off`). If the gate turned on meanwhile (a concurrent [`publish`]), the slot
/// is closed again.
fn open_late(i: usize) {
    let p = RAWS[i].callable();
    if p == 0 || FAST[i].compare_exchange(0, p, SeqCst, SeqCst).is_err() {
        return;
    }
    if gate::enabled() && !super::off() {
        FAST[i].store(0, SeqCst);
    }
}

/// The gated path shared by every entry point: `call` makes the real launch.
fn gated(
    i: usize,
    kind: Kind,
    stream: Handle,
    spt: bool,
    call: impl FnOnce() -> HipError,
) -> HipError {
    if super::off() {
        open_late(i);
        return call();
    }
    if super::inside() {
        return call(); // the runtime calling its own entry point from inside ours
    }
    if !gate::enabled() {
        open_late(i);
        return call();
    }
    // Runtime calls that the gate's own HIP calls make through exported names pass straight
    // through (crate::hip::guarded).
    super::nested(|| gate::launch_on(Api::Hip, kind, stream, spt, call))
}

type KernelFn = unsafe extern "C" fn(*const c_void, Dim3, Dim3, Params, usize, Handle) -> HipError;
type ExtFn = unsafe extern "C" fn(
    *const c_void,
    Dim3,
    Dim3,
    Params,
    usize,
    Handle,
    Handle,
    Handle,
    c_int,
) -> HipError;
type ModuleFn = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    Params,
    Params,
) -> HipError;
type GraphFn = unsafe extern "C" fn(Handle, Handle) -> HipError;

launch_entry!(0 hipLaunchKernel / slow_hipLaunchKernel: KernelFn = HIP_LAUNCH_KERNEL -> HipError,
    Kind::Kernel, spt false, stream stream,
    (f: *const c_void, grid: Dim3, block: Dim3, args: Params, shmem: usize, stream: Handle));
launch_entry!(1 hipLaunchKernel_spt / slow_hipLaunchKernel_spt: KernelFn = HIP_LAUNCH_KERNEL_SPT -> HipError,
    Kind::Kernel, spt true, stream stream,
    (f: *const c_void, grid: Dim3, block: Dim3, args: Params, shmem: usize, stream: Handle));
launch_entry!(2 hipModuleLaunchKernel / slow_hipModuleLaunchKernel: ModuleFn = HIP_MODULE_LAUNCH_KERNEL -> HipError,
    Kind::Kernel, spt false, stream stream,
    (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shmem: c_uint, stream: Handle, params: Params, extra: Params));
launch_entry!(3 hipExtLaunchKernel / slow_hipExtLaunchKernel: ExtFn = HIP_EXT_LAUNCH_KERNEL -> HipError,
    Kind::Kernel, spt false, stream stream,
    (f: *const c_void, grid: Dim3, block: Dim3, args: Params, shmem: usize, stream: Handle,
     start: Handle, stop: Handle, flags: c_int));
launch_entry!(4 hipGraphLaunch / slow_hipGraphLaunch: GraphFn = HIP_GRAPH_LAUNCH -> HipError,
    Kind::Graph, spt false, stream stream, (exec: Handle, stream: Handle));
launch_entry!(5 hipGraphLaunch_spt / slow_hipGraphLaunch_spt: GraphFn = HIP_GRAPH_LAUNCH_SPT -> HipError,
    Kind::Graph, spt true, stream stream, (exec: Handle, stream: Handle));
