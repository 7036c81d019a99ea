//! Stream-ordered allocation and memory pools.
//!
//! Model: a pool charges the device for what it reserves. An allocation is served from the
//! pool's unused reservation when it fits, otherwise the pool grows by the shortfall. A free
//! returns bytes to the pool but they stay reserved (charged) until cuMemPoolTrimTo or the
//! pool is destroyed. (The real default pool, with release threshold 0, would also shrink at
//! synchronisation points; this model keeps it until trimmed.)

use super::*;
use crate::ffi::{get, put};
use crate::process::{AllocKind, Local, Pool, local};

fn default_pool(l: &mut Local, dev: usize) -> Handle {
    if let Some((&h, _)) = l.pools.iter().find(|(_, p)| p.dev == dev && p.is_default) {
        return h;
    }
    let h = l.handle();
    l.pools.insert(
        h,
        Pool {
            dev,
            reserved: 0,
            in_use: 0,
            is_default: true,
        },
    );
    h
}

fn alloc_from(dptr: *mut CUdeviceptr, size: usize, pool: Option<Handle>) -> CUresult {
    if dptr.is_null() || size == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let size = (size as u64).div_ceil(512) * 512;
    let mut l = local();
    let dev = match l.current_dev() {
        Ok(d) => d,
        Err(e) => return e,
    };
    let h = match pool {
        Some(h) => h,
        None => default_pool(&mut l, dev),
    };
    let Some(p) = l.pools.get(&h) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let (pdev, spare) = (p.dev, p.reserved - p.in_use);
    let grow = size.saturating_sub(spare);
    if let Err(e) = l.charge(pdev, grow) {
        return e;
    }
    let p = l.pools.get_mut(&h).unwrap_or_else(|| unreachable!());
    p.reserved += grow;
    p.in_use += size;
    let ptr = l.va(size, 512);
    l.allocs.insert(
        ptr,
        crate::process::Alloc::new(pdev, size, AllocKind::Pool(h)),
    );
    put(dptr, ptr);
    CUDA_SUCCESS
}

pub fn free_to_pool(ptr: CUdeviceptr) -> CUresult {
    let mut l = local();
    let Some(a) = l.allocs.get(&ptr) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let (AllocKind::Pool(h), size) = (a.kind, a.size) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    l.allocs.remove(&ptr);
    if let Some(p) = l.pools.get_mut(&h) {
        p.in_use = p.in_use.saturating_sub(size);
    }
    CUDA_SUCCESS
}

pub extern "C" fn cu_mem_alloc_async(dptr: *mut CUdeviceptr, size: usize, _s: Handle) -> CUresult {
    alloc_from(dptr, size, None)
}

pub extern "C" fn cu_mem_alloc_from_pool_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Handle,
    _s: Handle,
) -> CUresult {
    alloc_from(dptr, size, Some(pool))
}

pub extern "C" fn cu_mem_free_async(ptr: CUdeviceptr, _s: Handle) -> CUresult {
    if let Err(e) = local().current_dev() {
        return e;
    }
    let kind = local().allocs.get(&ptr).map(|a| a.kind);
    match kind {
        Some(AllocKind::Pool(_)) => free_to_pool(ptr),
        // Freeing a cuMemAlloc pointer asynchronously is legal: it is freed at once here.
        Some(_) => memory::cu_mem_free(ptr),
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

/// `CUmemPoolProps`: allocType, handleTypes, then `CUmemLocation { type, id }`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PoolPropsHead {
    pub alloc_type: i32,
    pub handle_types: i32,
    pub location_type: i32,
    pub location_id: i32,
}

pub extern "C" fn cu_mem_pool_create(out: *mut Handle, props: *const PoolPropsHead) -> CUresult {
    let Some(pr) = get(props) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let d = match device::device_index(pr.location_id) {
        Ok(d) => d,
        Err(_) => return CUDA_ERROR_INVALID_VALUE,
    };
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut l = local();
    let h = l.handle();
    l.pools.insert(
        h,
        Pool {
            dev: d,
            reserved: 0,
            in_use: 0,
            is_default: false,
        },
    );
    put(out, h);
    CUDA_SUCCESS
}

pub extern "C" fn cu_mem_pool_destroy(pool: Handle) -> CUresult {
    let mut l = local();
    match l.pools.get(&pool) {
        Some(p) if !p.is_default => {
            let (dev, reserved) = (p.dev, p.reserved);
            l.pools.remove(&pool);
            l.allocs.retain(|_, a| a.kind != AllocKind::Pool(pool));
            l.uncharge(dev, reserved);
            CUDA_SUCCESS
        }
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}

pub extern "C" fn cu_mem_pool_trim_to(pool: Handle, keep: usize) -> CUresult {
    let mut l = local();
    let Some(p) = l.pools.get_mut(&pool) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let target = p.in_use.max(keep as u64).min(p.reserved);
    let release = p.reserved - target;
    p.reserved = target;
    let dev = p.dev;
    l.uncharge(dev, release);
    CUDA_SUCCESS
}

pub extern "C" fn cu_device_get_default_mem_pool(out: *mut Handle, dev: CUdevice) -> CUresult {
    let d = match device::device_index(dev) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let mut l = local();
    let h = default_pool(&mut l, d);
    if put(out, h) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}
