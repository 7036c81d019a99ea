//! The driver calls the gate makes itself: timing events, the stream-capture check, the
//! relaxed capture mode for its own queries, the current context. Each returns a plain value
//! (0 / false / an error code) when the driver lacks the entry point.

use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering::Relaxed;

use super::STATS;
use crate::real::{self, CUresult, Handle};

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CU_EVENT_DEFAULT: c_uint = 0;
const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// Whether `stream` is capturing (or its capture state cannot be read: then it is treated as
/// capturing, the safe side; e.g. the legacy stream while another stream captures).
pub fn capturing(stream: usize) -> bool {
    let Some(f) = real::CU_STREAM_IS_CAPTURING.get() else {
        return false; // no stream capture in this driver
    };
    let mut st: c_int = 0;
    // SAFETY: cuStreamIsCapturing(CUstream, CUstreamCaptureStatus*) with a valid out-pointer.
    let rc = unsafe { f(stream as Handle, &mut st) };
    let cap = rc != CUDA_SUCCESS || st != 0;
    if cap {
        STATS.capture_skips.fetch_add(1, Relaxed);
    }
    cap
}

/// Relaxed stream-capture mode for the calling thread while it lives: event queries made by
/// the gate must not invalidate another thread's global-mode capture.
pub struct RelaxedCapture(Option<c_int>);

impl RelaxedCapture {
    pub fn enter() -> RelaxedCapture {
        let Some(f) = real::CU_THREAD_EXCHANGE_STREAM_CAPTURE_MODE.get() else {
            return RelaxedCapture(None);
        };
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode*), valid pointer.
        let rc = unsafe { f(&mut mode) };
        RelaxedCapture((rc == CUDA_SUCCESS).then_some(mode))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let (Some(mut mode), Some(f)) =
            (self.0, real::CU_THREAD_EXCHANGE_STREAM_CAPTURE_MODE.get())
        {
            // SAFETY: as in `enter`: restores the thread's previous mode.
            unsafe { f(&mut mode) };
        }
    }
}

pub fn event_create(flags: c_uint) -> usize {
    let Some(f) = real::CU_EVENT_CREATE.get() else {
        return 0;
    };
    let mut ev: Handle = std::ptr::null_mut();
    // SAFETY: cuEventCreate(CUevent*, unsigned) with a valid out-pointer.
    if unsafe { f(&mut ev, flags) } != CUDA_SUCCESS {
        return 0;
    }
    STATS.events_created.fetch_add(1, Relaxed);
    ev as usize
}

pub fn event_destroy(ev: usize) {
    if ev != 0
        && let Some(f) = real::CU_EVENT_DESTROY.get()
    {
        // SAFETY: an event this module created.
        unsafe { f(ev as Handle) };
    }
}

pub fn event_record(ev: usize, stream: usize) -> bool {
    let Some(f) = real::CU_EVENT_RECORD.get() else {
        return false;
    };
    // SAFETY: cuEventRecord(CUevent, CUstream): our event, the caller's (non-capturing) stream.
    let ok = unsafe { f(ev as Handle, stream as Handle) } == CUDA_SUCCESS;
    if ok {
        STATS.events_recorded.fetch_add(1, Relaxed);
    }
    ok
}

pub fn event_query(ev: usize) -> CUresult {
    match real::CU_EVENT_QUERY.get() {
        // SAFETY: cuEventQuery(CUevent) on our event.
        Some(f) => unsafe { f(ev as Handle) },
        None => CUDA_SUCCESS,
    }
}

/// Whether everything queued on `stream` has completed (false on any error, e.g. a capturing
/// stream: then the caller takes the ordinary path).
pub fn stream_idle(stream: usize) -> bool {
    let Some(f) = real::CU_STREAM_QUERY.get() else {
        return false;
    };
    let _relaxed = RelaxedCapture::enter();
    // SAFETY: cuStreamQuery(CUstream) on the caller's stream; it only reports.
    unsafe { f(stream as Handle) == CUDA_SUCCESS }
}

/// GPU time between two completed events, in ns.
pub fn elapsed_ns(start: usize, end: usize) -> Option<i64> {
    let f = real::CU_EVENT_ELAPSED_TIME
        .get()
        .or_else(|| real::CU_EVENT_ELAPSED_TIME_V2.get())?;
    let mut ms: f32 = 0.0;
    // SAFETY: cuEventElapsedTime(float*, CUevent, CUevent) with a valid out-pointer.
    let rc = unsafe { f(&mut ms, start as Handle, end as Handle) };
    (rc == CUDA_SUCCESS && ms.is_finite()).then(|| ((f64::from(ms) * 1e6) as i64).max(0))
}

pub fn current_ctx() -> usize {
    let Some(f) = real::CU_CTX_GET_CURRENT.get() else {
        return 0;
    };
    let mut c: Handle = std::ptr::null_mut();
    // SAFETY: cuCtxGetCurrent(CUcontext*) with a valid out-pointer.
    if unsafe { f(&mut c) } != CUDA_SUCCESS {
        return 0;
    }
    c as usize
}

/// Makes `ctx` the calling thread's current context (the watcher thread, before it works on
/// a stream of that context: the legacy stream handle means the current context's). False if
/// it could not.
pub fn set_current_ctx(ctx: usize) -> bool {
    if current_ctx() == ctx {
        return true;
    }
    let Some(f) = real::CU_CTX_SET_CURRENT.get() else {
        return false;
    };
    // SAFETY: cuCtxSetCurrent(CUcontext) with a context the process made current on some
    // thread (recorded when its stream was first seen); it only changes this thread's binding.
    unsafe { f(ctx as Handle) == CUDA_SUCCESS }
}
