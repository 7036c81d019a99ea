//! Primary contexts. Creating the first context in a process claims its slot in the shared
//! state and charges the per-device context overhead.

use super::*;
use crate::ffi::put;
use crate::process::{CTX_BASE, ctx_dev, current_ctx, local, pop_ctx, push_ctx, set_current_ctx};
use crate::state::shared;
use crate::timeline::sleep_until;
use std::sync::atomic::Ordering::SeqCst;

pub extern "C" fn cu_device_primary_ctx_retain(out: *mut Handle, dev: CUdevice) -> CUresult {
    let d = match device::device_index(dev) {
        Ok(d) => d,
        Err(e) => return e,
    };
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some(s) = shared() else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    let mut l = local();
    if l.slot.is_none() {
        l.slot = s.claim_slot();
        if l.slot.is_none() {
            return CUDA_ERROR_OUT_OF_MEMORY; // no free process slot
        }
    }
    if l.ctx_refs[d] == 0 {
        if let Err(e) = l.charge(d, s.context_overhead()) {
            return e;
        }
        if let Some(slot) = l.slot {
            s.slot(slot).ctx_mask.fetch_or(1 << d, SeqCst);
        }
    }
    l.ctx_refs[d] += 1;
    put(out, CTX_BASE + d);
    CUDA_SUCCESS
}

/// Dropping the last reference destroys the context: its allocations and overhead go back.
pub extern "C" fn cu_device_primary_ctx_release(dev: CUdevice) -> CUresult {
    let d = match device::device_index(dev) {
        Ok(d) => d,
        Err(e) => return e,
    };
    let mut l = local();
    if l.ctx_refs[d] == 0 {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    l.ctx_refs[d] -= 1;
    if l.ctx_refs[d] == 0 {
        if let (Some(s), Some(slot)) = (shared(), l.slot) {
            s.slot(slot).ctx_mask.fetch_and(!(1 << d), SeqCst);
            s.slot(slot).used[d].store(0, SeqCst);
        }
        l.allocs.retain(|_, a| a.dev != d);
        l.pools.retain(|_, p| p.dev != d);
        l.vmm.retain(|_, h| h.dev != Some(d));
        let vmm = std::mem::take(&mut l.vmm);
        l.mappings.retain(|_, m| vmm.contains_key(&m.handle));
        l.vmm = vmm;
        // A new context starts clean of the old one's sticky error.
        l.poisoned[d] = false;
        l.arrays.retain(|_, a| a.0 != d);
        l.streams.retain(|_, st| st.dev != d);
    }
    CUDA_SUCCESS
}

pub extern "C" fn cu_ctx_get_current(out: *mut Handle) -> CUresult {
    if !local().initialized {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if put(out, current_ctx()) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

/// `cuCtxSetCurrent(ctx)` replaces the top of the thread's context stack; NULL pops it
/// (CUDA Driver API reference, Context Management, cuCtxSetCurrent: "equivalent to popping
/// the top of the calling CPU thread's CUDA context stack").
pub extern "C" fn cu_ctx_set_current(ctx: Handle) -> CUresult {
    if !local().initialized {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if ctx != 0 && ctx_dev(ctx).is_none() {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if ctx == 0 {
        pop_ctx();
    } else {
        set_current_ctx(ctx);
    }
    CUDA_SUCCESS
}

/// `cuCtxPushCurrent_v2(ctx)`: `ctx` becomes current, the previous one waits below it
/// (Context Management, cuCtxPushCurrent).
pub extern "C" fn cu_ctx_push_current(ctx: Handle) -> CUresult {
    if !local().initialized {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if ctx_dev(ctx).is_none() {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    push_ctx(ctx);
    CUDA_SUCCESS
}

/// `cuCtxPopCurrent_v2(pctx)`: pops the current context into `*pctx` (if not NULL); the
/// context that was current before it was pushed is current again (Context Management,
/// cuCtxPopCurrent). No current context: CUDA_ERROR_INVALID_CONTEXT.
pub extern "C" fn cu_ctx_pop_current(out: *mut Handle) -> CUresult {
    if !local().initialized {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if current_ctx() == 0 {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    put(out, pop_ctx());
    CUDA_SUCCESS
}

pub extern "C" fn cu_ctx_get_device(out: *mut CUdevice) -> CUresult {
    let dev = local().current_dev();
    rc(dev.and_then(|d| {
        let ord = device::ordinal_of(d).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        put(out, ord).then_some(()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }))
}

/// Waits for all work this process queued on the current device.
pub extern "C" fn cu_ctx_synchronize() -> CUresult {
    let until = {
        let l = local();
        let d = match l.current_dev() {
            Ok(d) => d,
            Err(e) => return e,
        };
        l.streams
            .values()
            .filter(|s| s.dev == d)
            .map(|s| s.last_ns)
            .max()
            .unwrap_or(0)
    };
    sleep_until(until);
    CUDA_SUCCESS
}

/// `fgpuSimFault()` (the simulator's own export, no CUDA entry point): the current context
/// faults as a kernel of its own touching an illegal address would make it (an Xid 13 or 31
/// on a real GPU), without anything else happening: every later call of the context fails
/// with CUDA_ERROR_ILLEGAL_ADDRESS ([`crate::process::Local::current_dev`]). For tests of
/// what a shim does with a context that broke while it was not looking (e.g. while its
/// memory was parked).
pub extern "C" fn fgpu_sim_fault() -> CUresult {
    let mut l = local();
    match l.current_dev() {
        Ok(d) => {
            l.poisoned[d] = true;
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}
