//! The exported HIP runtime (`libamdhip64.so`), ROCm SMI (`librocm_smi64.so`) and AMD SMI
//! (`libamd_smi.so`) symbols:
//! naked trampolines like the CUDA ones ([`crate::exports`]), uprobe-safe at entry, and the
//! name → entry table that `hipGetProcAddress` answers from.

#![allow(non_snake_case)]

use crate::hip::{amdsmi, device, exec, memory, smi};

macro_rules! hip_exports {
    ($($name:ident => $target:path;)*) => {
        crate::exports::trampolines! { $($name => $target;)* }

        /// Our exported entry point called `name`.
        pub fn entry(name: &str) -> Option<extern "C" fn()> {
            match name {
                $(stringify!($name) => Some($name as extern "C" fn()),)*
                _ => None,
            }
        }
    };
}

hip_exports! {
    hipInit => device::hip_init;
    hipDriverGetVersion => device::hip_version;
    hipRuntimeGetVersion => device::hip_version;
    hipGetDeviceCount => device::hip_get_device_count;
    hipSetDevice => device::hip_set_device;
    hipGetDevice => device::hip_get_device;
    hipDeviceGetUuid => device::hip_device_get_uuid;
    hipDeviceTotalMem => device::hip_device_total_mem;
    hipDeviceGetName => device::hip_device_get_name;
    hipGetProcAddress => device::hip_get_proc_address;
    hipGetErrorName => crate::hip::get_error_name;
    hipGetErrorString => crate::hip::get_error_name;

    hipMalloc => memory::hip_malloc;
    hipExtMallocWithFlags => memory::hip_ext_malloc_with_flags;
    hipMallocManaged => memory::hip_malloc_managed;
    hipMallocPitch => memory::hip_malloc_pitch;
    hipFree => memory::hip_free;
    hipMallocAsync => memory::hip_malloc_async;
    hipMallocFromPoolAsync => memory::hip_malloc_from_pool_async;
    hipFreeAsync => memory::hip_free_async;
    hipMemPoolCreate => memory::hip_mem_pool_create;
    hipMemPoolDestroy => memory::hip_mem_pool_destroy;
    hipMemPoolTrimTo => memory::hip_mem_pool_trim_to;
    hipDeviceGetDefaultMemPool => memory::hip_device_get_default_mem_pool;
    hipMemCreate => memory::hip_mem_create;
    hipMemRelease => memory::hip_mem_release;
    hipMemAddressReserve => memory::hip_mem_address_reserve;
    hipMemAddressFree => memory::hip_mem_address_free;
    hipMemMap => memory::hip_mem_map;
    hipMemUnmap => memory::hip_mem_unmap;
    hipMemSetAccess => memory::hip_mem_set_access;
    hipMemGetAllocationGranularity => memory::hip_mem_get_allocation_granularity;
    hipMallocArray => memory::hip_malloc_array;
    hipFreeArray => memory::hip_free_array;
    hipMemGetInfo => memory::hip_mem_get_info;

    __hipRegisterFatBinary => exec::hip_register_fat_binary;
    __hipRegisterFunction => exec::hip_register_function;
    __hipUnregisterFatBinary => exec::hip_unregister_fat_binary;
    hipLaunchKernel => exec::hip_launch_kernel;
    hipLaunchKernel_spt => exec::hip_launch_kernel_spt;
    hipExtLaunchKernel => exec::hip_ext_launch_kernel;
    hipModuleLaunchKernel => exec::hip_module_launch_kernel;
    hipModuleLoadData => exec::hip_module_load_data;
    hipModuleGetFunction => exec::hip_module_get_function;
    hipModuleUnload => exec::hip_module_unload;
    hipGraphLaunch => exec::hip_graph_launch;
    hipGraphLaunch_spt => exec::hip_graph_launch_spt;
    hipStreamIsCapturing => exec::hip_stream_is_capturing;
    hipThreadExchangeStreamCaptureMode => exec::hip_thread_exchange_stream_capture_mode;
    fgpuSimHipEventStats => exec::event_stats;
    hipStreamBeginCapture => exec::hip_stream_begin_capture;
    hipStreamEndCapture => exec::hip_stream_end_capture;
    hipGraphInstantiate => exec::hip_graph_instantiate;
    hipGraphInstantiateWithFlags => exec::hip_graph_instantiate_with_flags;
    hipGraphExecDestroy => exec::hip_graph_exec_destroy;
    hipGraphDestroy => exec::hip_graph_destroy;
    hipStreamCreate => exec::hip_stream_create;
    hipStreamCreateWithFlags => exec::hip_stream_create_with_flags;
    hipStreamDestroy => exec::hip_stream_destroy;
    hipStreamSynchronize => exec::hip_stream_synchronize;
    hipStreamQuery => exec::hip_stream_query;
    hipDeviceSynchronize => exec::hip_device_synchronize;
    hipEventCreate => exec::hip_event_create;
    hipEventCreateWithFlags => exec::hip_event_create_with_flags;
    hipEventRecord => exec::hip_event_record;
    hipEventSynchronize => exec::hip_event_synchronize;
    hipEventQuery => exec::hip_event_query;
    hipEventElapsedTime => exec::hip_event_elapsed_time;
    hipEventDestroy => exec::hip_event_destroy;
    hipGetLastError => exec::hip_get_last_error;
    hipPeekAtLastError => exec::hip_get_last_error;

    rsmi_init => smi::rsmi_init;
    rsmi_shut_down => smi::rsmi_shut_down;
    rsmi_num_monitor_devices => smi::rsmi_num_monitor_devices;
    rsmi_dev_name_get => smi::rsmi_dev_name_get;
    rsmi_dev_unique_id_get => smi::rsmi_dev_unique_id_get;
    rsmi_dev_memory_total_get => smi::rsmi_dev_memory_total_get;
    rsmi_dev_memory_usage_get => smi::rsmi_dev_memory_usage_get;

    amdsmi_init => amdsmi::amdsmi_init;
    amdsmi_shut_down => amdsmi::amdsmi_shut_down;
    amdsmi_get_socket_handles => amdsmi::amdsmi_get_socket_handles;
    amdsmi_get_processor_handles => amdsmi::amdsmi_get_processor_handles;
    amdsmi_get_gpu_device_uuid => amdsmi::amdsmi_get_gpu_device_uuid;
    amdsmi_get_gpu_memory_total => amdsmi::amdsmi_get_gpu_memory_total;
    amdsmi_get_gpu_memory_usage => amdsmi::amdsmi_get_gpu_memory_usage;
    amdsmi_get_gpu_vram_usage => amdsmi::amdsmi_get_gpu_vram_usage;
}
