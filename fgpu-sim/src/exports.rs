//! The exported C symbols.
//!
//! Every exported entry point is a naked trampoline — `push rbp; mov rbp, rsp; pop rbp;
//! jmp impl` — that tail-jumps to the Rust implementation with all argument registers and
//! the stack untouched. This guarantees a uprobe-safe first instruction (0x55, `push rbp`):
//! a uprobe on a function whose first instruction carries a `lock` prefix (as an atomic RMW
//! right at entry would) is silently disabled by the kernel.

#![allow(non_snake_case)]

use crate::cuda::{
    array, batch, context, copy, device, export_table, gpa, host, launch, memory, pool, stream, vmm,
};
use crate::nvml;

macro_rules! trampolines {
    ($($name:ident => $target:path;)*) => {
        $(
            #[unsafe(no_mangle)]
            #[unsafe(naked)]
            pub extern "C" fn $name() {
                #[cfg(target_arch = "x86_64")]
                core::arch::naked_asm!(
                    // A hidden alias (`<name>_entry`): the address of the export that
                    // symbol interposition (an LD_PRELOADed library defining the same name)
                    // cannot redirect, for the driver's own tables (cuda::export_table).
                    concat!(".globl ", stringify!($name), "_entry"),
                    concat!(".hidden ", stringify!($name), "_entry"),
                    concat!(stringify!($name), "_entry:"),
                    "push rbp",
                    "mov rbp, rsp",
                    "pop rbp",
                    "jmp {target}",
                    target = sym $target,
                );
                #[cfg(target_arch = "aarch64")]
                core::arch::naked_asm!("nop", "b {target}", target = sym $target);
            }
        )*
    };
}
pub(crate) use trampolines;

trampolines! {
    cuInit => device::cu_init;
    cuDriverGetVersion => device::cu_driver_get_version;
    cuDeviceGet => device::cu_device_get;
    cuDeviceGetCount => device::cu_device_get_count;
    cuDeviceGetName => device::cu_device_get_name;
    cuDeviceGetUuid => device::cu_device_get_uuid;
    cuDeviceGetUuid_v2 => device::cu_device_get_uuid;
    cuDeviceGetAttribute => device::cu_device_get_attribute;
    cuDeviceCanAccessPeer => device::cu_device_can_access_peer;
    cuDeviceTotalMem => device::cu_device_total_mem;
    cuDeviceTotalMem_v2 => device::cu_device_total_mem;
    cuDevicePrimaryCtxRetain => context::cu_device_primary_ctx_retain;
    cuDevicePrimaryCtxRelease_v2 => context::cu_device_primary_ctx_release;
    cuCtxGetCurrent => context::cu_ctx_get_current;
    cuCtxSetCurrent => context::cu_ctx_set_current;
    cuCtxPushCurrent_v2 => context::cu_ctx_push_current;
    cuCtxPopCurrent_v2 => context::cu_ctx_pop_current;
    cuCtxGetDevice => context::cu_ctx_get_device;
    cuCtxSynchronize => context::cu_ctx_synchronize;
    fgpuSimFault => context::fgpu_sim_fault;
    cuGetProcAddress => gpa::cu_get_proc_address;
    cuGetProcAddress_v2 => gpa::cu_get_proc_address_v2;
    cuGetExportTable => export_table::cu_get_export_table;
    cuGetErrorString => crate::cuda::get_error_string;
    cuGetErrorName => crate::cuda::get_error_name;

    cuMemAlloc_v2 => memory::cu_mem_alloc;
    cuMemAllocPitch_v2 => memory::cu_mem_alloc_pitch;
    cuMemAllocManaged => memory::cu_mem_alloc_managed;
    cuMemFree_v2 => memory::cu_mem_free;
    cuMemGetInfo_v2 => memory::cu_mem_get_info;
    cuMemGetAddressRange_v2 => copy::cu_mem_get_address_range;
    cuMemcpy => copy::cu_memcpy;
    cuMemcpy_ptds => copy::cu_memcpy;
    cuMemcpyHtoD_v2 => copy::cu_memcpy_htod;
    cuMemcpyHtoD_v2_ptds => copy::cu_memcpy_htod;
    cuMemcpyDtoH_v2 => copy::cu_memcpy_dtoh;
    cuMemcpyDtoH_v2_ptds => copy::cu_memcpy_dtoh;
    cuMemcpyDtoD_v2 => copy::cu_memcpy_dtod;
    cuMemcpyDtoD_v2_ptds => copy::cu_memcpy_dtod;
    cuMemcpyHtoDAsync_v2 => copy::cu_memcpy_htod_async;
    cuMemcpyHtoDAsync_v2_ptsz => copy::cu_memcpy_htod_async;
    cuMemcpyDtoHAsync_v2 => copy::cu_memcpy_dtoh_async;
    cuMemcpyDtoHAsync_v2_ptsz => copy::cu_memcpy_dtoh_async;
    cuMemcpyDtoDAsync_v2 => copy::cu_memcpy_dtod_async;
    cuMemcpyDtoDAsync_v2_ptsz => copy::cu_memcpy_dtod_async;
    cuMemsetD8_v2 => copy::cu_memset_d8;
    cuMemsetD8_v2_ptds => copy::cu_memset_d8;
    cuMemsetD32_v2 => copy::cu_memset_d32;
    cuMemsetD32_v2_ptds => copy::cu_memset_d32;
    cuMemcpyBatchAsync => batch::cu_memcpy_batch_async;
    cuMemcpyBatchAsync_ptsz => batch::cu_memcpy_batch_async;
    cuMemcpyBatchAsync_v2 => batch::cu_memcpy_batch_async_v2;
    cuMemcpyBatchAsync_v2_ptsz => batch::cu_memcpy_batch_async_v2;
    cuStreamWriteValue32 => batch::cu_stream_write_value32;
    cuStreamWriteValue32_ptsz => batch::cu_stream_write_value32;
    cuStreamWriteValue32_v2 => batch::cu_stream_write_value32;
    cuStreamWriteValue32_v2_ptsz => batch::cu_stream_write_value32;
    cuStreamWriteValue64 => batch::cu_stream_write_value64;
    cuStreamWriteValue64_ptsz => batch::cu_stream_write_value64;
    cuStreamWriteValue64_v2 => batch::cu_stream_write_value64;
    cuStreamWriteValue64_v2_ptsz => batch::cu_stream_write_value64;
    cuStreamWaitValue32 => batch::cu_stream_wait_value32;
    cuStreamWaitValue32_ptsz => batch::cu_stream_wait_value32;
    cuStreamWaitValue32_v2 => batch::cu_stream_wait_value32;
    cuStreamWaitValue32_v2_ptsz => batch::cu_stream_wait_value32;
    cuStreamWaitValue64 => batch::cu_stream_wait_value64;
    cuStreamWaitValue64_ptsz => batch::cu_stream_wait_value64;
    cuStreamWaitValue64_v2 => batch::cu_stream_wait_value64;
    cuStreamWaitValue64_v2_ptsz => batch::cu_stream_wait_value64;
    cuStreamBatchMemOp => batch::cu_stream_batch_mem_op;
    cuStreamBatchMemOp_ptsz => batch::cu_stream_batch_mem_op;
    cuStreamBatchMemOp_v2 => batch::cu_stream_batch_mem_op;
    cuStreamBatchMemOp_v2_ptsz => batch::cu_stream_batch_mem_op;
    cuMemAllocHost_v2 => host::cu_mem_alloc_host;
    cuMemHostAlloc => host::cu_mem_host_alloc;
    cuMemFreeHost => host::cu_mem_free_host;
    cuMemHostRegister_v2 => host::cu_mem_host_register;
    cuMemHostUnregister => host::cu_mem_host_unregister;
    cuMemAllocAsync => pool::cu_mem_alloc_async;
    cuMemAllocAsync_ptsz => pool::cu_mem_alloc_async;
    cuMemAllocFromPoolAsync => pool::cu_mem_alloc_from_pool_async;
    cuMemAllocFromPoolAsync_ptsz => pool::cu_mem_alloc_from_pool_async;
    cuMemFreeAsync => pool::cu_mem_free_async;
    cuMemFreeAsync_ptsz => pool::cu_mem_free_async;
    cuMemPoolCreate => pool::cu_mem_pool_create;
    cuMemPoolDestroy => pool::cu_mem_pool_destroy;
    cuMemPoolTrimTo => pool::cu_mem_pool_trim_to;
    cuDeviceGetDefaultMemPool => pool::cu_device_get_default_mem_pool;
    cuMemCreate => vmm::cu_mem_create;
    cuMemRelease => vmm::cu_mem_release;
    cuMemAddressReserve => vmm::cu_mem_address_reserve;
    cuMemAddressFree => vmm::cu_mem_address_free;
    cuMemMap => vmm::cu_mem_map;
    cuMemUnmap => vmm::cu_mem_unmap;
    cuMemSetAccess => vmm::cu_mem_set_access;
    cuMemGetAllocationGranularity => vmm::cu_mem_get_allocation_granularity;
    cuArrayCreate_v2 => array::cu_array_create;
    cuArray3DCreate_v2 => array::cu_array3d_create;
    cuArrayDestroy => array::cu_array_destroy;
    cuMipmappedArrayCreate => array::cu_mipmapped_array_create;
    cuMipmappedArrayDestroy => array::cu_mipmapped_array_destroy;

    cuStreamCreate => stream::cu_stream_create;
    cuStreamDestroy_v2 => stream::cu_stream_destroy;
    cuStreamSynchronize => stream::cu_stream_synchronize;
    cuStreamQuery => stream::cu_stream_query;
    cuStreamBeginCapture_v2 => stream::cu_stream_begin_capture;
    cuStreamEndCapture => stream::cu_stream_end_capture;
    cuStreamIsCapturing => stream::cu_stream_is_capturing;
    cuEventCreate => stream::cu_event_create;
    cuEventRecord => stream::cu_event_record;
    cuEventSynchronize => stream::cu_event_synchronize;
    cuEventQuery => stream::cu_event_query;
    cuEventElapsedTime => stream::cu_event_elapsed_time;
    cuEventDestroy_v2 => stream::cu_event_destroy;

    cuModuleLoadData => launch::cu_module_load_data;
    cuModuleLoad => launch::cu_module_load;
    cuModuleGetFunction => launch::cu_module_get_function;
    cuModuleUnload => launch::cu_module_unload;
    cuLaunchKernel => launch::cu_launch_kernel;
    cuLaunchKernel_ptsz => launch::cu_launch_kernel;
    cuLaunchKernelEx => launch::cu_launch_kernel_ex;
    cuLaunchKernelEx_ptsz => launch::cu_launch_kernel_ex;
    cuLaunchCooperativeKernel => launch::cu_launch_cooperative_kernel;
    cuLaunchCooperativeKernel_ptsz => launch::cu_launch_cooperative_kernel;
    cuGraphInstantiateWithFlags => launch::cu_graph_instantiate_with_flags;
    cuGraphLaunch => launch::cu_graph_launch;
    cuGraphLaunch_ptsz => launch::cu_graph_launch;
    cuGraphExecDestroy => launch::cu_graph_exec_destroy;
    cuGraphDestroy => launch::cu_graph_destroy;

    nvmlInit => nvml::init;
    nvmlInit_v2 => nvml::init;
    nvmlShutdown => nvml::shutdown;
    nvmlErrorString => nvml::error_string;
    nvmlSystemGetDriverVersion => nvml::system_get_driver_version;
    nvmlDeviceGetCount => nvml::device_get_count;
    nvmlDeviceGetCount_v2 => nvml::device_get_count;
    nvmlDeviceGetHandleByIndex => nvml::device_get_handle_by_index;
    nvmlDeviceGetHandleByIndex_v2 => nvml::device_get_handle_by_index;
    nvmlDeviceGetHandleByUUID => nvml::device_get_handle_by_uuid;
    nvmlDeviceGetIndex => nvml::device_get_index;
    nvmlDeviceGetName => nvml::device_get_name;
    nvmlDeviceGetUUID => nvml::device_get_uuid;
    nvmlDeviceGetMemoryInfo => nvml::device_get_memory_info;
    nvmlDeviceGetMemoryInfo_v2 => nvml::device_get_memory_info_v2;
    nvmlDeviceGetComputeRunningProcesses_v3 => nvml::device_get_compute_running_processes;
    nvmlDeviceGetProcessUtilization => nvml::device_get_process_utilization;
    nvmlDeviceGetUtilizationRates => nvml::device_get_utilization_rates;
}
