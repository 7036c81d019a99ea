//! The launch entry points: `cuLaunchKernel`, `cuLaunchKernelEx`, `cuLaunchCooperativeKernel`,
//! `cuGraphLaunch`, each with `_ptsz` (docs/compute.md).
//!
//! They are handed out (dlsym, cuGetProcAddress) whether or not a limit is set, so that a
//! compute share set later (by the agent) reaches a running process. Fast path: ONE relaxed
//! atomic load of [`FAST`]`[entry]` — the real function while no launch is gated, 0
//! otherwise — and a tail call. Anything else goes to [`crate::gate::launch`].

#![allow(non_snake_case, clippy::too_many_arguments)]

use crate::gate::{self, Kind};
use crate::real::real_or_3;
use crate::real::{self, CUresult, Handle, LaunchConfigHead, Raw};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

type Params = *mut *mut c_void;

const N: usize = 8;

/// Per entry point: the real function while no launch is gated (call it straight away), 0
/// while the gate decides (unknown yet, or gated).
static FAST: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];

macro_rules! entries {
    ($($i:literal $real:ident => $wrapper:ident,)*) => {
        const RAWS: [&Raw; N] = [$(&real::$real.raw),*];

        /// (our wrapper, the real entry) for an exported launch name.
        pub fn wrapper_by_name(name: &[u8]) -> Option<(usize, &'static Raw)> {
            $(
                if name == real::$real.raw.name.to_bytes() {
                    return Some(($wrapper as *const () as usize, &real::$real.raw));
                }
            )*
            None
        }

        /// Every launch entry point with the wrapper its inline hook diverts to.
        pub fn hook_entries() -> [(&'static Raw, usize); N] {
            [$((&real::$real.raw, $wrapper as *const () as usize)),*]
        }

        /// Our wrapper for a real launch entry point's address.
        pub fn wrapper_by_real(p: usize) -> Option<usize> {
            $(
                if p == real::$real.raw.loaded() {
                    return Some($wrapper as *const () as usize);
                }
            )*
            None
        }
    };
}

entries! {
    0 CU_LAUNCH_KERNEL => cuLaunchKernel,
    1 CU_LAUNCH_KERNEL_PTSZ => cuLaunchKernel_ptsz,
    2 CU_LAUNCH_KERNEL_EX => cuLaunchKernelEx,
    3 CU_LAUNCH_KERNEL_EX_PTSZ => cuLaunchKernelEx_ptsz,
    4 CU_LAUNCH_COOPERATIVE_KERNEL => cuLaunchCooperativeKernel,
    5 CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ => cuLaunchCooperativeKernel_ptsz,
    6 CU_GRAPH_LAUNCH => cuGraphLaunch,
    7 CU_GRAPH_LAUNCH_PTSZ => cuGraphLaunch_ptsz,
}

/// `open`: no launch is gated, entry points call the driver straight away; otherwise every
/// launch goes through the gate. Called by the gate (through the callback lib.rs registers,
/// with crate::hip::launch::publish).
pub fn publish(open: bool) {
    for (f, raw) in FAST.iter().zip(RAWS) {
        f.store(if open { raw.callable() } else { 0 }, Relaxed);
    }
}

/// The entry points' call addresses changed (inline hooks installed): an open fast path
/// must call the trampolines from now on, never the hooked entry points (which lead back
/// to the wrappers).
pub fn refresh() {
    for (f, raw) in FAST.iter().zip(RAWS) {
        if f.load(Relaxed) != 0 {
            f.store(raw.callable(), Relaxed);
        }
    }
}

/// The fast path: if `FAST[$i]` holds the real function, call it with the arguments as they
/// came (LLVM emits a tail jump). `FAST` is the calling module's (this one's for CUDA,
/// crate::hip::launch's for HIP).
macro_rules! fast {
    ($i:literal, $ty:ty, ($($a:ident),*)) => {
        let p = FAST[$i].load(Relaxed);
        if p != 0 {
            // SAFETY: FAST[$i] only ever holds 0 or the address to call for this entry point
            // (RAWS[$i]: the driver's or runtime's function, or its hook's trampoline), whose
            // C signature is $ty.
            let f = unsafe { std::mem::transmute::<usize, $ty>(p) };
            // SAFETY: forwarding the caller's arguments unchanged.
            return unsafe { f($($a),*) };
        }
    };
}
pub(crate) use fast;

type KernelFn = unsafe extern "C" fn(
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
) -> CUresult;
type KernelExFn = unsafe extern "C" fn(*const LaunchConfigHead, Handle, Params, Params) -> CUresult;
type CoopFn = unsafe extern "C" fn(
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
) -> CUresult;
type GraphFn = unsafe extern "C" fn(Handle, Handle) -> CUresult;

/// The stream of a `CUlaunchConfig` (NULL config: the driver will refuse the launch).
fn config_stream(config: *const LaunchConfigHead) -> Handle {
    if config.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a non-NULL CUlaunchConfig pointer from the caller (driver API contract).
    unsafe { (*config).stream }
}

/// One launch entry point: the exported wrapper (fast path: [`fast!`], then a tail call of
/// the real function) and its gated path, kept out of line so that the fast path stays a
/// tail jump. The gated path calls the calling module's `gated(entry, kind, stream,
/// per_thread, call)` (this one's for CUDA, crate::hip::launch's for HIP).
macro_rules! launch_entry {
    ($i:literal $name:ident / $slow:ident: $ty:ty = $real:ident -> $ret:ty, $kind:expr,
     $_per_thread:ident $pt:literal, stream $stream:expr, ($($a:ident: $t:ty),*)) => {
        /// # Safety
        /// The driver or runtime API contract of the entry point of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $ret {
            fast!($i, $ty, ($($a),*));
            // SAFETY: forwarding the caller's arguments unchanged (same contract).
            unsafe { $slow($($a),*) }
        }

        /// The gated path of the entry point.
        ///
        /// # Safety
        /// As for the exported entry point.
        #[cold]
        #[inline(never)]
        unsafe extern "C" fn $slow($($a: $t),*) -> $ret {
            let real = real_or_3!(real::$real);
            gated($i, $kind, $stream, $pt, || {
                // SAFETY: forwarding the caller's arguments unchanged.
                unsafe { real($($a),*) }
            })
        }
    };
}
pub(crate) use launch_entry;

/// The gated path shared by every CUDA entry point (`ptsz`: stream 0 is the per-thread
/// stream); `call` makes the real launch.
#[inline(always)]
fn gated(
    _entry: usize,
    kind: Kind,
    stream: Handle,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    gate::launch(kind, stream, ptsz, call)
}

launch_entry!(0 cuLaunchKernel / slow_cuLaunchKernel: KernelFn = CU_LAUNCH_KERNEL -> CUresult,
    Kind::Kernel, ptsz false, stream stream,
    (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shmem: c_uint, stream: Handle, params: Params, extra: Params));
launch_entry!(1 cuLaunchKernel_ptsz / slow_cuLaunchKernel_ptsz: KernelFn = CU_LAUNCH_KERNEL_PTSZ -> CUresult,
    Kind::Kernel, ptsz true, stream stream,
    (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shmem: c_uint, stream: Handle, params: Params, extra: Params));
launch_entry!(2 cuLaunchKernelEx / slow_cuLaunchKernelEx: KernelExFn = CU_LAUNCH_KERNEL_EX -> CUresult,
    Kind::Kernel, ptsz false, stream config_stream(config),
    (config: *const LaunchConfigHead, f: Handle, params: Params, extra: Params));
launch_entry!(3 cuLaunchKernelEx_ptsz / slow_cuLaunchKernelEx_ptsz: KernelExFn = CU_LAUNCH_KERNEL_EX_PTSZ -> CUresult,
    Kind::Kernel, ptsz true, stream config_stream(config),
    (config: *const LaunchConfigHead, f: Handle, params: Params, extra: Params));
launch_entry!(4 cuLaunchCooperativeKernel / slow_cuLaunchCooperativeKernel: CoopFn = CU_LAUNCH_COOPERATIVE_KERNEL -> CUresult,
    Kind::Kernel, ptsz false, stream stream,
    (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shmem: c_uint, stream: Handle, params: Params));
launch_entry!(5 cuLaunchCooperativeKernel_ptsz / slow_cuLaunchCooperativeKernel_ptsz: CoopFn = CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ -> CUresult,
    Kind::Kernel, ptsz true, stream stream,
    (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shmem: c_uint, stream: Handle, params: Params));
launch_entry!(6 cuGraphLaunch / slow_cuGraphLaunch: GraphFn = CU_GRAPH_LAUNCH -> CUresult,
    Kind::Graph, ptsz false, stream stream, (exec: Handle, stream: Handle));
launch_entry!(7 cuGraphLaunch_ptsz / slow_cuGraphLaunch_ptsz: GraphFn = CU_GRAPH_LAUNCH_PTSZ -> CUresult,
    Kind::Graph, ptsz true, stream stream, (exec: Handle, stream: Handle));
