//! The driver calls the gate makes itself: timing events, the stream-capture check, the
//! relaxed capture mode for its own queries, the current context. Each returns a plain value
//! (0 / false / an error code) when the driver lacks the entry point.
//!
//! Two device APIs share the gate ([`Api`]): CUDA's driver API and AMD's HIP runtime. Their
//! event, stream and capture calls have the same shapes and the same codes for what the gate
//! looks at (success 0, not ready 600, relaxed capture mode 2), so each call takes the entry
//! point from the stream's API's table ([`GateApi`], one per API, registered by lib.rs:
//! crate::cuda's and crate::hip's) and the gate names no device API itself.
//! What differs: HIP has no contexts the gate can name ([`Contexts::Device`]), so its
//! "context" is the current device (ordinal + 1), and HIP devices have gate device numbers of
//! their own ([`device`]: `MAX_ORDINALS` + HIP ordinal), bound to ledger records by HIP UUID.

use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering::Relaxed;

use super::STATS;
use super::profile::{Call, timed};
use crate::config::MAX_ORDINALS;
use crate::real::{CUresult, Handle, Sym};
use crate::registered::Registered;
use fgpu_common::ledger::Ledger;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CU_EVENT_DEFAULT: c_uint = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED` = `hipStreamCaptureModeRelaxed`.
const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// Gate device numbers: CUDA ordinals below, HIP ordinals from [`HIP_DEVICE_BASE`] on.
pub const DEVICES: usize = 2 * MAX_ORDINALS;
const HIP_DEVICE_BASE: usize = MAX_ORDINALS;

/// The device API a launch (and its stream's events) belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Api {
    #[default]
    Cuda,
    Hip,
}

/// `cu/hipEventDestroy`, `cu/hipEventQuery`, `cu/hipStreamQuery`: one handle in, a code out.
pub type HandleCall = Sym<unsafe extern "C" fn(Handle) -> CUresult>;
/// `cu/hipStreamIsCapturing(stream, status*)`.
pub type IsCapturing = Sym<unsafe extern "C" fn(Handle, *mut c_int) -> CUresult>;
/// `cu/hipThreadExchangeStreamCaptureMode(mode*)`.
pub type ExchangeMode = Sym<unsafe extern "C" fn(*mut c_int) -> CUresult>;
/// `cuEventCreate` / `hipEventCreateWithFlags(event*, flags)`.
pub type EventCreate = Sym<unsafe extern "C" fn(*mut Handle, c_uint) -> CUresult>;
/// `cu/hipEventRecord(event, stream)`.
pub type EventRecord = Sym<unsafe extern "C" fn(Handle, Handle) -> CUresult>;
/// `cu/hipEventElapsedTime(ms*, start, end)`.
pub type ElapsedTime = Sym<unsafe extern "C" fn(*mut f32, Handle, Handle) -> CUresult>;
/// `cuCtxGetCurrent(context*)`.
pub type CtxGetCurrent = Sym<unsafe extern "C" fn(*mut Handle) -> CUresult>;
/// `cuCtxSetCurrent(context)`.
pub type CtxSetCurrent = Sym<unsafe extern "C" fn(Handle) -> CUresult>;
/// `hipSetDevice(ordinal)`.
pub type SetDevice = Sym<unsafe extern "C" fn(c_int) -> CUresult>;

/// What the gate needs of a device API: the calling thread's current device, the ledger
/// record a device is bound to, and the real entry points of the event, stream, capture and
/// context calls it makes (same shapes and codes in both APIs). One per API, registered by
/// lib.rs at load time ([`register_api`]): crate::cuda's and crate::hip's.
pub struct GateApi {
    pub current_ordinal: fn() -> Option<c_int>,
    pub dev_index: fn(&Ledger, c_int) -> Option<usize>,
    pub stream_is_capturing: &'static IsCapturing,
    pub exchange_capture_mode: &'static ExchangeMode,
    pub event_create: &'static EventCreate,
    pub event_destroy: &'static HandleCall,
    pub event_record: &'static EventRecord,
    pub event_query: &'static HandleCall,
    /// The first of these the driver has.
    pub event_elapsed_time: &'static [&'static ElapsedTime],
    pub stream_query: &'static HandleCall,
    pub context: Contexts,
}

/// What stands for a stream's context (the watcher thread makes it current before it works
/// on a stream of another thread).
pub enum Contexts {
    /// Contexts the gate can name (CUDA's).
    Driver {
        get_current: &'static CtxGetCurrent,
        set_current: &'static CtxSetCurrent,
    },
    /// None (HIP's): the current device stands for it (ordinal + 1), made current with
    /// `set_device`.
    Device { set_device: &'static SetDevice },
}

/// The tables, by [`Api`] (none until registered).
static APIS: [Registered<GateApi>; 2] = [Registered::new(), Registered::new()];

/// Registers `api`'s table; called once per API, by the library's constructor.
pub fn register_api(api: Api, table: &'static GateApi) {
    APIS[api as usize].set(table);
}

/// `api`'s table (None: not registered yet).
fn table(api: Api) -> Option<&'static GateApi> {
    APIS[api as usize].get()
}

/// The calling thread's current device of `api`.
fn current_ordinal(api: Api) -> Option<c_int> {
    table(api).and_then(|t| (t.current_ordinal)())
}

/// The entry point `which` of `api`'s table, if the driver has it.
fn entry<F: Copy + 'static>(
    api: Api,
    which: impl FnOnce(&'static GateApi) -> &'static Sym<F>,
) -> Option<F> {
    table(api).and_then(|t| which(t).get())
}

/// Whether `stream` is capturing (or its capture state cannot be read: then it is treated as
/// capturing, the safe side; e.g. the legacy stream while another stream captures).
pub fn capturing(api: Api, stream: usize) -> bool {
    let Some(f) = entry(api, |t| t.stream_is_capturing) else {
        return false; // no stream capture in this driver
    };
    let mut st: c_int = 0;
    // SAFETY: cu/hipStreamIsCapturing(stream, status*) with a valid out-pointer.
    let rc = timed(Call::Capturing, || unsafe { f(stream as Handle, &mut st) });
    let cap = rc != CUDA_SUCCESS || st != 0;
    if cap {
        STATS.capture_skips.fetch_add(1, Relaxed);
    }
    cap
}

/// Relaxed stream-capture mode for the calling thread while it lives: event queries made by
/// the gate must not invalidate another thread's global-mode capture.
pub struct RelaxedCapture(Option<(c_int, Api)>);

fn exchange_mode(api: Api) -> Option<unsafe extern "C" fn(*mut c_int) -> CUresult> {
    entry(api, |t| t.exchange_capture_mode)
}

impl RelaxedCapture {
    pub fn enter(api: Api) -> RelaxedCapture {
        let Some(f) = exchange_mode(api) else {
            return RelaxedCapture(None);
        };
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: cu/hipThreadExchangeStreamCaptureMode(mode*), valid pointer.
        let rc = timed(Call::Exchange, || unsafe { f(&mut mode) });
        RelaxedCapture((rc == CUDA_SUCCESS).then_some((mode, api)))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some((mut mode, api)) = self.0
            && let Some(f) = exchange_mode(api)
        {
            // SAFETY: as in `enter`: restores the thread's previous mode.
            timed(Call::Exchange, || unsafe { f(&mut mode) });
        }
    }
}

pub fn event_create(api: Api, flags: c_uint) -> usize {
    let Some(f) = entry(api, |t| t.event_create) else {
        return 0;
    };
    let mut ev: Handle = std::ptr::null_mut();
    // SAFETY: cuEventCreate / hipEventCreateWithFlags(event*, unsigned), valid out-pointer.
    if unsafe { f(&mut ev, flags) } != CUDA_SUCCESS {
        return 0;
    }
    STATS.events_created.fetch_add(1, Relaxed);
    ev as usize
}

pub fn event_destroy(api: Api, ev: usize) {
    if ev != 0
        && let Some(f) = entry(api, |t| t.event_destroy)
    {
        // SAFETY: an event this module created.
        unsafe { f(ev as Handle) };
    }
}

pub fn event_record(api: Api, ev: usize, stream: usize) -> bool {
    let Some(f) = entry(api, |t| t.event_record) else {
        return false;
    };
    // SAFETY: cu/hipEventRecord(event, stream): our event, the caller's (non-capturing)
    // stream.
    let ok = timed(Call::Record, || unsafe {
        f(ev as Handle, stream as Handle)
    }) == CUDA_SUCCESS;
    if ok {
        STATS.events_recorded.fetch_add(1, Relaxed);
    }
    ok
}

pub fn event_query(api: Api, ev: usize) -> CUresult {
    match entry(api, |t| t.event_query) {
        // SAFETY: cu/hipEventQuery(event) on our event.
        Some(f) => timed(Call::Query, || unsafe { f(ev as Handle) }),
        None => CUDA_SUCCESS,
    }
}

/// Whether everything queued on `stream` has completed (false on any error, e.g. a capturing
/// stream: then the caller takes the ordinary path).
pub fn stream_idle(api: Api, stream: usize) -> bool {
    let Some(f) = entry(api, |t| t.stream_query) else {
        return false;
    };
    let _relaxed = RelaxedCapture::enter(api);
    // SAFETY: cu/hipStreamQuery(stream) on the caller's stream; it only reports.
    timed(Call::StreamQuery, || unsafe { f(stream as Handle) }) == CUDA_SUCCESS
}

/// GPU time between two completed events, in ns.
pub fn elapsed_ns(api: Api, start: usize, end: usize) -> Option<i64> {
    let f = table(api)?
        .event_elapsed_time
        .iter()
        .find_map(|s| s.get())?;
    let mut ms: f32 = 0.0;
    // SAFETY: cu/hipEventElapsedTime(float*, event, event) with a valid out-pointer.
    let rc = timed(Call::Elapsed, || unsafe {
        f(&mut ms, start as Handle, end as Handle)
    });
    (rc == CUDA_SUCCESS && ms.is_finite()).then(|| ((f64::from(ms) * 1e6) as i64).max(0))
}

/// The calling thread's current context (HIP: its current device's ordinal + 1); 0 if none.
pub fn current_ctx(api: Api) -> usize {
    let Some(t) = table(api) else {
        return 0;
    };
    let get_current = match t.context {
        Contexts::Device { .. } => return current_ordinal(api).map_or(0, |o| o as usize + 1),
        Contexts::Driver { get_current, .. } => get_current,
    };
    let Some(f) = get_current.get() else {
        return 0;
    };
    let mut c: Handle = std::ptr::null_mut();
    // SAFETY: cuCtxGetCurrent(CUcontext*) with a valid out-pointer.
    if timed(Call::Context, || unsafe { f(&mut c) }) != CUDA_SUCCESS {
        return 0;
    }
    c as usize
}

/// Makes `ctx` the calling thread's current context (the watcher thread, before it works on
/// a stream of that context: the legacy stream handle means the current context's). False if
/// it could not.
pub fn set_current_ctx(api: Api, ctx: usize) -> bool {
    if current_ctx(api) == ctx {
        return true;
    }
    let Some(t) = table(api) else {
        return false;
    };
    let set_current = match t.context {
        Contexts::Device { set_device } => {
            let (Some(f), Some(ord)) = (set_device.get(), ctx.checked_sub(1)) else {
                return false;
            };
            // SAFETY: hipSetDevice(int) with a device this process used (recorded when its
            // stream was first seen); it only changes this thread's current device.
            return unsafe { f(ord as c_int) } == CUDA_SUCCESS;
        }
        Contexts::Driver { set_current, .. } => set_current,
    };
    let Some(f) = set_current.get() else {
        return false;
    };
    // SAFETY: cuCtxSetCurrent(CUcontext) with a context the process made current on some
    // thread (recorded when its stream was first seen); it only changes this thread's binding.
    unsafe { f(ctx as Handle) == CUDA_SUCCESS }
}

/// The gate device number of the calling thread's current device (0 if unknown).
pub fn device(api: Api) -> usize {
    let base = match api {
        Api::Cuda => 0,
        Api::Hip => HIP_DEVICE_BASE,
    };
    let ord = current_ordinal(api);
    ord.and_then(|o| usize::try_from(o).ok())
        .filter(|&o| o < MAX_ORDINALS)
        .map_or(base, |o| base + o)
}

/// The ledger record of gate device `dev` (bound by the UUID its API reports).
pub fn dev_index(l: &Ledger, dev: usize) -> Option<usize> {
    let (api, ord) = match dev.checked_sub(HIP_DEVICE_BASE) {
        None => (Api::Cuda, dev),
        Some(ord) => (Api::Hip, ord),
    };
    table(api).and_then(|t| (t.dev_index)(l, ord as c_int))
}
