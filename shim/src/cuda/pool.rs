//! Stream-ordered allocation: cuMemAllocAsync, cuMemAllocFromPoolAsync (both + `_ptsz`),
//! cuMemPoolCreate / Destroy / TrimTo.
//!
//! Pools keep freed memory reserved, so the ledger is charged with what each pool reserves,
//! not with requests: a pool record holds `charged` (reserved bytes) and `spare` (reserved but
//! not handed out). An allocation of n bytes (rounded up to 512) takes what it can from spare
//! and reserves only the shortfall in the ledger; a free returns its bytes to spare; a trim
//! gives spare back down to `minBytesToKeep` (or the pool's use); destroying a pool gives back
//! all it reserved. Pool allocations belong to the pool's device; cuMemAllocAsync uses the
//! current device's current pool (`cuDeviceGetMemPool`, else its default pool).
//!
//! The driver may also shrink a pool by itself at synchronisation points (release threshold);
//! the shim does not see that and keeps charging the reservation until the next trim: it
//! errs on the safe side. (PyTorch's cudaMallocAsync backend sets the threshold to keep
//! everything and trims explicitly, which the shim follows exactly.)

#![allow(non_snake_case)]

use crate::account::{self, Kind, POOLS, PTRS, current_ordinal, idx_of, meta, ord_of, reserve};
use crate::ledger;
use crate::real::{
    self, CU_MEM_LOCATION_TYPE_DEVICE, CUDA_ERROR_OUT_OF_MEMORY, CUdevice, CUdeviceptr, CUresult,
    Handle, PoolPropsHead,
};
use crate::real::{read, real_or_3};
use crate::table::Entry;

const POOL_ROUND: u64 = 512;

/// The pool record of `pool`, creating it (on device `ord`) if unknown. Returns (ledger
/// device, ordinal).
fn pool_record(pool: Handle, ord: Option<CUdevice>) -> Option<(usize, CUdevice)> {
    let key = pool as u64;
    if let Some(e) = POOLS.get(key) {
        return Some((idx_of(&e), ord_of(&e)));
    }
    let ord = ord?;
    let (l, _) = ledger::get()?;
    let idx = account::dev_index(l, ord)?;
    POOLS.insert(Entry {
        key,
        size: 0,
        meta: meta(Kind::MemPool, idx, ord),
        aux: 0,
    });
    Some((idx, ord))
}

/// The pool cuMemAllocAsync draws from on device `ord`.
fn current_pool(ord: CUdevice) -> Option<Handle> {
    let mut h: Handle = std::ptr::null_mut();
    let f = real::CU_DEVICE_GET_MEM_POOL
        .get()
        .or_else(|| real::CU_DEVICE_GET_DEFAULT_MEM_POOL.get())?;
    // SAFETY: cuDeviceGet(Default)MemPool(CUmemoryPool*, CUdevice) with a valid out-pointer.
    let rc = unsafe { f(&mut h, ord) };
    (rc == 0 && !h.is_null()).then_some(h)
}

/// Takes up to `n` from `pool`'s spare, growing its charge by the rest; returns (taken, grown).
fn take(pool: u64, n: u64) -> (u64, u64) {
    let mut out = (0, n);
    POOLS.update(pool, |e| {
        let t = e.aux.min(n);
        e.aux -= t;
        e.size += n - t;
        out = (t, n - t);
        true
    });
    out
}

/// Undoes [`take`].
fn untake(pool: u64, (taken, grown): (u64, u64)) {
    POOLS.update(pool, |e| {
        e.aux += taken;
        e.size = e.size.saturating_sub(grown);
        true
    });
}

fn pool_alloc(
    api: &str,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Option<Handle>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if !ledger::active() || dptr.is_null() || bytes == 0 {
        return call();
    }
    let cur = current_ordinal();
    let pool = match pool.or_else(|| cur.and_then(current_pool)) {
        Some(p) => p,
        None => return call(),
    };
    let Some((idx, ord)) = pool_record(pool, cur) else {
        return call();
    };
    let key = pool as u64;
    let n = (bytes as u64).div_ceil(POOL_ROUND) * POOL_ROUND;
    let t = take(key, n);
    let charge = if t.1 > 0 {
        match reserve(api, Some(ord), t.1) {
            Ok(c) => c,
            Err(_) => {
                untake(key, t);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
    } else {
        None
    };
    let rc = call();
    if rc != 0 {
        untake(key, t);
        if let Some(c) = charge {
            account::release(c.idx, c.bytes);
        }
        return rc;
    }
    account::track(&PTRS, read(dptr), n, meta(Kind::Pool, idx, ord), key);
    crate::park::note_pin(fgpu_common::ledger::park::pin::POOL);
    rc
}

/// A pool allocation of `n` bytes came back to `pool`.
pub fn returned(pool: u64, n: u64) {
    POOLS.update(pool, |e| {
        e.aux = (e.aux + n).min(e.size);
        true
    });
}

/// # Safety
/// The CUDA driver API contract of `cuMemAllocAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: Handle,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_ALLOC_ASYNC);
    // SAFETY: forwarding the caller's arguments unchanged.
    pool_alloc("cuMemAllocAsync", dptr, bytesize, None, || unsafe {
        f(dptr, bytesize, stream)
    })
}

/// # Safety
/// The CUDA driver API contract of `cuMemAllocAsync_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: Handle,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_ALLOC_ASYNC_PTSZ);
    // SAFETY: forwarding the caller's arguments unchanged.
    pool_alloc("cuMemAllocAsync_ptsz", dptr, bytesize, None, || unsafe {
        f(dptr, bytesize, stream)
    })
}

/// # Safety
/// The CUDA driver API contract of `cuMemAllocFromPoolAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_ALLOC_FROM_POOL_ASYNC);
    let p = (!pool.is_null()).then_some(pool);
    // SAFETY: forwarding the caller's arguments unchanged.
    pool_alloc("cuMemAllocFromPoolAsync", dptr, bytesize, p, || unsafe {
        f(dptr, bytesize, pool, stream)
    })
}

/// # Safety
/// The CUDA driver API contract of `cuMemAllocFromPoolAsync_ptsz`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Handle,
    stream: Handle,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ);
    let p = (!pool.is_null()).then_some(pool);
    // SAFETY: forwarding the caller's arguments unchanged.
    pool_alloc(
        "cuMemAllocFromPoolAsync_ptsz",
        dptr,
        bytesize,
        p,
        || unsafe { f(dptr, bytesize, pool, stream) },
    )
}

/// Records the new pool's device (from its properties).
///
/// # Safety
/// The CUDA driver API contract of `cuMemPoolCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut Handle,
    props: *const PoolPropsHead,
) -> CUresult {
    let f = real_or_3!(real::CU_MEM_POOL_CREATE);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(pool, props) };
    if rc == 0 && ledger::active() && !pool.is_null() && !props.is_null() {
        // SAFETY: the caller's properties (read by the driver just now).
        let p = unsafe { props.read_unaligned() };
        if p.location_type == CU_MEM_LOCATION_TYPE_DEVICE {
            pool_record(read(pool.cast_const()), Some(p.location_id));
        }
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuMemPoolDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    let f = real_or_3!(real::CU_MEM_POOL_DESTROY);
    // SAFETY: forwarding the caller's argument unchanged.
    let rc = unsafe { f(pool) };
    if rc == 0
        && ledger::active()
        && let Some(e) = POOLS.remove(pool as u64)
    {
        let key = pool as u64;
        PTRS.remove_where(|p| account::kind_of(p) == Kind::Pool as u8 && p.aux == key);
        account::release(idx_of(&e), e.size);
    }
    rc
}

/// # Safety
/// The CUDA driver API contract of `cuMemPoolTrimTo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: Handle, keep: usize) -> CUresult {
    let f = real_or_3!(real::CU_MEM_POOL_TRIM_TO);
    // SAFETY: forwarding the caller's arguments unchanged.
    let rc = unsafe { f(pool, keep) };
    if rc == 0 && ledger::active() {
        let mut rel = 0u64;
        if let Some(e) = POOLS.update(pool as u64, |e| {
            let in_use = e.size - e.aux;
            let keep_spare = e.aux.min((keep as u64).saturating_sub(in_use));
            rel = e.aux - keep_spare;
            e.aux = keep_spare;
            e.size -= rel;
            true
        }) {
            account::release(idx_of(&e), rel);
        }
    }
    rc
}
