//! The launch entry points: `cuLaunchKernel`, `cuLaunchKernelEx`, `cuLaunchCooperativeKernel`,
//! `cuGraphLaunch`, each with `_ptsz` (docs/compute.md).
//!
//! They are handed out (dlsym, cuGetProcAddress) whether or not a limit is set, so that a
//! compute share set later (by the agent) reaches a running process. Fast path: ONE relaxed
//! atomic load of [`FAST`]`[entry]` — the real function while no launch is gated, 0
//! otherwise — and a tail call. Anything else goes to [`crate::gate::launch`].

#![allow(non_snake_case, clippy::too_many_arguments)]

use crate::alloc::real_or_3;
use crate::gate::{self, Kind};
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
/// launch goes through the gate.
pub fn publish(open: bool) {
    for (f, raw) in FAST.iter().zip(RAWS) {
        f.store(if open { raw.addr() } else { 0 }, Relaxed);
    }
}

/// The fast path: if `FAST[$i]` holds the real function, call it with the arguments as they
/// came (LLVM emits a tail jump).
macro_rules! fast {
    ($i:literal, $ty:ty, ($($a:ident),*)) => {
        let p = FAST[$i].load(Relaxed);
        if p != 0 {
            // SAFETY: FAST[$i] only ever holds 0 or the address the real dlsym returned for
            // this entry point (RAWS[$i]), whose C signature is $ty.
            let f = unsafe { std::mem::transmute::<usize, $ty>(p) };
            // SAFETY: forwarding the caller's arguments unchanged.
            return unsafe { f($($a),*) };
        }
    };
}

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

/// # Safety
/// The CUDA driver API contract of `cuLaunchKernel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: Params,
    extra: Params,
) -> CUresult {
    fast!(
        0,
        KernelFn,
        (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)
    );
    // SAFETY: forwarding the caller's arguments unchanged (same contract).
    unsafe { slow_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
}

/// The gated path of [`cuLaunchKernel`] (kept out of line so that the fast path is a tail jump).
///
/// # Safety
/// As for `cuLaunchKernel`.
#[cold]
#[inline(never)]
unsafe extern "C" fn slow_cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: Params,
    extra: Params,
) -> CUresult {
    let real = real_or_3!(real::CU_LAUNCH_KERNEL);
    gate::launch(Kind::Kernel, stream, false, || {
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
    })
}

/// # Safety
/// The CUDA driver API contract of `cuLaunchKernel_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: Params,
    extra: Params,
) -> CUresult {
    fast!(
        1,
        KernelFn,
        (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)
    );
    // SAFETY: forwarding the caller's arguments unchanged (same contract).
    unsafe { slow_cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
}

/// The gated path of [`cuLaunchKernel_ptsz`] (kept out of line so that the fast path is a tail jump).
///
/// # Safety
/// As for `cuLaunchKernel_ptsz`.
#[cold]
#[inline(never)]
unsafe extern "C" fn slow_cuLaunchKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: Params,
    extra: Params,
) -> CUresult {
    let real = real_or_3!(real::CU_LAUNCH_KERNEL_PTSZ);
    gate::launch(Kind::Kernel, stream, true, || {
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
    })
}

/// The stream of a `CUlaunchConfig` (NULL config: the driver will refuse the launch).
fn config_stream(config: *const LaunchConfigHead) -> Handle {
    if config.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a non-NULL CUlaunchConfig pointer from the caller (driver API contract).
    unsafe { (*config).stream }
}

/// # Safety
/// The CUDA driver API contract of `cuLaunchKernelEx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfigHead,
    f: Handle,
    params: Params,
    extra: Params,
) -> CUresult {
    fast!(2, KernelExFn, (config, f, params, extra));
    // SAFETY: forwarding the caller's arguments unchanged (same contract).
    unsafe { slow_cuLaunchKernelEx(config, f, params, extra) }
}

/// The gated path of [`cuLaunchKernelEx`] (kept out of line so that the fast path is a tail jump).
///
/// # Safety
/// As for `cuLaunchKernelEx`.
#[cold]
#[inline(never)]
unsafe extern "C" fn slow_cuLaunchKernelEx(
    config: *const LaunchConfigHead,
    f: Handle,
    params: Params,
    extra: Params,
) -> CUresult {
    let real = real_or_3!(real::CU_LAUNCH_KERNEL_EX);
    gate::launch(Kind::Kernel, config_stream(config), false, || {
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { real(config, f, params, extra) }
    })
}

/// # Safety
/// The CUDA driver API contract of `cuLaunchKernelEx_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfigHead,
    f: Handle,
    params: Params,
    extra: Params,
) -> CUresult {
    fast!(3, KernelExFn, (config, f, params, extra));
    // SAFETY: forwarding the caller's arguments unchanged (same contract).
    unsafe { slow_cuLaunchKernelEx_ptsz(config, f, params, extra) }
}

/// The gated path of [`cuLaunchKernelEx_ptsz`] (kept out of line so that the fast path is a tail jump).
///
/// # Safety
/// As for `cuLaunchKernelEx_ptsz`.
#[cold]
#[inline(never)]
unsafe extern "C" fn slow_cuLaunchKernelEx_ptsz(
    config: *const LaunchConfigHead,
    f: Handle,
    params: Params,
    extra: Params,
) -> CUresult {
    let real = real_or_3!(real::CU_LAUNCH_KERNEL_EX_PTSZ);
    gate::launch(Kind::Kernel, config_stream(config), true, || {
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { real(config, f, params, extra) }
    })
}

/// # Safety
/// The CUDA driver API contract of `cuLaunchCooperativeKernel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: Params,
) -> CUresult {
    fast!(
        4,
        CoopFn,
        (f, gx, gy, gz, bx, by, bz, shmem, stream, params)
    );
    // SAFETY: forwarding the caller's arguments unchanged (same contract).
    unsafe { slow_cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
}

/// The gated path of [`cuLaunchCooperativeKernel`] (kept out of line so that the fast path is a tail jump).
///
/// # Safety
/// As for `cuLaunchCooperativeKernel`.
#[cold]
#[inline(never)]
unsafe extern "C" fn slow_cuLaunchCooperativeKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: Params,
) -> CUresult {
    let real = real_or_3!(real::CU_LAUNCH_COOPERATIVE_KERNEL);
    gate::launch(Kind::Kernel, stream, false, || {
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
    })
}

/// # Safety
/// The CUDA driver API contract of `cuLaunchCooperativeKernel_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: Params,
) -> CUresult {
    fast!(
        5,
        CoopFn,
        (f, gx, gy, gz, bx, by, bz, shmem, stream, params)
    );
    // SAFETY: forwarding the caller's arguments unchanged (same contract).
    unsafe { slow_cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
}

/// The gated path of [`cuLaunchCooperativeKernel_ptsz`] (kept out of line so that the fast path is a tail jump).
///
/// # Safety
/// As for `cuLaunchCooperativeKernel_ptsz`.
#[cold]
#[inline(never)]
unsafe extern "C" fn slow_cuLaunchCooperativeKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: Params,
) -> CUresult {
    let real = real_or_3!(real::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ);
    gate::launch(Kind::Kernel, stream, true, || {
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
    })
}

/// # Safety
/// The CUDA driver API contract of `cuGraphLaunch`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: Handle, stream: Handle) -> CUresult {
    fast!(6, GraphFn, (exec, stream));
    // SAFETY: forwarding the caller's arguments unchanged (same contract).
    unsafe { slow_cuGraphLaunch(exec, stream) }
}

/// The gated path of [`cuGraphLaunch`] (kept out of line so that the fast path is a tail jump).
///
/// # Safety
/// As for `cuGraphLaunch`.
#[cold]
#[inline(never)]
unsafe extern "C" fn slow_cuGraphLaunch(exec: Handle, stream: Handle) -> CUresult {
    let real = real_or_3!(real::CU_GRAPH_LAUNCH);
    gate::launch(Kind::Graph, stream, false, || {
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { real(exec, stream) }
    })
}

/// # Safety
/// The CUDA driver API contract of `cuGraphLaunch_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: Handle, stream: Handle) -> CUresult {
    fast!(7, GraphFn, (exec, stream));
    // SAFETY: forwarding the caller's arguments unchanged (same contract).
    unsafe { slow_cuGraphLaunch_ptsz(exec, stream) }
}

/// The gated path of [`cuGraphLaunch_ptsz`] (kept out of line so that the fast path is a tail jump).
///
/// # Safety
/// As for `cuGraphLaunch_ptsz`.
#[cold]
#[inline(never)]
unsafe extern "C" fn slow_cuGraphLaunch_ptsz(exec: Handle, stream: Handle) -> CUresult {
    let real = real_or_3!(real::CU_GRAPH_LAUNCH_PTSZ);
    gate::launch(Kind::Graph, stream, true, || {
        // SAFETY: forwarding the caller's arguments unchanged.
        unsafe { real(exec, stream) }
    })
}
