//! CUDA (NVIDIA): the driver API's and NVML's wrapped entry points, over the accounting
//! (crate::account) and the launch gate (crate::gate); AMD's are in crate::hip.
//!
//! - [`nvml`]: NVML's memory-info answers and the shim's own NVML queries; [`pool`]:
//!   stream-ordered allocation and memory pools;
//! - [`context`]: context overhead, charged per process and device (measured through NVML);
//! - [`alloc`]: linear allocations and their frees; [`array`]: CUDA arrays; [`vmm`]:
//!   cuMemCreate/Map/Unmap/Release; [`meminfo`]: cuMemGetInfo_v2 and cuDeviceTotalMem_v2
//!   report the limit; [`launch`]: the launch entry points (their fast paths published by the
//!   gate through a callback lib.rs registers);
//! - [`gpa`]: `cuGetProcAddress(_v2)` and the table of every wrapped entry point;
//! - here: what the gate needs of CUDA ([`GATE_API`], registered by lib.rs).

pub mod alloc;
pub mod array;
pub mod context;
pub mod copies;
pub mod gpa;
pub mod launch;
pub mod meminfo;
pub mod nvml;
pub mod pool;
pub mod vmm;

use crate::real;

/// What the gate needs of CUDA's driver API (registered by lib.rs at load time).
pub static GATE_API: crate::gate::GateApi = crate::gate::GateApi {
    current_ordinal: crate::account::current_ordinal,
    dev_index: crate::account::dev_index,
    stream_is_capturing: &real::CU_STREAM_IS_CAPTURING,
    exchange_capture_mode: &real::CU_THREAD_EXCHANGE_STREAM_CAPTURE_MODE,
    event_create: &real::CU_EVENT_CREATE,
    event_destroy: &real::CU_EVENT_DESTROY,
    event_record: &real::CU_EVENT_RECORD,
    event_query: &real::CU_EVENT_QUERY,
    event_elapsed_time: &[
        &real::CU_EVENT_ELAPSED_TIME,
        &real::CU_EVENT_ELAPSED_TIME_V2,
    ],
    stream_query: &real::CU_STREAM_QUERY,
    context: crate::gate::Contexts::Driver {
        get_current: &real::CU_CTX_GET_CURRENT,
        set_current: &real::CU_CTX_SET_CURRENT,
    },
};
