//! Modules, kernel launches and graphs. Kernel durations follow the naming convention in
//! [`crate::timeline::kernel_duration_ns`], local memory [`crate::timeline::kernel_local_mem`].

use super::*;
use crate::ffi::{get, put, str_arg};
use crate::process::local;
use crate::timeline::{kernel_duration_ns, kernel_local_mem};

fn new_module(out: *mut Handle) -> CUresult {
    let mut l = local();
    if let Err(e) = l.current_dev() {
        return e;
    }
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = l.handle();
    l.modules.insert(h, ());
    put(out, h);
    CUDA_SUCCESS
}

/// Any image gives a simulated module.
pub extern "C" fn cu_module_load_data(out: *mut Handle, _image: *const u8) -> CUresult {
    new_module(out)
}

/// Any file name gives a simulated module (the file is not read).
pub extern "C" fn cu_module_load(out: *mut Handle, _fname: *const c_char) -> CUresult {
    new_module(out)
}

pub extern "C" fn cu_module_unload(m: Handle) -> CUresult {
    match local().modules.remove(&m) {
        Some(()) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

pub extern "C" fn cu_module_get_function(
    out: *mut Handle,
    m: Handle,
    name: *const c_char,
) -> CUresult {
    let Some(name) = str_arg(name) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let mut l = local();
    if !l.modules.contains_key(&m) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = l.handle();
    l.functions.insert(h, kernel_duration_ns(name));
    let local = kernel_local_mem(name);
    if local > 0 {
        l.local_mem.insert(h, local);
    }
    put(out, h);
    CUDA_SUCCESS
}

fn launch(f: Handle, grid: [u32; 3], block: [u32; 3], stream: Handle) -> CUresult {
    if grid.contains(&0) || block.contains(&0) || block.iter().product::<u32>() > 1024 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let dur = {
        let mut l = local();
        let dev = match l.current_dev() {
            Ok(d) => d,
            Err(e) => return e,
        };
        let Some(&d) = l.functions.get(&f) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        // Local memory: grown to what the kernel needs, charged on the device, never given
        // back while the process lives.
        let need = l.local_mem.get(&f).copied().unwrap_or(0);
        if need > l.local_held[dev] {
            let grow = need - l.local_held[dev];
            if let Err(e) = l.charge(dev, grow) {
                return e;
            }
            l.local_held[dev] = need;
        }
        d
    };
    stream::enqueue(stream, dur)
}

#[allow(clippy::too_many_arguments)]
pub extern "C" fn cu_launch_kernel(
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    _shared_mem: u32,
    stream: Handle,
    _params: *mut *mut u8,
    _extra: *mut *mut u8,
) -> CUresult {
    launch(f, [gx, gy, gz], [bx, by, bz], stream)
}

#[allow(clippy::too_many_arguments)]
pub extern "C" fn cu_launch_cooperative_kernel(
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    _shared_mem: u32,
    stream: Handle,
    _params: *mut *mut u8,
) -> CUresult {
    launch(f, [gx, gy, gz], [bx, by, bz], stream)
}

/// `CUlaunchConfig`, with the real layout.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: Handle,
    pub attrs: *mut u8,
    pub num_attrs: u32,
}

const _: () = assert!(std::mem::size_of::<LaunchConfig>() == 56);
const _: () = assert!(std::mem::offset_of!(LaunchConfig, stream) == 32);

pub extern "C" fn cu_launch_kernel_ex(
    config: *const LaunchConfig,
    f: Handle,
    _params: *mut *mut u8,
    _extra: *mut *mut u8,
) -> CUresult {
    match get(config) {
        Some(c) => launch(f, c.grid, c.block, c.stream),
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

pub extern "C" fn cu_graph_instantiate_with_flags(
    out: *mut Handle,
    graph: Handle,
    _flags: u64,
) -> CUresult {
    let mut l = local();
    let Some(total) = l.graphs.get(&graph).map(|k| k.iter().sum::<u64>()) else {
        return CUDA_ERROR_INVALID_HANDLE;
    };
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = l.handle();
    l.execs.insert(h, total);
    put(out, h);
    CUDA_SUCCESS
}

/// A graph launch occupies the device for the sum of its captured kernels' durations.
pub extern "C" fn cu_graph_launch(exec: Handle, stream: Handle) -> CUresult {
    let dur = match local().execs.get(&exec) {
        Some(&d) => d,
        None => return CUDA_ERROR_INVALID_HANDLE,
    };
    stream::enqueue(stream, dur)
}

pub extern "C" fn cu_graph_exec_destroy(exec: Handle) -> CUresult {
    match local().execs.remove(&exec) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

pub extern "C" fn cu_graph_destroy(graph: Handle) -> CUresult {
    match local().graphs.remove(&graph) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}
