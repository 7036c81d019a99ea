//! The driver library as the CUDA runtime reaches it: `dlopen`, `cuGetProcAddress_v2` (or
//! `dlsym` of the versioned names), the private launch table; the entry points this program
//! uses, with their C signatures.

use std::ffi::{CStr, CString, c_char, c_void};

use crate::out;

pub(crate) type Ptr = *mut c_void;

pub(crate) struct Lib {
    pub(crate) handle: Ptr,
    pub(crate) gpa:
        Option<unsafe extern "C" fn(*const c_char, *mut Ptr, i32, u64, *mut i32) -> i32>,
    pub(crate) direct: bool,
    pub(crate) flags: u64,
}

impl Lib {
    pub(crate) fn open(path: &str) -> Result<Lib, String> {
        let c = CString::new(path).map_err(|e| e.to_string())?;
        // SAFETY: valid C string; dlopen has no other preconditions.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a valid C string after a failed dlopen.
            let err = unsafe { CStr::from_ptr(libc::dlerror()) };
            return Err(err.to_string_lossy().into_owned());
        }
        Ok(Lib {
            handle,
            gpa: None,
            direct: false,
            flags: 0,
        })
    }

    pub(crate) fn dlsym(&self, name: &str) -> Ptr {
        let c = CString::new(name).unwrap_or_default();
        // SAFETY: valid handle from dlopen and a valid C string.
        unsafe { libc::dlsym(self.handle, c.as_ptr()) }
    }

    /// Resolves an entry point: via cuGetProcAddress_v2(base), or dlsym(versioned) if direct.
    pub(crate) fn resolve(&self, base: &str, versioned: &str) -> Ptr {
        if self.direct {
            return self.dlsym(versioned);
        }
        let Some(gpa) = self.gpa else {
            return std::ptr::null_mut();
        };
        let c = CString::new(base).unwrap_or_default();
        let mut p: Ptr = std::ptr::null_mut();
        let mut status = 0;
        // SAFETY: cuGetProcAddress_v2's C signature; all pointers are valid locals.
        unsafe { gpa(c.as_ptr(), &mut p, 12000, self.flags, &mut status) };
        p
    }
}

/// Resolves `$base` (or dlsym `$versioned`) as a function pointer; exits if missing.
macro_rules! entry {
    ($lib:expr, $base:literal, $versioned:literal) => {{
        let p = $lib.resolve($base, $versioned);
        if p.is_null() {
            println!("error missing={}", $base);
            std::process::exit(2);
        }
        // SAFETY: the driver API documents this symbol with exactly the C signature of the
        // field it is stored into (see `Api`).
        unsafe { fn_ptr(p) }
    }};
}

pub(crate) type R = i32;

#[repr(C)]
pub(crate) struct AllocProp {
    pub(crate) alloc_type: i32,
    pub(crate) handle_types: i32,
    pub(crate) location_type: i32,
    pub(crate) location_id: i32,
    pub(crate) win32: Ptr,
    pub(crate) flags: [u8; 8],
}

#[repr(C)]
pub(crate) struct PoolProps {
    pub(crate) alloc_type: i32,
    pub(crate) handle_types: i32,
    pub(crate) location_type: i32,
    pub(crate) location_id: i32,
    pub(crate) win32: Ptr,
    pub(crate) max_size: usize,
    pub(crate) usage: u16,
    pub(crate) reserved: [u8; 54],
}

#[repr(C)]
pub(crate) struct AccessDesc {
    pub(crate) location_type: i32,
    pub(crate) location_id: i32,
    pub(crate) flags: i32,
}

#[repr(C)]
pub(crate) struct ArrayDesc {
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) format: i32,
    pub(crate) channels: u32,
}

/// Reinterprets a non-NULL symbol address as a function pointer of type `F`.
///
/// # Safety
/// `F` must be a function pointer type matching the symbol's C signature.
pub(crate) unsafe fn fn_ptr<F: Copy>(p: Ptr) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<Ptr>());
    // SAFETY: same size (checked); validity of the signature is the caller's promise.
    unsafe { std::mem::transmute_copy::<Ptr, F>(&p) }
}

/// The driver entry points this program uses, with their C signatures.
pub(crate) struct Api {
    pub(crate) device_get: unsafe extern "C" fn(*mut i32, i32) -> R,
    pub(crate) device_get_count: unsafe extern "C" fn(*mut i32) -> R,
    pub(crate) device_get_uuid: unsafe extern "C" fn(*mut [u8; 16], i32) -> R,
    pub(crate) ctx_retain: unsafe extern "C" fn(*mut usize, i32) -> R,
    pub(crate) ctx_set_current: unsafe extern "C" fn(usize) -> R,
    pub(crate) ctx_synchronize: unsafe extern "C" fn() -> R,
    pub(crate) mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
    pub(crate) mem_alloc_pitch: unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, u32) -> R,
    pub(crate) mem_alloc_managed: unsafe extern "C" fn(*mut u64, usize, u32) -> R,
    pub(crate) mem_alloc_async: unsafe extern "C" fn(*mut u64, usize, usize) -> R,
    pub(crate) mem_alloc_from_pool_async: unsafe extern "C" fn(*mut u64, usize, usize, usize) -> R,
    pub(crate) mem_pool_create: unsafe extern "C" fn(*mut usize, *const PoolProps) -> R,
    pub(crate) mem_pool_trim_to: unsafe extern "C" fn(usize, usize) -> R,
    pub(crate) default_mem_pool: unsafe extern "C" fn(*mut usize, i32) -> R,
    pub(crate) mem_free: unsafe extern "C" fn(u64) -> R,
    pub(crate) mem_free_async: unsafe extern "C" fn(u64, usize) -> R,
    pub(crate) mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> R,
    pub(crate) mem_create: unsafe extern "C" fn(*mut usize, usize, *const AllocProp, u64) -> R,
    pub(crate) mem_release: unsafe extern "C" fn(usize) -> R,
    pub(crate) mem_address_reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> R,
    pub(crate) mem_address_free: unsafe extern "C" fn(u64, usize) -> R,
    pub(crate) mem_map: unsafe extern "C" fn(u64, usize, usize, usize, u64) -> R,
    pub(crate) mem_unmap: unsafe extern "C" fn(u64, usize) -> R,
    pub(crate) mem_set_access: unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> R,
    pub(crate) memcpy_htod: unsafe extern "C" fn(u64, *const u8, usize) -> R,
    pub(crate) memcpy_dtoh: unsafe extern "C" fn(*mut u8, u64, usize) -> R,
    pub(crate) memcpy_dtod: unsafe extern "C" fn(u64, u64, usize) -> R,
    pub(crate) memset_d8: unsafe extern "C" fn(u64, u8, usize) -> R,
    pub(crate) array_create: unsafe extern "C" fn(*mut usize, *const ArrayDesc) -> R,
    pub(crate) array_destroy: unsafe extern "C" fn(usize) -> R,
    pub(crate) module_load_data: unsafe extern "C" fn(*mut usize, *const c_void) -> R,
    pub(crate) module_get_function: unsafe extern "C" fn(*mut usize, usize, *const c_char) -> R,
    pub(crate) launch_kernel: unsafe extern "C" fn(
        usize,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        usize,
        *mut Ptr,
        *mut Ptr,
    ) -> R,
    pub(crate) stream_create: unsafe extern "C" fn(*mut usize, u32) -> R,
    pub(crate) stream_synchronize: unsafe extern "C" fn(usize) -> R,
    pub(crate) stream_begin_capture: unsafe extern "C" fn(usize, i32) -> R,
    pub(crate) stream_end_capture: unsafe extern "C" fn(usize, *mut usize) -> R,
    pub(crate) graph_instantiate: unsafe extern "C" fn(*mut usize, usize, u64) -> R,
    pub(crate) graph_launch: unsafe extern "C" fn(usize, usize) -> R,
    /// Optional, looked up by exported name (a driver older than CUDA 12.8 or 13.0 lacks
    /// them; the commands that use them report `error missing=NAME`).
    pub(crate) memcpy_batch: Option<BatchFn>,
    pub(crate) memcpy_batch_v2: Option<BatchV2Fn>,
    pub(crate) write_value32: Option<StreamValueFn>,
    pub(crate) wait_value32: Option<StreamValueFn>,
    pub(crate) batch_mem_op: Option<BatchMemOpFn>,
}

/// `cuMemcpyBatchAsync` (CUDA 12.8): dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
/// failIdx, stream.
pub(crate) type BatchFn = unsafe extern "C" fn(
    *const u64,
    *const u64,
    *const usize,
    usize,
    *const MemcpyAttributes,
    *const usize,
    usize,
    *mut usize,
    usize,
) -> R;
/// `cuMemcpyBatchAsync_v2` (CUDA 13.0): as [`BatchFn`] without failIdx.
pub(crate) type BatchV2Fn = unsafe extern "C" fn(
    *const u64,
    *const u64,
    *const usize,
    usize,
    *const MemcpyAttributes,
    *const usize,
    usize,
    usize,
) -> R;
/// `cuStreamWriteValue32_v2` / `cuStreamWaitValue32_v2`: stream, address, value, flags.
pub(crate) type StreamValueFn = unsafe extern "C" fn(usize, u64, u32, u32) -> R;
/// `cuStreamBatchMemOp_v2(stream, count, CUstreamBatchMemOpParams*, flags)`.
pub(crate) type BatchMemOpFn = unsafe extern "C" fn(usize, u32, *const MemOp, u32) -> R;

/// `CUstreamBatchMemOpParams` (a union of 48 bytes) as a wait or a write fills it: the
/// operation, the address, the value, the flags, the alias (unused), padding.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct MemOp {
    pub(crate) operation: u32,
    pub(crate) address: u64,
    pub(crate) value: u64,
    pub(crate) flags: u32,
    pub(crate) alias: u64,
    pub(crate) pad: u64,
}

/// `CUmemcpyAttributes`: srcAccessOrder, srcLocHint and dstLocHint (`CUmemLocation`s), flags.
#[repr(C)]
pub(crate) struct MemcpyAttributes {
    pub(crate) src_access_order: u32,
    pub(crate) src_loc_hint: [i32; 2],
    pub(crate) dst_loc_hint: [i32; 2],
    pub(crate) flags: u32,
}

/// Looks `$name` up by its exported name; `None` if the driver has no such symbol.
macro_rules! optional {
    ($lib:expr, $name:literal) => {{
        let p = $lib.dlsym($name);
        // SAFETY: as in `entry!`: the field's type is the symbol's documented C signature.
        (!p.is_null()).then(|| unsafe { fn_ptr(p) })
    }};
}

impl Api {
    pub(crate) fn load(lib: &Lib) -> Api {
        Api {
            device_get: entry!(lib, "cuDeviceGet", "cuDeviceGet"),
            device_get_count: entry!(lib, "cuDeviceGetCount", "cuDeviceGetCount"),
            device_get_uuid: entry!(lib, "cuDeviceGetUuid", "cuDeviceGetUuid_v2"),
            ctx_retain: entry!(lib, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain"),
            ctx_set_current: entry!(lib, "cuCtxSetCurrent", "cuCtxSetCurrent"),
            ctx_synchronize: entry!(lib, "cuCtxSynchronize", "cuCtxSynchronize"),
            mem_alloc: entry!(lib, "cuMemAlloc", "cuMemAlloc_v2"),
            mem_alloc_pitch: entry!(lib, "cuMemAllocPitch", "cuMemAllocPitch_v2"),
            mem_alloc_managed: entry!(lib, "cuMemAllocManaged", "cuMemAllocManaged"),
            mem_alloc_async: entry!(lib, "cuMemAllocAsync", "cuMemAllocAsync"),
            mem_alloc_from_pool_async: entry!(
                lib,
                "cuMemAllocFromPoolAsync",
                "cuMemAllocFromPoolAsync"
            ),
            mem_pool_create: entry!(lib, "cuMemPoolCreate", "cuMemPoolCreate"),
            mem_pool_trim_to: entry!(lib, "cuMemPoolTrimTo", "cuMemPoolTrimTo"),
            default_mem_pool: entry!(
                lib,
                "cuDeviceGetDefaultMemPool",
                "cuDeviceGetDefaultMemPool"
            ),
            mem_free: entry!(lib, "cuMemFree", "cuMemFree_v2"),
            mem_free_async: entry!(lib, "cuMemFreeAsync", "cuMemFreeAsync"),
            mem_get_info: entry!(lib, "cuMemGetInfo", "cuMemGetInfo_v2"),
            mem_create: entry!(lib, "cuMemCreate", "cuMemCreate"),
            mem_release: entry!(lib, "cuMemRelease", "cuMemRelease"),
            mem_address_reserve: entry!(lib, "cuMemAddressReserve", "cuMemAddressReserve"),
            mem_address_free: entry!(lib, "cuMemAddressFree", "cuMemAddressFree"),
            mem_map: entry!(lib, "cuMemMap", "cuMemMap"),
            mem_unmap: entry!(lib, "cuMemUnmap", "cuMemUnmap"),
            mem_set_access: entry!(lib, "cuMemSetAccess", "cuMemSetAccess"),
            memcpy_htod: entry!(lib, "cuMemcpyHtoD", "cuMemcpyHtoD_v2"),
            memcpy_dtoh: entry!(lib, "cuMemcpyDtoH", "cuMemcpyDtoH_v2"),
            memcpy_dtod: entry!(lib, "cuMemcpyDtoD", "cuMemcpyDtoD_v2"),
            memset_d8: entry!(lib, "cuMemsetD8", "cuMemsetD8_v2"),
            array_create: entry!(lib, "cuArrayCreate", "cuArrayCreate_v2"),
            array_destroy: entry!(lib, "cuArrayDestroy", "cuArrayDestroy"),
            module_load_data: entry!(lib, "cuModuleLoadData", "cuModuleLoadData"),
            module_get_function: entry!(lib, "cuModuleGetFunction", "cuModuleGetFunction"),
            launch_kernel: entry!(lib, "cuLaunchKernel", "cuLaunchKernel"),
            stream_create: entry!(lib, "cuStreamCreate", "cuStreamCreate"),
            stream_synchronize: entry!(lib, "cuStreamSynchronize", "cuStreamSynchronize"),
            stream_begin_capture: entry!(lib, "cuStreamBeginCapture", "cuStreamBeginCapture_v2"),
            stream_end_capture: entry!(lib, "cuStreamEndCapture", "cuStreamEndCapture"),
            graph_instantiate: entry!(
                lib,
                "cuGraphInstantiateWithFlags",
                "cuGraphInstantiateWithFlags"
            ),
            graph_launch: entry!(lib, "cuGraphLaunch", "cuGraphLaunch"),
            memcpy_batch: optional!(lib, "cuMemcpyBatchAsync"),
            memcpy_batch_v2: optional!(lib, "cuMemcpyBatchAsync_v2"),
            write_value32: optional!(lib, "cuStreamWriteValue32_v2"),
            wait_value32: optional!(lib, "cuStreamWaitValue32_v2"),
            batch_mem_op: optional!(lib, "cuStreamBatchMemOp_v2"),
        }
    }
}

/// Replaces the launch entry points with the pointers of the simulator's private launch
/// table (fgpu-sim's `cuda::export_table`: `{ size, cuLaunchKernel, cuLaunchKernel_ptsz,
/// cuGraphLaunch }`); exits if the driver has none.
pub(crate) fn launch_table(lib: &Lib, api: &mut Api, ptsz: bool) {
    const ID: [u8; 16] = *b"fgpu-sim-launch\0";
    let get = lib.resolve("cuGetExportTable", "cuGetExportTable");
    if get.is_null() {
        out("error missing=cuGetExportTable".into());
        std::process::exit(2);
    }
    // SAFETY: cuGetExportTable(const void **, const CUuuid *).
    let get: unsafe extern "C" fn(*mut *const usize, *const [u8; 16]) -> R = unsafe { fn_ptr(get) };
    let mut t: *const usize = std::ptr::null();
    // SAFETY: valid out-pointer and id.
    let rc = unsafe { get(&mut t, &ID) };
    if rc != 0 || t.is_null() {
        out(format!("error export-table rc={rc}"));
        std::process::exit(2);
    }
    // SAFETY: the table has four pointer-sized fields (size first); the pointers are the
    // driver's launch functions with the signatures of the fields they replace.
    unsafe {
        let kernel = *t.add(if ptsz { 2 } else { 1 }) as Ptr;
        api.launch_kernel = fn_ptr(kernel);
        api.graph_launch = fn_ptr(*t.add(3) as Ptr);
    }
}
