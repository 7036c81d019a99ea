//! Streams, events and stream capture.
//!
//! The legacy default stream (0), `CU_STREAM_LEGACY` (1) and `CU_STREAM_PER_THREAD` (2) all
//! map to one default stream per process and device.

use super::*;
use crate::ffi::put;
use crate::process::{Local, Stream, local};
use crate::state::shared;
use crate::timeline::{now_ns, schedule, sleep_until};

const DEFAULT_STREAM_BASE: usize = 0x8000;
/// A stream with this many launches in flight blocks the next launch, like the driver's queue.
pub const MAX_PENDING: usize = 1024;

/// The stream-table key of `h` (creating the default stream on first use).
pub fn resolve(l: &mut Local, h: Handle) -> Result<usize, CUresult> {
    let dev = l.current_dev()?;
    if h <= 2 {
        let key = DEFAULT_STREAM_BASE + dev;
        l.streams.entry(key).or_insert_with(|| Stream {
            dev,
            ..Stream::default()
        });
        return Ok(key);
    }
    if l.streams.contains_key(&h) {
        Ok(h)
    } else {
        Err(CUDA_ERROR_INVALID_HANDLE)
    }
}

fn stream_mut(l: &mut Local, h: Handle) -> Result<&mut Stream, CUresult> {
    let key = resolve(l, h)?;
    l.streams.get_mut(&key).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Enqueues `dur` ns of device work on stream `h` (or records it, if the stream is capturing).
pub fn enqueue(h: Handle, dur: u64) -> CUresult {
    loop {
        let mut l = local();
        let Some(slot) = l.slot else {
            return CUDA_ERROR_INVALID_CONTEXT;
        };
        let st = match stream_mut(&mut l, h) {
            Ok(st) => st,
            Err(e) => return e,
        };
        if let Some(cap) = st.capture.as_mut() {
            cap.push(dur);
            return CUDA_SUCCESS;
        }
        let now = now_ns();
        while st.pending.front().is_some_and(|&t| t <= now) {
            st.pending.pop_front();
        }
        if st.pending.len() >= MAX_PENDING {
            let wait = st.pending.front().copied().unwrap_or(now);
            drop(l);
            sleep_until(wait);
            continue;
        }
        let Some(s) = shared() else {
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        let (_, end) = schedule(s.device(st.dev), s.slot(slot), st.dev, st.last_ns, dur);
        st.last_ns = end;
        st.pending.push_back(end);
        return CUDA_SUCCESS;
    }
}

pub extern "C" fn cu_stream_create(out: *mut Handle, _flags: u32) -> CUresult {
    let mut l = local();
    let dev = match l.current_dev() {
        Ok(d) => d,
        Err(e) => return e,
    };
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = l.handle();
    l.streams.insert(
        h,
        Stream {
            dev,
            ..Stream::default()
        },
    );
    put(out, h);
    CUDA_SUCCESS
}

pub extern "C" fn cu_stream_destroy(h: Handle) -> CUresult {
    let mut l = local();
    if h <= 2 || l.streams.remove(&h).is_none() {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    CUDA_SUCCESS
}

fn stream_done_at(h: Handle) -> Result<u64, CUresult> {
    let mut l = local();
    stream_mut(&mut l, h).map(|s| s.last_ns)
}

pub extern "C" fn cu_stream_synchronize(h: Handle) -> CUresult {
    match stream_done_at(h) {
        Ok(t) => {
            sleep_until(t);
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

pub extern "C" fn cu_stream_query(h: Handle) -> CUresult {
    match stream_done_at(h) {
        Ok(t) if t <= now_ns() => CUDA_SUCCESS,
        Ok(_) => CUDA_ERROR_NOT_READY,
        Err(e) => e,
    }
}

pub extern "C" fn cu_stream_begin_capture(h: Handle, _mode: i32) -> CUresult {
    let mut l = local();
    match stream_mut(&mut l, h) {
        Ok(st) if st.capture.is_some() => CUDA_ERROR_ILLEGAL_STATE,
        Ok(st) => {
            st.capture = Some(Vec::new());
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

pub extern "C" fn cu_stream_end_capture(h: Handle, graph: *mut Handle) -> CUresult {
    let mut l = local();
    let captured = match stream_mut(&mut l, h) {
        Ok(st) => st.capture.take(),
        Err(e) => return e,
    };
    let Some(kernels) = captured else {
        return CUDA_ERROR_ILLEGAL_STATE;
    };
    let g = l.handle();
    l.graphs.insert(g, kernels);
    put(graph, g);
    CUDA_SUCCESS
}

pub extern "C" fn cu_stream_is_capturing(h: Handle, status: *mut i32) -> CUresult {
    let mut l = local();
    match stream_mut(&mut l, h) {
        Ok(st) => {
            put(status, i32::from(st.capture.is_some()));
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

pub extern "C" fn cu_event_create(out: *mut Handle, _flags: u32) -> CUresult {
    let mut l = local();
    if let Err(e) = l.current_dev() {
        return e;
    }
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = l.handle();
    l.events.insert(h, None);
    put(out, h);
    CUDA_SUCCESS
}

pub extern "C" fn cu_event_record(ev: Handle, h: Handle) -> CUresult {
    let mut l = local();
    if !l.events.contains_key(&ev) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    let t = match stream_mut(&mut l, h) {
        Ok(st) if st.capture.is_some() => return CUDA_SUCCESS,
        Ok(st) => st.last_ns.max(now_ns()),
        Err(e) => return e,
    };
    l.events.insert(ev, Some(t));
    CUDA_SUCCESS
}

fn event_time(ev: Handle) -> Result<Option<u64>, CUresult> {
    local()
        .events
        .get(&ev)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

pub extern "C" fn cu_event_synchronize(ev: Handle) -> CUresult {
    match event_time(ev) {
        Ok(t) => {
            sleep_until(t.unwrap_or(0));
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

pub extern "C" fn cu_event_query(ev: Handle) -> CUresult {
    match event_time(ev) {
        Ok(Some(t)) if t > now_ns() => CUDA_ERROR_NOT_READY,
        Ok(_) => CUDA_SUCCESS,
        Err(e) => e,
    }
}

pub extern "C" fn cu_event_elapsed_time(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    let (a, b) = match (event_time(start), event_time(end)) {
        (Ok(Some(a)), Ok(Some(b))) => (a, b),
        (Err(e), _) | (_, Err(e)) => return e,
        _ => return CUDA_ERROR_INVALID_HANDLE,
    };
    if a.max(b) > now_ns() {
        return CUDA_ERROR_NOT_READY;
    }
    let v = (b as f64 - a as f64) / 1e6;
    if put(ms, v as f32) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

pub extern "C" fn cu_event_destroy(ev: Handle) -> CUresult {
    match local().events.remove(&ev) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}
