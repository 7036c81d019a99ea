//! Kernels, streams, events, graphs and synchronisation through HIP, on the same device
//! timeline as CUDA's launches.
//!
//! Kernels reach the simulator the way hipcc-built programs register them: a fat binary
//! (`__hipRegisterFatBinary`, any bytes) and its functions (`__hipRegisterFunction`, host stub
//! address → device function name); a kernel's duration follows its name
//! ([`crate::timeline::kernel_duration_ns`]). `hipModuleLoadData` + `hipModuleGetFunction`
//! work as with CUDA.

use super::*;
use crate::cuda::{context as cuctx, launch as cu, stream};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Events this process created and recorded through HIP, and records into a capturing
/// stream (which do nothing): what `fgpuSimHipEventStats` reports, so that tests can see
/// every event call anyone in the process made (a preloaded shim's included).
static EVENTS_CREATED: AtomicU64 = AtomicU64::new(0);
static EVENTS_RECORDED: AtomicU64 = AtomicU64::new(0);
static RECORDS_INTO_CAPTURE: AtomicU64 = AtomicU64::new(0);

/// Host stub address → simulated function handle.
static KERNELS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

/// `dim3`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

/// `__hipRegisterFatBinary(const void *data)` → the module list (a module handle here).
pub extern "C" fn hip_register_fat_binary(_data: *const c_void) -> *mut c_void {
    let mut m = 0usize;
    match call(|_| cu::cu_module_load_data(&mut m, std::ptr::null())) {
        HIP_SUCCESS => m as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}

/// `__hipRegisterFunction(modules, hostFunction, deviceFunction, deviceName, threadLimit,
/// tid, bid, blockDim, gridDim, wSize)`.
#[allow(clippy::too_many_arguments)]
pub extern "C" fn hip_register_function(
    modules: *mut c_void,
    host: *const c_void,
    device_function: *const c_char,
    _device_name: *const c_char,
    _thread_limit: u32,
    _tid: *mut c_void,
    _bid: *mut c_void,
    _block: *mut c_void,
    _grid: *mut c_void,
    _wsize: *mut i32,
) {
    let mut f = 0usize;
    if cu::cu_module_get_function(&mut f, modules as usize, device_function) == 0 {
        KERNELS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(host as usize, f);
    }
}

pub extern "C" fn hip_unregister_fat_binary(modules: *mut c_void) {
    cu::cu_module_unload(modules as usize);
}

fn registered(host: *const c_void) -> Option<usize> {
    KERNELS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(host as usize))
        .copied()
}

fn launch_registered(host: *const c_void, grid: Dim3, block: Dim3, stream: usize) -> HipError {
    call(|_| match registered(host) {
        Some(f) => cu::cu_launch_kernel(
            f,
            grid.x,
            grid.y,
            grid.z,
            block.x,
            block.y,
            block.z,
            0,
            stream,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ),
        None => HIP_ERROR_INVALID_DEVICE_FUNCTION,
    })
}

/// `hipLaunchKernel(function_address, numBlocks, dimBlocks, args, sharedMemBytes, stream)`.
pub extern "C" fn hip_launch_kernel(
    host: *const c_void,
    grid: Dim3,
    block: Dim3,
    _args: *mut *mut c_void,
    _shared: usize,
    stream: usize,
) -> HipError {
    launch_registered(host, grid, block, stream)
}

/// `hipExtLaunchKernel(..., stream, startEvent, stopEvent, flags)`: the events (if any)
/// are recorded around the kernel.
#[allow(clippy::too_many_arguments)]
pub extern "C" fn hip_ext_launch_kernel(
    host: *const c_void,
    grid: Dim3,
    block: Dim3,
    _args: *mut *mut c_void,
    _shared: usize,
    stream: usize,
    start: usize,
    stop: usize,
    _flags: i32,
) -> HipError {
    if start != 0 {
        let rc = call(|_| stream::cu_event_record(start, stream));
        if rc != HIP_SUCCESS {
            return rc;
        }
    }
    let rc = launch_registered(host, grid, block, stream);
    if rc == HIP_SUCCESS && stop != 0 {
        return call(|_| stream::cu_event_record(stop, stream));
    }
    rc
}

/// `hipModuleLaunchKernel`: the same arguments as `cuLaunchKernel`.
#[allow(clippy::too_many_arguments)]
pub extern "C" fn hip_module_launch_kernel(
    f: usize,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared: u32,
    stream: usize,
    params: *mut *mut u8,
    extra: *mut *mut u8,
) -> HipError {
    call(|_| cu::cu_launch_kernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra))
}

pub extern "C" fn hip_module_load_data(out: *mut usize, image: *const u8) -> HipError {
    call(|_| cu::cu_module_load_data(out, image))
}

pub extern "C" fn hip_module_get_function(
    out: *mut usize,
    m: usize,
    name: *const c_char,
) -> HipError {
    call(|_| cu::cu_module_get_function(out, m, name))
}

pub extern "C" fn hip_module_unload(m: usize) -> HipError {
    call(|_| cu::cu_module_unload(m))
}

pub extern "C" fn hip_graph_launch(exec: usize, stream: usize) -> HipError {
    call(|_| cu::cu_graph_launch(exec, stream))
}

/// `hipStreamPerThread`.
const STREAM_PER_THREAD: usize = 2;

/// The stream an `_spt` entry point means: 0 is the calling thread's default stream.
fn per_thread(stream: usize) -> usize {
    if stream == 0 {
        STREAM_PER_THREAD
    } else {
        stream
    }
}

/// `hipLaunchKernel_spt`: as `hipLaunchKernel`, the null stream meaning the per-thread one.
pub extern "C" fn hip_launch_kernel_spt(
    host: *const c_void,
    grid: Dim3,
    block: Dim3,
    _args: *mut *mut c_void,
    _shared: usize,
    stream: usize,
) -> HipError {
    launch_registered(host, grid, block, per_thread(stream))
}

pub extern "C" fn hip_graph_launch_spt(exec: usize, stream: usize) -> HipError {
    hip_graph_launch(exec, per_thread(stream))
}

/// `hipStreamIsCapturing(stream, hipStreamCaptureStatus *)`: 0 none, 1 active.
pub extern "C" fn hip_stream_is_capturing(s: usize, status: *mut i32) -> HipError {
    call(|_| stream::cu_stream_is_capturing(s, status))
}

/// `hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode *)`: the thread's mode is
/// exchanged (the simulator keeps it but nothing depends on it).
pub extern "C" fn hip_thread_exchange_stream_capture_mode(mode: *mut i32) -> HipError {
    thread_local! {
        static MODE: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    }
    if mode.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    // SAFETY: a non-NULL in/out pointer from the caller (HIP API contract).
    unsafe { *mode = MODE.with(|m| m.replace(*mode)) };
    HIP_SUCCESS
}

/// `fgpuSimHipEventStats(created *, recorded *, into_capture *)` (simulator only): the
/// counters above.
pub extern "C" fn event_stats(created: *mut u64, recorded: *mut u64, into: *mut u64) -> HipError {
    crate::ffi::put(created, EVENTS_CREATED.load(Relaxed));
    crate::ffi::put(recorded, EVENTS_RECORDED.load(Relaxed));
    crate::ffi::put(into, RECORDS_INTO_CAPTURE.load(Relaxed));
    HIP_SUCCESS
}

pub extern "C" fn hip_stream_begin_capture(s: usize, mode: i32) -> HipError {
    call(|_| stream::cu_stream_begin_capture(s, mode))
}

pub extern "C" fn hip_stream_end_capture(s: usize, graph: *mut usize) -> HipError {
    call(|_| stream::cu_stream_end_capture(s, graph))
}

/// `hipGraphInstantiate(exec, graph, errorNode, logBuffer, bufferSize)`.
pub extern "C" fn hip_graph_instantiate(
    exec: *mut usize,
    graph: usize,
    _node: *mut c_void,
    _log: *mut c_char,
    _len: usize,
) -> HipError {
    call(|_| cu::cu_graph_instantiate_with_flags(exec, graph, 0))
}

pub extern "C" fn hip_graph_instantiate_with_flags(
    exec: *mut usize,
    graph: usize,
    flags: u64,
) -> HipError {
    call(|_| cu::cu_graph_instantiate_with_flags(exec, graph, flags))
}

pub extern "C" fn hip_graph_exec_destroy(exec: usize) -> HipError {
    call(|_| cu::cu_graph_exec_destroy(exec))
}

pub extern "C" fn hip_graph_destroy(graph: usize) -> HipError {
    call(|_| cu::cu_graph_destroy(graph))
}

pub extern "C" fn hip_stream_create(out: *mut usize) -> HipError {
    call(|_| stream::cu_stream_create(out, 0))
}

pub extern "C" fn hip_stream_create_with_flags(out: *mut usize, flags: u32) -> HipError {
    call(|_| stream::cu_stream_create(out, flags))
}

pub extern "C" fn hip_stream_destroy(s: usize) -> HipError {
    call(|_| stream::cu_stream_destroy(s))
}

pub extern "C" fn hip_stream_synchronize(s: usize) -> HipError {
    call(|_| stream::cu_stream_synchronize(s))
}

pub extern "C" fn hip_stream_query(s: usize) -> HipError {
    call(|_| stream::cu_stream_query(s))
}

pub extern "C" fn hip_device_synchronize() -> HipError {
    call(|_| cuctx::cu_ctx_synchronize())
}

pub extern "C" fn hip_event_create(out: *mut usize) -> HipError {
    hip_event_create_with_flags(out, 0)
}

pub extern "C" fn hip_event_create_with_flags(out: *mut usize, flags: u32) -> HipError {
    let rc = call(|_| stream::cu_event_create(out, flags));
    if rc == HIP_SUCCESS {
        EVENTS_CREATED.fetch_add(1, Relaxed);
    }
    rc
}

pub extern "C" fn hip_event_record(ev: usize, s: usize) -> HipError {
    call(|_| {
        let mut st = 0;
        if stream::cu_stream_is_capturing(s, &mut st) == 0 && st != 0 {
            RECORDS_INTO_CAPTURE.fetch_add(1, Relaxed);
        }
        let rc = stream::cu_event_record(ev, s);
        if rc == HIP_SUCCESS {
            EVENTS_RECORDED.fetch_add(1, Relaxed);
        }
        rc
    })
}

pub extern "C" fn hip_event_synchronize(ev: usize) -> HipError {
    call(|_| stream::cu_event_synchronize(ev))
}

pub extern "C" fn hip_event_query(ev: usize) -> HipError {
    call(|_| stream::cu_event_query(ev))
}

pub extern "C" fn hip_event_elapsed_time(ms: *mut f32, start: usize, stop: usize) -> HipError {
    call(|_| stream::cu_event_elapsed_time(ms, start, stop))
}

pub extern "C" fn hip_event_destroy(ev: usize) -> HipError {
    call(|_| stream::cu_event_destroy(ev))
}

/// `hipGetLastError` / `hipPeekAtLastError`: the simulator reports every error at its call.
pub extern "C" fn hip_get_last_error() -> HipError {
    HIP_SUCCESS
}
