//! Tests that dlopen the simulated driver into the test process itself (as the CUDA runtime
//! does) and call it through function pointers.

mod common;
use common::*;
use std::ffi::{CString, c_char, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

type Ptr = *mut c_void;
type Gpa2 = unsafe extern "C" fn(*const c_char, *mut Ptr, i32, u64, *mut i32) -> i32;
type Gpa1 = unsafe extern "C" fn(*const c_char, *mut Ptr, i32, u64) -> i32;

struct Lib {
    handle: Ptr,
    _env: SimEnv,
}

// SAFETY: the dlopen handle is process-global and usable from any thread.
unsafe impl Send for Lib {}
// SAFETY: as above.
unsafe impl Sync for Lib {}

/// Opens the library once, with a private state file; serialises the tests of this binary.
fn lib() -> (&'static Lib, MutexGuard<'static, ()>) {
    static LIB: OnceLock<Lib> = OnceLock::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = LIB.get_or_init(|| {
        remove_stale_dirs();
        let env = SimEnv::new("in-process");
        // SAFETY: set once, before the library is loaded and reads its configuration; the
        // other tests of this binary wait on SERIAL/LIB and do not touch the environment.
        unsafe {
            std::env::set_var("FGPU_SIM_STATE", env.state());
            std::env::set_var("FGPU_SIM_MEMORY", "16GiB");
            std::env::set_var("FGPU_SIM_CONTEXT_OVERHEAD", "300MiB");
        }
        let path = CString::new(lib_path().to_str().expect("utf8")).expect("cstr");
        // SAFETY: valid path string.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null());
        Lib { handle, _env: env }
    });
    (lib, guard)
}

/// This binary's environment outlives the test (it is a static): clean up after earlier runs.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("fgpu-sim-test-in-process-")
            && !std::path::Path::new("/proc").join(pid).exists()
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Lib {
    fn sym(&self, name: &str) -> Ptr {
        let c = CString::new(name).expect("cstr");
        // SAFETY: valid handle and symbol name.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        assert!(!p.is_null(), "{name} not exported");
        p
    }

    /// A typed function pointer for an exported symbol.
    ///
    /// # Safety
    /// `F` must be the symbol's real C signature.
    unsafe fn f<F: Copy>(&self, name: &str) -> F {
        let p = self.sym(name);
        // SAFETY: the caller names the correct function pointer type.
        unsafe { std::mem::transmute_copy::<Ptr, F>(&p) }
    }

    /// cuGetProcAddress_v2 → (rc, pointer, status).
    fn gpa(&self, name: &str, version: i32, flags: u64) -> (i32, Ptr, i32) {
        // SAFETY: cuGetProcAddress_v2's signature.
        let gpa: Gpa2 = unsafe { self.f("cuGetProcAddress_v2") };
        let c = CString::new(name).expect("cstr");
        let (mut p, mut status) = (std::ptr::null_mut(), -1);
        // SAFETY: valid pointers to locals.
        let rc = unsafe { gpa(c.as_ptr(), &mut p, version, flags, &mut status) };
        (rc, p, status)
    }

    /// cuInit + primary context current on this thread.
    fn context(&self) {
        // SAFETY: documented signatures; valid out-pointers.
        unsafe {
            let init: unsafe extern "C" fn(u32) -> i32 = self.f("cuInit");
            let retain: unsafe extern "C" fn(*mut usize, i32) -> i32 =
                self.f("cuDevicePrimaryCtxRetain");
            let set: unsafe extern "C" fn(usize) -> i32 = self.f("cuCtxSetCurrent");
            assert_eq!(init(0), 0);
            let mut ctx = 0usize;
            assert_eq!(retain(&mut ctx, 0), 0);
            assert_eq!(set(ctx), 0);
        }
    }

    fn free_mem(&self) -> u64 {
        // SAFETY: documented signature.
        let info: unsafe extern "C" fn(*mut usize, *mut usize) -> i32 =
            unsafe { self.f("cuMemGetInfo_v2") };
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        assert_eq!(unsafe { info(&mut free, &mut total) }, 0);
        free as u64
    }
}

#[test]
fn get_proc_address_selects_variants() {
    let (lib, _g) = lib();
    let cases: &[(&str, i32, u64, &str)] = &[
        ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 12000, 2, "cuMemAlloc_v2"), // no _ptsz variant: the default one
        ("cuMemFree", 12000, 0, "cuMemFree_v2"),
        ("cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"),
        ("cuLaunchKernel", 12000, 0, "cuLaunchKernel"),
        ("cuLaunchKernel", 12000, 1, "cuLaunchKernel"),
        ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
        ("cuLaunchKernelEx", 12000, 2, "cuLaunchKernelEx_ptsz"),
        (
            "cuLaunchCooperativeKernel",
            12000,
            2,
            "cuLaunchCooperativeKernel_ptsz",
        ),
        ("cuGraphLaunch", 12000, 2, "cuGraphLaunch_ptsz"),
        ("cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz"),
        ("cuMemAllocAsync", 12000, 0, "cuMemAllocAsync"),
        ("cuMemFreeAsync", 12000, 2, "cuMemFreeAsync_ptsz"),
        (
            "cuMemAllocFromPoolAsync",
            12000,
            2,
            "cuMemAllocFromPoolAsync_ptsz",
        ),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
        ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
        ("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"),
        ("cuDeviceGetUuid", 11000, 0, "cuDeviceGetUuid"),
        ("cuDeviceTotalMem", 3020, 0, "cuDeviceTotalMem_v2"),
        ("cuDeviceTotalMem", 3000, 0, "cuDeviceTotalMem"),
        (
            "cuDevicePrimaryCtxRelease",
            11000,
            0,
            "cuDevicePrimaryCtxRelease_v2",
        ),
        ("cuStreamDestroy", 12000, 0, "cuStreamDestroy_v2"),
        ("cuEventDestroy", 12000, 0, "cuEventDestroy_v2"),
        ("cuStreamBeginCapture", 12000, 0, "cuStreamBeginCapture_v2"),
        ("cuArrayCreate", 12000, 0, "cuArrayCreate_v2"),
        ("cuMemCreate", 12000, 0, "cuMemCreate"),
        ("cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2"),
        ("cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds"),
        ("cuMemcpyDtoDAsync", 12000, 0, "cuMemcpyDtoDAsync_v2"),
        ("cuMemcpyDtoDAsync", 12000, 2, "cuMemcpyDtoDAsync_v2_ptsz"),
        ("cuMemcpy", 12000, 0, "cuMemcpy"),
        ("cuMemsetD8", 12000, 2, "cuMemsetD8_v2_ptds"),
        ("cuMemAllocHost", 12000, 0, "cuMemAllocHost_v2"),
        ("cuMemGetAddressRange", 12000, 0, "cuMemGetAddressRange_v2"),
        ("cuCtxPushCurrent", 12000, 0, "cuCtxPushCurrent_v2"),
        ("cuCtxPopCurrent", 12000, 0, "cuCtxPopCurrent_v2"),
        (
            "cuGraphInstantiate",
            12000,
            0,
            "cuGraphInstantiateWithFlags",
        ),
    ];
    for &(base, version, flags, want) in cases {
        let (rc, p, status) = lib.gpa(base, version, flags);
        assert_eq!((rc, status), (0, 0), "{base}@{version} flags={flags}");
        assert_eq!(
            p,
            lib.sym(want),
            "{base}@{version} flags={flags} should be {want}"
        );
    }
    // Unknown symbol: success, NULL, SYMBOL_NOT_FOUND.
    assert_eq!(
        lib.gpa("cuNoSuchFunction", 12000, 0),
        (0, std::ptr::null_mut(), 1)
    );
    // Known, but only in a newer version than requested: VERSION_NOT_SUFFICIENT.
    for (base, version) in [
        ("cuMemAllocAsync", 11010),
        ("cuGetProcAddress", 11020),
        ("cuLaunchKernelEx", 11050),
        ("cuMemCreate", 10010),
    ] {
        assert_eq!(
            lib.gpa(base, version, 0),
            (0, std::ptr::null_mut(), 2),
            "{base}"
        );
    }
    // A version newer than the driver: INVALID_VALUE.
    assert_eq!(lib.gpa("cuMemAlloc", 99000, 0).0, 1);
    // The old entry point (no status argument).
    // SAFETY: cuGetProcAddress's signature.
    let gpa1: Gpa1 = unsafe { lib.f("cuGetProcAddress") };
    let mut p: Ptr = std::ptr::null_mut();
    let name = CString::new("cuMemFree").expect("cstr");
    // SAFETY: valid pointers.
    assert_eq!(unsafe { gpa1(name.as_ptr(), &mut p, 12000, 0) }, 0);
    assert_eq!(p, lib.sym("cuMemFree_v2"));
}

#[repr(C)]
struct AllocProp {
    alloc_type: i32,
    handle_types: i32,
    location_type: i32,
    location_id: i32,
    win32: Ptr,
    flags: [u8; 8],
}

#[test]
fn vmm_memory_is_freed_only_after_release_and_unmap() {
    let (lib, _g) = lib();
    lib.context();
    type Create = unsafe extern "C" fn(*mut u64, usize, *const AllocProp, u64) -> i32;
    type Reserve = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> i32;
    type Map = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> i32;
    // SAFETY: the documented signatures of these entry points.
    let (create, release, reserve, map, unmap, addr_free, gran) = unsafe {
        (
            lib.f::<Create>("cuMemCreate"),
            lib.f::<unsafe extern "C" fn(u64) -> i32>("cuMemRelease"),
            lib.f::<Reserve>("cuMemAddressReserve"),
            lib.f::<Map>("cuMemMap"),
            lib.f::<unsafe extern "C" fn(u64, usize) -> i32>("cuMemUnmap"),
            lib.f::<unsafe extern "C" fn(u64, usize) -> i32>("cuMemAddressFree"),
            lib.f::<unsafe extern "C" fn(*mut usize, *const AllocProp, i32) -> i32>(
                "cuMemGetAllocationGranularity",
            ),
        )
    };
    let prop = AllocProp {
        alloc_type: 1,
        handle_types: 0,
        location_type: 1, // DEVICE
        location_id: 0,
        win32: std::ptr::null_mut(),
        flags: [0; 8],
    };
    let host_prop = AllocProp {
        location_type: 2, // HOST: not device memory
        ..prop
    };
    let size = 8 * MIB as usize;
    let base = lib.free_mem();
    // SAFETY: documented signatures; pointers to valid locals throughout.
    unsafe {
        let mut g = 0usize;
        assert_eq!(gran(&mut g, &prop, 0), 0);
        assert_eq!(g, 2 * MIB as usize);
        let mut h = 0u64;
        assert_eq!(
            create(&mut h, 3 * MIB as usize, &prop, 0),
            1,
            "not a granularity multiple"
        );
        assert_eq!(create(&mut h, size, &host_prop, 0), 0);
        assert_eq!(
            lib.free_mem(),
            base,
            "host-located memory is not device memory"
        );
        assert_eq!(release(h), 0);

        // release first, then unmap
        assert_eq!(create(&mut h, size, &prop, 0), 0);
        assert_eq!(lib.free_mem(), base - size as u64);
        let mut va = 0u64;
        assert_eq!(reserve(&mut va, size, 0, 0, 0), 0);
        assert_eq!(va % (2 * MIB), 0);
        assert_eq!(map(va, size, 0, h, 0), 0);
        assert_eq!(release(h), 0);
        assert_eq!(lib.free_mem(), base - size as u64, "still mapped");
        assert_eq!(unmap(va, size), 0);
        assert_eq!(lib.free_mem(), base, "released and unmapped");

        // unmap first, then release
        assert_eq!(create(&mut h, size, &prop, 0), 0);
        assert_eq!(map(va, size, 0, h, 0), 0);
        assert_eq!(unmap(va, size), 0);
        assert_eq!(lib.free_mem(), base - size as u64, "not yet released");
        assert_eq!(release(h), 0);
        assert_eq!(lib.free_mem(), base);
        assert_eq!(release(h), 1, "double release");
        assert_eq!(addr_free(va, size), 0);
    }
}

#[test]
fn streams_events_and_frees() {
    let (lib, _g) = lib();
    lib.context();
    type Launch =
        unsafe extern "C" fn(usize, u32, u32, u32, u32, u32, u32, u32, usize, Ptr, Ptr) -> i32;
    // SAFETY: documented signatures; pointers to valid locals throughout.
    unsafe {
        let load: unsafe extern "C" fn(*mut usize, *const c_void) -> i32 =
            lib.f("cuModuleLoadData");
        let get: unsafe extern "C" fn(*mut usize, usize, *const c_char) -> i32 =
            lib.f("cuModuleGetFunction");
        let launch: Launch = lib.f("cuLaunchKernel");
        let stream_create: unsafe extern "C" fn(*mut usize, u32) -> i32 = lib.f("cuStreamCreate");
        let query: unsafe extern "C" fn(usize) -> i32 = lib.f("cuStreamQuery");
        let sync: unsafe extern "C" fn(usize) -> i32 = lib.f("cuStreamSynchronize");
        let ev_create: unsafe extern "C" fn(*mut usize, u32) -> i32 = lib.f("cuEventCreate");
        let record: unsafe extern "C" fn(usize, usize) -> i32 = lib.f("cuEventRecord");
        let ev_query: unsafe extern "C" fn(usize) -> i32 = lib.f("cuEventQuery");
        let ev_sync: unsafe extern "C" fn(usize) -> i32 = lib.f("cuEventSynchronize");
        let elapsed: unsafe extern "C" fn(*mut f32, usize, usize) -> i32 =
            lib.f("cuEventElapsedTime");
        let free: unsafe extern "C" fn(u64) -> i32 = lib.f("cuMemFree_v2");
        let name: unsafe extern "C" fn(i32, *mut *const c_char) -> i32 = lib.f("cuGetErrorName");

        let (mut m, mut f, mut s, mut e0, mut e1) = (0, 0, 0, 0, 0);
        assert_eq!(load(&mut m, c"x".as_ptr().cast()), 0);
        assert_eq!(get(&mut f, m, c"sleep_30000us".as_ptr()), 0);
        assert_eq!(stream_create(&mut s, 0), 0);
        assert_eq!(ev_create(&mut e0, 0), 0);
        assert_eq!(ev_create(&mut e1, 0), 0);
        let null = std::ptr::null_mut();
        assert_eq!(record(e0, s), 0);
        assert_eq!(launch(f, 1, 1, 1, 1, 1, 1, 0, s, null, null), 0);
        assert_eq!(launch(f, 1, 1, 1, 1, 1, 1, 0, s, null, null), 0);
        assert_eq!(record(e1, s), 0);
        assert_eq!(query(s), 600, "NOT_READY while kernels run");
        assert_eq!(ev_query(e1), 600);
        let mut ms = 0f32;
        assert_eq!(elapsed(&mut ms, e0, e1), 600);
        assert_eq!(ev_sync(e1), 0);
        assert_eq!(ev_query(e1), 0);
        assert_eq!(elapsed(&mut ms, e0, e1), 0);
        assert!((59.0..62.0).contains(&ms), "{ms} ms");
        assert_eq!(sync(s), 0);
        assert_eq!(query(s), 0);
        assert_eq!(launch(f, 1, 1, 1, 1, 1, 1, 0, 0xdead_0000, null, null), 400);
        assert_eq!(free(0x1234_5600), 1, "unknown pointer");
        let mut text: *const c_char = std::ptr::null();
        assert_eq!(name(2, &mut text), 0);
        assert_eq!(
            std::ffi::CStr::from_ptr(text).to_str(),
            Ok("CUDA_ERROR_OUT_OF_MEMORY")
        );
    }
}

#[test]
fn nvml_versioned_memory_info_and_process_buffer_protocol() {
    let (lib, _g) = lib();
    lib.context();
    #[repr(C)]
    #[derive(Default)]
    struct MemV2 {
        version: u32,
        total: u64,
        reserved: u64,
        free: u64,
        used: u64,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct ProcInfo {
        pid: u32,
        used: u64,
        gi: u32,
        ci: u32,
    }
    // SAFETY: documented NVML signatures; pointers to valid locals.
    unsafe {
        let init: unsafe extern "C" fn() -> i32 = lib.f("nvmlInit_v2");
        let by_index: unsafe extern "C" fn(u32, *mut Ptr) -> i32 =
            lib.f("nvmlDeviceGetHandleByIndex_v2");
        let mem2: unsafe extern "C" fn(Ptr, *mut MemV2) -> i32 =
            lib.f("nvmlDeviceGetMemoryInfo_v2");
        let procs: unsafe extern "C" fn(Ptr, *mut u32, *mut ProcInfo) -> i32 =
            lib.f("nvmlDeviceGetComputeRunningProcesses_v3");
        let by_uuid: unsafe extern "C" fn(*const c_char, *mut Ptr) -> i32 =
            lib.f("nvmlDeviceGetHandleByUUID");
        assert_eq!(init(), 0);
        let mut h: Ptr = std::ptr::null_mut();
        assert_eq!(by_index(0, &mut h), 0);
        let mut h2: Ptr = std::ptr::null_mut();
        assert_eq!(
            by_uuid(
                c"GPU-5e1a0000-0000-0000-0000-000000000000".as_ptr(),
                &mut h2
            ),
            0
        );
        assert_eq!(h, h2);
        let mut m = MemV2 {
            version: 1,
            ..MemV2::default()
        };
        assert_eq!(mem2(h, &mut m), 25, "wrong version");
        m.version = std::mem::size_of::<MemV2>() as u32 | (2 << 24);
        assert_eq!(mem2(h, &mut m), 0);
        assert_eq!(m.total, 16 * GIB);
        assert_eq!(m.free + m.used, m.total);
        assert_eq!(m.free, lib.free_mem());
        let mut n = 0u32;
        assert_eq!(
            procs(h, &mut n, std::ptr::null_mut()),
            7,
            "INSUFFICIENT_SIZE"
        );
        assert_eq!(n, 1);
        let mut buf = [ProcInfo::default(); 4];
        n = 4;
        assert_eq!(procs(h, &mut n, buf.as_mut_ptr()), 0);
        assert_eq!(n, 1);
        assert_eq!(buf[0].pid, std::process::id());
        assert_eq!(buf[0].used, m.used);
    }
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37) ^ seed ^ (i >> 12) as u8)
        .collect()
}

type HtoD = unsafe extern "C" fn(u64, *const u8, usize) -> i32;
type DtoH = unsafe extern "C" fn(*mut u8, u64, usize) -> i32;

#[test]
fn copies_memsets_host_memory_and_address_ranges() {
    let (lib, _g) = lib();
    lib.context();
    const CUDA_ERROR_NOT_FOUND: i32 = 500;
    // SAFETY: the documented signatures of these entry points.
    let (alloc, free, htod, dtoh, dtod, copy, memset32, range) = unsafe {
        (
            lib.f::<unsafe extern "C" fn(*mut u64, usize) -> i32>("cuMemAlloc_v2"),
            lib.f::<unsafe extern "C" fn(u64) -> i32>("cuMemFree_v2"),
            lib.f::<HtoD>("cuMemcpyHtoD_v2"),
            lib.f::<DtoH>("cuMemcpyDtoH_v2"),
            lib.f::<unsafe extern "C" fn(u64, u64, usize) -> i32>("cuMemcpyDtoD_v2"),
            lib.f::<unsafe extern "C" fn(u64, u64, usize) -> i32>("cuMemcpy"),
            lib.f::<unsafe extern "C" fn(u64, u32, usize) -> i32>("cuMemsetD32_v2"),
            lib.f::<unsafe extern "C" fn(*mut u64, *mut usize, u64) -> i32>(
                "cuMemGetAddressRange_v2",
            ),
        )
    };
    // SAFETY: as above.
    let (host_alloc, host_free, htod_async, stream_create, stream_destroy) = unsafe {
        (
            lib.f::<unsafe extern "C" fn(*mut *mut u8, usize, u32) -> i32>("cuMemHostAlloc"),
            lib.f::<unsafe extern "C" fn(*mut u8) -> i32>("cuMemFreeHost"),
            lib.f::<unsafe extern "C" fn(u64, *const u8, usize, usize) -> i32>(
                "cuMemcpyHtoDAsync_v2",
            ),
            lib.f::<unsafe extern "C" fn(*mut usize, u32) -> i32>("cuStreamCreate"),
            lib.f::<unsafe extern "C" fn(usize) -> i32>("cuStreamDestroy_v2"),
        )
    };
    let n = 3 * MIB as usize + 5;
    let data = bytes(n, 0x5a);
    // SAFETY: documented signatures; host buffers of the lengths passed throughout.
    unsafe {
        let (mut a, mut b) = (0u64, 0u64);
        assert_eq!(alloc(&mut a, n), 0);
        assert_eq!(alloc(&mut b, n), 0);
        // Pinned host memory, written by hand, copied in, across, and back out.
        let mut h: *mut u8 = std::ptr::null_mut();
        assert_eq!(host_alloc(&mut h, n, 8), 1, "an unknown flag");
        assert_eq!(host_alloc(&mut h, n, 1), 0);
        std::ptr::copy_nonoverlapping(data.as_ptr(), h, n);
        assert_eq!(htod(a, h, n), 0);
        assert_eq!(dtod(b, a, n), 0);
        let mut back = vec![0u8; n];
        assert_eq!(dtoh(back.as_mut_ptr(), b, n), 0);
        assert!(back == data, "HtoD, DtoD, DtoH");
        // Unified addressing: cuMemcpy tells host from device by the address.
        let mut via = vec![0u8; n];
        assert_eq!(copy(via.as_mut_ptr() as u64, a, n), 0);
        assert!(via == data, "cuMemcpy device to host");
        let other = bytes(n, 0x11);
        assert_eq!(copy(b, other.as_ptr() as u64, n), 0);
        assert_eq!(copy(via.as_mut_ptr() as u64, b, n), 0);
        assert!(via == other, "cuMemcpy host to device and back");
        // Past the end of an allocation: INVALID_VALUE, and the context goes on.
        assert_eq!(htod(a + n as u64 - 10, data.as_ptr(), 20), 1);
        assert_eq!(dtoh(back.as_mut_ptr(), a + 1, n), 1);
        assert_eq!(dtoh(back.as_mut_ptr(), a + 10, n - 10), 0);
        assert!(back[..n - 10] == data[10..]);
        // cuMemsetD32: aligned only; 32-bit values, little-endian.
        assert_eq!(memset32(a + 2, 7, 4), 1);
        assert_eq!(memset32(a + 4, 0xA1B2_C3D4, 2), 0);
        let mut w = [0u8; 16];
        assert_eq!(dtoh(w.as_mut_ptr(), a, 16), 0);
        assert_eq!(&w[..4], &data[..4]);
        assert_eq!(&w[4..12], &[0xD4, 0xC3, 0xB2, 0xA1, 0xD4, 0xC3, 0xB2, 0xA1]);
        assert_eq!(&w[12..], &data[12..16]);
        // Async: a stream that is not one is INVALID_HANDLE; the default stream and a
        // created one copy.
        assert_eq!(htod_async(a, data.as_ptr(), 8, 0xDEAD0), 400);
        assert_eq!(htod_async(a, data.as_ptr(), 8, 0), 0);
        let mut s = 0usize;
        assert_eq!(stream_create(&mut s, 0), 0);
        assert_eq!(htod_async(a, data.as_ptr(), 8, s), 0);
        assert_eq!(stream_destroy(s), 0);
        assert_eq!(
            htod_async(a, data.as_ptr(), 8, s),
            400,
            "a destroyed stream"
        );
        // Address ranges: linear, pinned host, neither.
        let (mut base, mut size) = (0u64, 0usize);
        assert_eq!(range(&mut base, &mut size, a + 12345), 0);
        assert_eq!((base, size), (a, n));
        assert_eq!(range(&mut base, std::ptr::null_mut(), h.add(99) as u64), 0);
        assert_eq!(base, h as u64);
        assert_eq!(range(&mut base, &mut size, 0x10), CUDA_ERROR_NOT_FOUND);
        // Frees: the data goes with the allocation; unknown host pointers are refused.
        assert_eq!(host_free(h.add(1)), 1);
        assert_eq!(host_free(h), 0);
        assert_eq!(host_free(h), 1, "double free");
        assert_eq!(free(a), 0);
        assert_eq!(range(&mut base, &mut size, a), CUDA_ERROR_NOT_FOUND);
        assert_eq!(free(b), 0);
    }
}

#[test]
fn vmm_contents_belong_to_the_handle_and_honour_the_map_offset() {
    let (lib, _g) = lib();
    lib.context();
    type Create = unsafe extern "C" fn(*mut u64, usize, *const AllocProp, u64) -> i32;
    type Reserve = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> i32;
    type Map = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> i32;
    // SAFETY: the documented signatures of these entry points.
    let (create, release, reserve, map_only, unmap, htod, dtoh, range, access) = unsafe {
        (
            lib.f::<Create>("cuMemCreate"),
            lib.f::<unsafe extern "C" fn(u64) -> i32>("cuMemRelease"),
            lib.f::<Reserve>("cuMemAddressReserve"),
            lib.f::<Map>("cuMemMap"),
            lib.f::<unsafe extern "C" fn(u64, usize) -> i32>("cuMemUnmap"),
            lib.f::<HtoD>("cuMemcpyHtoD_v2"),
            lib.f::<DtoH>("cuMemcpyDtoH_v2"),
            lib.f::<unsafe extern "C" fn(*mut u64, *mut usize, u64) -> i32>(
                "cuMemGetAddressRange_v2",
            ),
            lib.f::<unsafe extern "C" fn(u64, usize, *const [i32; 3], usize) -> i32>(
                "cuMemSetAccess",
            ),
        )
    };
    // Maps and, as every program must, gives device 0 read and write access (a mapping
    // starts with none: `cuda::vmm::cu_mem_set_access`).
    let map = |va: u64, n: usize, off: usize, h: u64, f: u64| {
        // SAFETY: documented signatures; the descriptor is a valid local.
        unsafe {
            let rc = map_only(va, n, off, h, f);
            if rc == 0 {
                assert_eq!(access(va, n, &[1, 0, 3], 1), 0);
            }
            rc
        }
    };
    let prop = AllocProp {
        alloc_type: 1,
        handle_types: 0,
        location_type: 1, // DEVICE
        location_id: 0,
        win32: std::ptr::null_mut(),
        flags: [0; 8],
    };
    let (half, whole) = (2 * MIB as usize, 4 * MIB as usize);
    let data = bytes(whole, 0x3c);
    // SAFETY: documented signatures; pointers to valid locals and buffers throughout.
    unsafe {
        let (mut h, mut va, mut va2, mut va3) = (0u64, 0u64, 0u64, 0u64);
        assert_eq!(create(&mut h, whole, &prop, 0), 0);
        assert_eq!(reserve(&mut va, whole, 0, 0, 0), 0);
        assert_eq!(reserve(&mut va2, half, 0, 0, 0), 0);
        assert_eq!(reserve(&mut va3, whole, 0, 0, 0), 0);
        assert_eq!(map(va, whole, 0, h, 0), 0);
        assert_eq!(htod(va, data.as_ptr(), whole), 0);
        // The second half of the handle, mapped on its own.
        assert_eq!(map(va2, whole, 0, h, 0), 1, "larger than the reservation");
        assert_eq!(
            map(va2, half, 3 * MIB as usize, h, 0),
            400,
            "past the handle's end"
        );
        assert_eq!(map(va2, half, half, h, 0), 0);
        assert_eq!(map(va2, half, 0, h, 0), 1, "already mapped");
        let mut back = vec![0u8; whole];
        assert_eq!(dtoh(back.as_mut_ptr(), va2, half), 0);
        assert!(back[..half] == data[half..]);
        // Two mappings back to back, halves swapped: one copy runs across both.
        assert_eq!(map(va3, half, half, h, 0), 0);
        assert_eq!(map(va3 + half as u64, half, 0, h, 0), 0);
        assert_eq!(dtoh(back.as_mut_ptr(), va3, whole), 0);
        assert!(back[..half] == data[half..] && back[half..] == data[..half]);
        let (mut base, mut size) = (0u64, 0usize);
        assert_eq!(range(&mut base, &mut size, va3 + half as u64 + 1), 0);
        assert_eq!((base, size), (va3 + half as u64, half), "the mapping");
        // Released and created again: a new handle, all zeros.
        for (p, len) in [(va, whole), (va2, half), (va3, whole)] {
            assert_eq!(unmap(p, len), 0);
        }
        assert_eq!(release(h), 0);
        assert_eq!(create(&mut h, whole, &prop, 0), 0);
        assert_eq!(map(va, whole, 0, h, 0), 0);
        assert_eq!(dtoh(back.as_mut_ptr(), va, whole), 0);
        assert!(back.iter().all(|&b| b == 0), "a new handle starts at zero");
        assert_eq!(unmap(va, whole), 0);
        assert_eq!(release(h), 0);
    }
}

#[test]
fn context_stack_push_and_pop() {
    let (lib, _g) = lib();
    lib.context();
    // SAFETY: the documented signatures of these entry points.
    let (get, set, push, pop) = unsafe {
        (
            lib.f::<unsafe extern "C" fn(*mut usize) -> i32>("cuCtxGetCurrent"),
            lib.f::<unsafe extern "C" fn(usize) -> i32>("cuCtxSetCurrent"),
            lib.f::<unsafe extern "C" fn(usize) -> i32>("cuCtxPushCurrent_v2"),
            lib.f::<unsafe extern "C" fn(*mut usize) -> i32>("cuCtxPopCurrent_v2"),
        )
    };
    // SAFETY: documented signatures; valid out-pointers.
    unsafe {
        let mut ctx = 0usize;
        assert_eq!(get(&mut ctx), 0);
        assert_ne!(ctx, 0);
        let mut c = 0usize;
        assert_eq!(pop(&mut c), 0);
        assert_eq!(c, ctx);
        assert_eq!(get(&mut c), 0);
        assert_eq!(c, 0, "nothing below it");
        assert_eq!(pop(&mut c), 201, "an empty stack");
        assert_eq!(push(0x1234), 201, "not a context");
        assert_eq!(push(ctx), 0);
        assert_eq!(push(ctx), 0);
        assert_eq!(pop(std::ptr::null_mut()), 0);
        assert_eq!(get(&mut c), 0);
        assert_eq!(c, ctx, "the one pushed first is current again");
        // cuCtxSetCurrent(NULL) pops.
        assert_eq!(set(0), 0);
        assert_eq!(get(&mut c), 0);
        assert_eq!(c, 0);
        assert_eq!(set(ctx), 0);
    }
}
