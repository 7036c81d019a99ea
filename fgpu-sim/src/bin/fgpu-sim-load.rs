//! fgpu-sim-load: drives a CUDA driver exactly as the CUDA runtime reaches it.
//!
//! `dlopen("libcuda.so.1")` (or `--lib PATH`), `dlsym` of `cuGetProcAddress_v2`, `cuInit` and
//! `cuDriverGetVersion` only; every other entry point through
//! `cuGetProcAddress_v2(base, 12000, flags, &status)`. `--dlsym-direct` dlsyms the versioned
//! names instead; `--ptsz` asks for per-thread-default-stream variants (flags = 2);
//! `--export-table` launches (kernels and graphs) through the pointers of the driver's
//! private launch table (`cuGetExportTable`, as the real runtime does) instead;
//! `--strict` exits 1 if any step fails.
//!
//! Commands (one output line each, flushed):
//!   alloc SIZE | alloc-api {mem_alloc|pitch|managed|async|pool|vmm|array} SIZE
//!   free-last | free N | free-all | trim | info | launch N KERNEL | graph N KERNEL REPLAYS
//!   sync | sleep MS | hold | nvml
//!   device N                    (make ordinal N's primary context current; prints its UUID)
//!   no-context                  (no context current: driver calls then fail, e.g. a free)
//!   devices                     (the visible ordinals and their UUIDs)
//!   launch-for MS KERNEL        (10 launches + sync, repeated for MS ms; prints n)
//!   launch-for-each MS KERNEL   (launch-for on every visible device at once, a thread each)
//!   graph-for MS N KERNEL       (a graph of N launches replayed for MS ms; prints replays)
//!   steps-for MS K KERNEL GAP_US [SPIN_US] (K launches + sync + GAP_US of host time,
//!                                repeated for MS ms; SPIN_US of host work before each
//!                                launch: a CPU-bound launcher; a `steps-at mono_ms= steps=`
//!                                line every 100 ms; the last line says how long the launch
//!                                calls and the synchronisations took: launch_ms= sync_ms=)
//!   steps-threads MS T K KERNEL GAP_US (steps-for on T threads at once, each on a stream of
//!                                its own; steps counted over all threads)
//!   stress THREADS PAIRS SIZE   (THREADS threads × PAIRS cuMemAlloc_v2 + cuMemFree_v2 each)
//!   bench-alloc PAIRS SIZE      (one thread; prints ns_per_pair)
//!   bench-launch N KERNEL       (N launches + sync; prints launches_per_s; `empty` is real
//!                                PTX, so this also runs on a real driver)
//! SIZE accepts 16GiB, 512MiB, 8GB or plain bytes.

#[path = "../size.rs"]
mod size;

use std::ffi::{CStr, CString, c_char, c_void};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

type Ptr = *mut c_void;

struct Lib {
    handle: Ptr,
    gpa: Option<unsafe extern "C" fn(*const c_char, *mut Ptr, i32, u64, *mut i32) -> i32>,
    direct: bool,
    flags: u64,
}

impl Lib {
    fn open(path: &str) -> Result<Lib, String> {
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

    fn dlsym(&self, name: &str) -> Ptr {
        let c = CString::new(name).unwrap_or_default();
        // SAFETY: valid handle from dlopen and a valid C string.
        unsafe { libc::dlsym(self.handle, c.as_ptr()) }
    }

    /// Resolves an entry point: via cuGetProcAddress_v2(base), or dlsym(versioned) if direct.
    fn resolve(&self, base: &str, versioned: &str) -> Ptr {
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

type R = i32;

/// Reinterprets a non-NULL symbol address as a function pointer of type `F`.
///
/// # Safety
/// `F` must be a function pointer type matching the symbol's C signature.
unsafe fn fn_ptr<F: Copy>(p: Ptr) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<Ptr>());
    // SAFETY: same size (checked); validity of the signature is the caller's promise.
    unsafe { std::mem::transmute_copy::<Ptr, F>(&p) }
}

/// The driver entry points this program uses, with their C signatures.
struct Api {
    device_get: unsafe extern "C" fn(*mut i32, i32) -> R,
    device_get_count: unsafe extern "C" fn(*mut i32) -> R,
    device_get_uuid: unsafe extern "C" fn(*mut [u8; 16], i32) -> R,
    ctx_retain: unsafe extern "C" fn(*mut usize, i32) -> R,
    ctx_set_current: unsafe extern "C" fn(usize) -> R,
    ctx_synchronize: unsafe extern "C" fn() -> R,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
    mem_alloc_pitch: unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, u32) -> R,
    mem_alloc_managed: unsafe extern "C" fn(*mut u64, usize, u32) -> R,
    mem_alloc_async: unsafe extern "C" fn(*mut u64, usize, usize) -> R,
    mem_alloc_from_pool_async: unsafe extern "C" fn(*mut u64, usize, usize, usize) -> R,
    mem_pool_create: unsafe extern "C" fn(*mut usize, *const PoolProps) -> R,
    mem_pool_trim_to: unsafe extern "C" fn(usize, usize) -> R,
    default_mem_pool: unsafe extern "C" fn(*mut usize, i32) -> R,
    mem_free: unsafe extern "C" fn(u64) -> R,
    mem_free_async: unsafe extern "C" fn(u64, usize) -> R,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> R,
    mem_create: unsafe extern "C" fn(*mut usize, usize, *const AllocProp, u64) -> R,
    mem_release: unsafe extern "C" fn(usize) -> R,
    mem_address_reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> R,
    mem_address_free: unsafe extern "C" fn(u64, usize) -> R,
    mem_map: unsafe extern "C" fn(u64, usize, usize, usize, u64) -> R,
    mem_unmap: unsafe extern "C" fn(u64, usize) -> R,
    mem_set_access: unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> R,
    array_create: unsafe extern "C" fn(*mut usize, *const ArrayDesc) -> R,
    array_destroy: unsafe extern "C" fn(usize) -> R,
    module_load_data: unsafe extern "C" fn(*mut usize, *const c_void) -> R,
    module_get_function: unsafe extern "C" fn(*mut usize, usize, *const c_char) -> R,
    launch_kernel: unsafe extern "C" fn(
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
    stream_create: unsafe extern "C" fn(*mut usize, u32) -> R,
    stream_synchronize: unsafe extern "C" fn(usize) -> R,
    stream_begin_capture: unsafe extern "C" fn(usize, i32) -> R,
    stream_end_capture: unsafe extern "C" fn(usize, *mut usize) -> R,
    graph_instantiate: unsafe extern "C" fn(*mut usize, usize, u64) -> R,
    graph_launch: unsafe extern "C" fn(usize, usize) -> R,
}

impl Api {
    fn load(lib: &Lib) -> Api {
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
        }
    }
}

struct Alloc {
    api: String,
    ptr: u64,
    size: u64,
    /// vmm: generic allocation handle; array: array handle.
    handle: usize,
    freed: bool,
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

#[repr(C)]
struct PoolProps {
    alloc_type: i32,
    handle_types: i32,
    location_type: i32,
    location_id: i32,
    win32: Ptr,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

#[repr(C)]
struct AccessDesc {
    location_type: i32,
    location_id: i32,
    flags: i32,
}

#[repr(C)]
struct ArrayDesc {
    width: usize,
    height: usize,
    format: i32,
    channels: u32,
}

struct Driver {
    api: Api,
    /// The primary context, made current on every thread this tool starts.
    ctx: usize,
    /// The CUDA ordinal of `ctx` (`device N` switches).
    dev: i32,
    allocs: Vec<Alloc>,
    pool: usize,
    failed: bool,
}

/// CLOCK_MONOTONIC in ms.
fn mono_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

fn out(line: String) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

const GRAN: u64 = 2 << 20;

/// A module with one kernel, `empty`, that returns at once.
const EMPTY_PTX: &CStr =
    c".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry empty()\n{\n\tret;\n}\n";
const DEVICE: i32 = 1; // CU_MEM_LOCATION_TYPE_DEVICE

/// Evaluates a driver call; returns its code from the enclosing function if it failed.
macro_rules! step {
    ($e:expr) => {{
        let rc = $e;
        if rc != 0 {
            return rc;
        }
    }};
}

impl Driver {
    fn report(&mut self, rc: i32, ok: String, fail: String) {
        if rc == 0 {
            out(ok);
        } else {
            self.failed = true;
            out(fail);
        }
    }

    fn alloc(&mut self, api: &str, size: u64) {
        let a = &self.api;
        let (mut ptr, mut handle, mut charged) = (0u64, 0usize, size);
        let n = size as usize;
        let rc = match api {
            // SAFETY: (all calls below) documented driver signatures, pointers to valid locals.
            "mem_alloc" => unsafe { (a.mem_alloc)(&mut ptr, n) },
            "pitch" => {
                let (mut pitch, rows) = (0usize, size.div_ceil(4096) as usize);
                charged = rows as u64 * 4096;
                // SAFETY: as above.
                unsafe { (a.mem_alloc_pitch)(&mut ptr, &mut pitch, 4096, rows, 4) }
            }
            // SAFETY: as above.
            "managed" => unsafe { (a.mem_alloc_managed)(&mut ptr, n, 1) },
            // SAFETY: as above.
            "async" => unsafe { (a.mem_alloc_async)(&mut ptr, n, 0) },
            "pool" => {
                let mut rc = 0;
                if self.pool == 0 {
                    let props = PoolProps {
                        alloc_type: 1,
                        handle_types: 0,
                        location_type: DEVICE,
                        location_id: self.dev,
                        win32: std::ptr::null_mut(),
                        max_size: 0,
                        usage: 0,
                        reserved: [0; 54],
                    };
                    // SAFETY: as above.
                    rc = unsafe { (a.mem_pool_create)(&mut self.pool, &props) };
                }
                if rc == 0 {
                    // SAFETY: as above.
                    rc = unsafe { (a.mem_alloc_from_pool_async)(&mut ptr, n, self.pool, 0) };
                }
                rc
            }
            "vmm" => {
                charged = size.div_ceil(GRAN) * GRAN;
                self.vmm_alloc(charged as usize, &mut ptr, &mut handle)
            }
            "array" => {
                let desc = ArrayDesc {
                    width: size.div_ceil(4) as usize,
                    height: 1,
                    format: 0x20, // FLOAT
                    channels: 1,
                };
                charged = (size.div_ceil(4) * 4).div_ceil(GRAN) * GRAN;
                // SAFETY: as above.
                let rc = unsafe { (a.array_create)(&mut handle, &desc) };
                ptr = handle as u64;
                rc
            }
            _ => {
                out(format!("error unknown-api={api}"));
                std::process::exit(2);
            }
        };
        let idx = self.allocs.len();
        self.report(
            rc,
            format!("alloc ok ptr={ptr:#x} size={charged} rc=0 api={api} idx={idx}"),
            format!("alloc fail rc={rc} size={charged} api={api}"),
        );
        if rc == 0 {
            self.allocs.push(Alloc {
                api: api.to_string(),
                ptr,
                size: charged,
                handle,
                freed: false,
            });
        }
    }

    /// Makes ordinal `n`'s primary context current (allocations and launches go there).
    fn use_device(&mut self, n: i32) {
        let a = &self.api;
        let (mut dev, mut ctx) = (0i32, 0usize);
        // SAFETY: documented signatures, pointers to valid locals.
        let rc = (|| unsafe {
            step!((a.device_get)(&mut dev, n));
            step!((a.ctx_retain)(&mut ctx, dev));
            (a.ctx_set_current)(ctx)
        })();
        let uuid = if rc == 0 {
            self.uuid(dev)
        } else {
            String::new()
        };
        self.report(
            rc,
            format!("device ok ordinal={n} uuid={uuid}"),
            format!("device fail ordinal={n} rc={rc}"),
        );
        if rc == 0 {
            (self.ctx, self.dev, self.pool) = (ctx, dev, 0);
        }
    }

    /// `GPU-...` form of ordinal `dev`'s UUID.
    fn uuid(&self, dev: i32) -> String {
        let mut b = [0u8; 16];
        // SAFETY: documented signature, a 16-byte out-buffer.
        if unsafe { (self.api.device_get_uuid)(&mut b, dev) } != 0 {
            return "?".into();
        }
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }

    /// One line per visible ordinal: `ordinal N uuid=...`.
    fn devices(&mut self) {
        let mut n = 0i32;
        // SAFETY: documented signature, valid out-pointer.
        let rc = unsafe { (self.api.device_get_count)(&mut n) };
        self.report(
            rc,
            format!("devices count={n}"),
            format!("devices fail rc={rc}"),
        );
        for o in 0..n {
            out(format!("ordinal {o} uuid={}", self.uuid(o)));
        }
    }

    /// cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess.
    fn vmm_alloc(&self, n: usize, ptr: &mut u64, handle: &mut usize) -> i32 {
        let a = &self.api;
        let prop = AllocProp {
            alloc_type: 1,
            handle_types: 0,
            location_type: DEVICE,
            location_id: self.dev,
            win32: std::ptr::null_mut(),
            flags: [0; 8],
        };
        let access = AccessDesc {
            location_type: DEVICE,
            location_id: self.dev,
            flags: 3,
        };
        // SAFETY: documented signatures, pointers to valid locals (all four calls).
        unsafe {
            step!((a.mem_create)(handle, n, &prop, 0));
            step!((a.mem_address_reserve)(ptr, n, 0, 0, 0));
            step!((a.mem_map)(*ptr, n, 0, *handle, 0));
            (a.mem_set_access)(*ptr, n, &access, 1)
        }
    }

    fn free(&mut self, idx: usize) {
        let Some(al) = self.allocs.get(idx).filter(|al| !al.freed) else {
            self.report(1, String::new(), format!("free fail idx={idx} rc=1"));
            return;
        };
        let a = &self.api;
        let (ptr, size, handle) = (al.ptr, al.size as usize, al.handle);
        let rc = match al.api.as_str() {
            // SAFETY: (all calls) documented signatures with plain values.
            "async" | "pool" => unsafe { (a.mem_free_async)(ptr, 0) },
            // SAFETY: as above.
            "vmm" => (|| unsafe {
                step!((a.mem_unmap)(ptr, size));
                step!((a.mem_release)(handle));
                (a.mem_address_free)(ptr, size)
            })(),
            // SAFETY: as above.
            "array" => unsafe { (a.array_destroy)(handle) },
            // SAFETY: as above.
            _ => unsafe { (a.mem_free)(ptr) },
        };
        if rc == 0 {
            self.allocs[idx].freed = true;
        }
        self.report(
            rc,
            format!("free ok idx={idx} size={size} rc=0"),
            format!("free fail idx={idx} rc={rc}"),
        );
    }

    /// `threads` threads each run `pairs` cuMemAlloc_v2 + cuMemFree_v2 pairs of `size` bytes;
    /// reports failures and the mean time per pair (per thread).
    fn alloc_free_pairs(&mut self, cmd: &str, threads: u64, pairs: u64, size: u64) {
        let (alloc, free, set_ctx, ctx) = (
            self.api.mem_alloc,
            self.api.mem_free,
            self.api.ctx_set_current,
            self.ctx,
        );
        let start = Instant::now();
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut failed = 0u64;
                    // SAFETY: documented driver signatures; `ptr` is a valid local.
                    unsafe {
                        if set_ctx(ctx) != 0 {
                            return pairs;
                        }
                        for _ in 0..pairs {
                            let mut ptr = 0u64;
                            if alloc(&mut ptr, size as usize) != 0 || free(ptr) != 0 {
                                failed += 1;
                            }
                        }
                    }
                    failed
                })
            })
            .collect();
        let failed: u64 = workers.into_iter().map(|w| w.join().unwrap_or(pairs)).sum();
        let elapsed = start.elapsed();
        let ns_per_pair = elapsed.as_nanos() as u64 / pairs.max(1);
        self.report(
            i32::from(failed > 0),
            format!(
                "{cmd} ok threads={threads} pairs={pairs} size={size} failed=0 elapsed_ms={} ns_per_pair={ns_per_pair}",
                elapsed.as_millis()
            ),
            format!("{cmd} fail threads={threads} pairs={pairs} size={size} failed={failed}"),
        );
    }

    fn info(&mut self) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        let rc = unsafe { (self.api.mem_get_info)(&mut free, &mut total) };
        self.report(
            rc,
            format!("info free={free} total={total}"),
            format!("info fail rc={rc}"),
        );
    }

    fn function(&self, kernel: &str) -> Result<usize, i32> {
        let (mut module, mut func) = (0usize, 0usize);
        let name = CString::new(kernel).unwrap_or_default();
        // Real PTX, so that the same client runs on a real driver (which JIT-compiles it);
        // the simulated driver accepts any image and times kernels by their names.
        let image = EMPTY_PTX.as_ptr().cast();
        let a = &self.api;
        // SAFETY: documented signatures; any image gives a simulated module; valid name.
        let rc = (|| unsafe {
            step!((a.module_load_data)(&mut module, image));
            (a.module_get_function)(&mut func, module, name.as_ptr())
        })();
        if rc == 0 { Ok(func) } else { Err(rc) }
    }

    fn launch_n(&self, func: usize, n: u64, stream: usize) -> i32 {
        let null = std::ptr::null_mut();
        for _ in 0..n {
            // SAFETY: documented signature; the kernel takes no parameters.
            let rc =
                unsafe { (self.api.launch_kernel)(func, 1, 1, 1, 32, 1, 1, 0, stream, null, null) };
            if rc != 0 {
                return rc;
            }
        }
        0
    }

    fn launch(&mut self, n: u64, kernel: &str) {
        let t = Instant::now();
        let rc = self
            .function(kernel)
            .and_then(|f| match self.launch_n(f, n, 0) {
                0 => Ok(()),
                rc => Err(rc),
            })
            .err()
            .unwrap_or(0);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        self.report(
            rc,
            format!("launch ok n={n} kernel={kernel} elapsed_ms={ms:.1}"),
            format!("launch fail rc={rc} kernel={kernel}"),
        );
    }

    /// Launches `n` kernels and waits for them: launches per second, queueing included.
    fn bench_launch(&mut self, n: u64, kernel: &str) {
        let rc = match self.function(kernel) {
            Ok(f) => {
                // Warm-up, then the timed run.
                let _ = self.launch_n(f, 1000.min(n), 0);
                // SAFETY: documented signature, no arguments.
                let _ = unsafe { (self.api.ctx_synchronize)() };
                let t = Instant::now();
                let rc = self.launch_n(f, n, 0);
                // SAFETY: as above.
                let sync = unsafe { (self.api.ctx_synchronize)() };
                let secs = t.elapsed().as_secs_f64();
                if rc == 0 && sync == 0 {
                    out(format!(
                        "bench-launch ok n={n} kernel={kernel} launches_per_s={:.0} ns_per_launch={:.0}",
                        n as f64 / secs,
                        secs * 1e9 / n as f64
                    ));
                    return;
                }
                if rc != 0 { rc } else { sync }
            }
            Err(rc) => rc,
        };
        self.report(
            rc,
            String::new(),
            format!("bench-launch fail rc={rc} kernel={kernel}"),
        );
    }

    /// Captures `n` launches of `func` on a new stream into a graph and instantiates it.
    fn capture(
        &self,
        func: usize,
        n: u64,
        stream: &mut usize,
        graph: &mut usize,
        exec: &mut usize,
    ) -> i32 {
        let a = &self.api;
        // SAFETY: documented signatures; out-pointers to the caller's locals.
        unsafe {
            step!((a.stream_create)(stream, 1));
            step!((a.stream_begin_capture)(*stream, 0));
            step!(self.launch_n(func, n, *stream));
            step!((a.stream_end_capture)(*stream, graph));
            (a.graph_instantiate)(exec, *graph, 0)
        }
    }

    /// Launches `kernel` for `ms` of wall time, 10 at a time and synchronising after each 10
    /// (a bounded queue, like a training loop), then reports how many ran.
    fn launch_for(&mut self, ms: u64, kernel: &str) {
        let t = Instant::now();
        let mut n = 0u64;
        let rc = match self.function(kernel) {
            Err(rc) => rc,
            Ok(f) => loop {
                let rc = self.launch_n(f, 10, 0);
                // SAFETY: no arguments.
                let sync = unsafe { (self.api.ctx_synchronize)() };
                if rc != 0 || sync != 0 {
                    break if rc != 0 { rc } else { sync };
                }
                n += 10;
                if t.elapsed().as_millis() as u64 >= ms {
                    break 0;
                }
            },
        };
        let elapsed = t.elapsed().as_secs_f64() * 1e3;
        self.report(
            rc,
            format!("launch-for ok n={n} kernel={kernel} elapsed_ms={elapsed:.1}"),
            format!("launch-for fail rc={rc} kernel={kernel}"),
        );
    }

    /// [`Driver::launch_for`] on every visible device at once, a thread per device (as a
    /// process driving several GPUs does); one `launch-for ok ... ordinal=N` line per device.
    fn launch_for_each(&mut self, ms: u64, kernel: &str) {
        let mut count = 0i32;
        // SAFETY: documented signature, valid out-pointer.
        let rc = unsafe { (self.api.device_get_count)(&mut count) };
        let mut per = Vec::new();
        for o in 0..if rc == 0 { count } else { 0 } {
            self.use_device(o);
            match self.function(kernel) {
                Ok(f) => per.push((o, self.ctx, f)),
                Err(rc) => self.report(
                    rc,
                    String::new(),
                    format!("launch-for fail rc={rc} ordinal={o}"),
                ),
            }
        }
        let (set_ctx, launch, sync) = (
            self.api.ctx_set_current,
            self.api.launch_kernel,
            self.api.ctx_synchronize,
        );
        let workers: Vec<_> = per
            .into_iter()
            .map(|(o, ctx, f)| {
                std::thread::spawn(move || {
                    let t = Instant::now();
                    let null = std::ptr::null_mut();
                    let mut n = 0u64;
                    // SAFETY: documented driver signatures; the kernel takes no parameters.
                    let rc = unsafe {
                        let mut rc = set_ctx(ctx);
                        while rc == 0 {
                            for _ in 0..10 {
                                rc = launch(f, 1, 1, 1, 32, 1, 1, 0, 0, null, null);
                                if rc != 0 {
                                    break;
                                }
                            }
                            if rc == 0 {
                                rc = sync();
                            }
                            if rc == 0 {
                                n += 10;
                            }
                            if t.elapsed().as_millis() as u64 >= ms {
                                break;
                            }
                        }
                        rc
                    };
                    (o, rc, n, t.elapsed().as_secs_f64() * 1e3)
                })
            })
            .collect();
        for w in workers {
            let Ok((o, rc, n, elapsed)) = w.join() else {
                self.report(1, String::new(), "launch-for fail panicked".into());
                continue;
            };
            self.report(
                rc,
                format!("launch-for ok n={n} kernel={kernel} elapsed_ms={elapsed:.1} ordinal={o}"),
                format!("launch-for fail rc={rc} kernel={kernel} ordinal={o}"),
            );
        }
    }

    /// A training or decoding loop: steps of `k` launches of `kernel`, a synchronisation and
    /// `gap_us` of host time (an optimizer step, data loading, a decoder's sampling), for `ms`
    /// of wall time. Every 100 ms a `steps-at mono_ms=T steps=N` line (T: CLOCK_MONOTONIC,
    /// the same in every PID namespace), so that rates over windows can be compared across
    /// processes; at the end `steps-for ok steps=N ... elapsed_ms=E`.
    fn steps_for(&mut self, ms: u64, k: u64, kernel: &str, gap_us: u64, spin_us: u64) {
        let t = Instant::now();
        let mut steps = 0u64;
        let mut next_report = 0u64;
        // Where a step's time goes: in launch calls, and in the synchronisation.
        let (mut in_launch, mut in_sync) = (Duration::ZERO, Duration::ZERO);
        let rc = match self.function(kernel) {
            Err(rc) => rc,
            Ok(f) => loop {
                let rc = if spin_us == 0 {
                    let l = Instant::now();
                    let rc = self.launch_n(f, k, 0);
                    in_launch += l.elapsed();
                    rc
                } else {
                    // A CPU-bound launcher (a framework's Python between kernels): SPIN_US of
                    // host work before each launch.
                    (0..k)
                        .map(|_| {
                            let until = Instant::now() + std::time::Duration::from_micros(spin_us);
                            while Instant::now() < until {
                                std::hint::spin_loop();
                            }
                            let l = Instant::now();
                            let rc = self.launch_n(f, 1, 0);
                            in_launch += l.elapsed();
                            rc
                        })
                        .find(|&rc| rc != 0)
                        .unwrap_or(0)
                };
                let y = Instant::now();
                // SAFETY: no arguments.
                let sync = unsafe { (self.api.ctx_synchronize)() };
                in_sync += y.elapsed();
                if rc != 0 || sync != 0 {
                    break if rc != 0 { rc } else { sync };
                }
                if gap_us > 0 {
                    std::thread::sleep(std::time::Duration::from_micros(gap_us));
                }
                steps += 1;
                let el = t.elapsed().as_millis() as u64;
                if el >= next_report {
                    next_report = el + 100;
                    out(format!("steps-at mono_ms={} steps={steps}", mono_ms()));
                }
                if el >= ms {
                    break 0;
                }
            },
        };
        let elapsed = t.elapsed().as_secs_f64() * 1e3;
        self.report(
            rc,
            format!(
                "steps-for ok steps={steps} k={k} kernel={kernel} gap_us={gap_us} elapsed_ms={elapsed:.1} \
                 launch_ms={:.1} sync_ms={:.1}",
                in_launch.as_secs_f64() * 1e3,
                in_sync.as_secs_f64() * 1e3
            ),
            format!("steps-for fail rc={rc} kernel={kernel}"),
        );
    }

    /// `steps-for` on `threads` threads at once, each with a stream of its own (one process
    /// feeding the device from several threads, as a data-parallel loader or a server with a
    /// stream per request does): K launches of `kernel` into its stream, a synchronisation of
    /// that stream, GAP_US of host time. The `steps-at` lines and the final `steps-for ok` line
    /// count the steps of all threads together.
    fn steps_threads(&mut self, ms: u64, threads: u64, k: u64, kernel: &str, gap_us: u64) {
        use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};
        let t = Instant::now();
        let func = match self.function(kernel) {
            Ok(f) => f,
            Err(rc) => {
                self.report(
                    rc,
                    String::new(),
                    format!("steps-for fail rc={rc} kernel={kernel}"),
                );
                return;
            }
        };
        let (ctx, launch, create, sync, set) = (
            self.ctx,
            self.api.launch_kernel,
            self.api.stream_create,
            self.api.stream_synchronize,
            self.api.ctx_set_current,
        );
        let steps = AtomicU64::new(0);
        let failed = AtomicI32::new(0);
        let over = || t.elapsed().as_millis() as u64 >= ms || failed.load(Relaxed) != 0;
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut stream = 0usize;
                    let null = std::ptr::null_mut();
                    // SAFETY: documented signatures; the primary context of this process, a
                    // valid out-pointer, a stream this thread created, a kernel without
                    // parameters.
                    let rc = (|| unsafe {
                        step!(set(ctx));
                        step!(create(&mut stream, 1));
                        while !over() {
                            for _ in 0..k {
                                step!(launch(func, 1, 1, 1, 32, 1, 1, 0, stream, null, null));
                            }
                            step!(sync(stream));
                            if gap_us > 0 {
                                std::thread::sleep(std::time::Duration::from_micros(gap_us));
                            }
                            steps.fetch_add(1, Relaxed);
                        }
                        0
                    })();
                    if rc != 0 {
                        failed.store(rc, Relaxed);
                    }
                });
            }
            while !over() {
                out(format!(
                    "steps-at mono_ms={} steps={}",
                    mono_ms(),
                    steps.load(Relaxed)
                ));
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        let rc = failed.load(Relaxed);
        let elapsed = t.elapsed().as_secs_f64() * 1e3;
        self.report(
            rc,
            format!(
                "steps-for ok steps={} threads={threads} k={k} kernel={kernel} gap_us={gap_us} \
                 elapsed_ms={elapsed:.1}",
                steps.load(Relaxed)
            ),
            format!("steps-for fail rc={rc} kernel={kernel}"),
        );
    }

    /// Captures `n` launches of `kernel` into a graph, then replays it for `ms` of wall time
    /// (two replays, then a stream synchronisation), and reports how many replays ran.
    fn graph_for(&mut self, ms: u64, n: u64, kernel: &str) {
        let t = Instant::now();
        let mut replays = 0u64;
        let (mut stream, mut graph, mut exec) = (0usize, 0usize, 0usize);
        let rc = match self.function(kernel) {
            Err(rc) => rc,
            Ok(func) => {
                let a = &self.api;
                // SAFETY: documented signatures; pointers to valid locals (all calls).
                (|| unsafe {
                    step!(self.capture(func, n, &mut stream, &mut graph, &mut exec));
                    loop {
                        step!((a.graph_launch)(exec, stream));
                        step!((a.graph_launch)(exec, stream));
                        step!((a.stream_synchronize)(stream));
                        replays += 2;
                        if t.elapsed().as_millis() as u64 >= ms {
                            break 0;
                        }
                    }
                })()
            }
        };
        let elapsed = t.elapsed().as_secs_f64() * 1e3;
        self.report(
            rc,
            format!("graph-for ok replays={replays} n={n} kernel={kernel} elapsed_ms={elapsed:.1}"),
            format!("graph-for fail rc={rc} kernel={kernel}"),
        );
    }

    fn graph(&mut self, n: u64, kernel: &str, replays: u64) {
        let t = Instant::now();
        let (mut stream, mut graph, mut exec) = (0usize, 0usize, 0usize);
        let rc = match self.function(kernel) {
            Err(rc) => rc,
            Ok(func) => {
                let a = &self.api;
                // SAFETY: documented signatures; pointers to valid locals (all calls).
                (|| unsafe {
                    step!(self.capture(func, n, &mut stream, &mut graph, &mut exec));
                    for _ in 0..replays {
                        step!((a.graph_launch)(exec, stream));
                    }
                    (a.stream_synchronize)(stream)
                })()
            }
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        self.report(
            rc,
            format!("graph ok n={n} kernel={kernel} replays={replays} elapsed_ms={ms:.1}"),
            format!("graph fail rc={rc} kernel={kernel}"),
        );
    }

    fn trim(&mut self) {
        let a = &self.api;
        let mut default = 0usize;
        let pool = self.pool;
        // SAFETY: documented signatures; pointer to a valid local (all calls).
        let rc = (|| unsafe {
            step!((a.default_mem_pool)(&mut default, 0));
            step!((a.mem_pool_trim_to)(default, 0));
            if pool == 0 {
                0
            } else {
                (a.mem_pool_trim_to)(pool, 0)
            }
        })();
        self.report(rc, "trim ok rc=0".into(), format!("trim fail rc={rc}"));
    }

    fn sync(&mut self) {
        let t = Instant::now();
        // SAFETY: no arguments.
        let rc = unsafe { (self.api.ctx_synchronize)() };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        self.report(
            rc,
            format!("sync ok elapsed_ms={ms:.1}"),
            format!("sync fail rc={rc}"),
        );
    }
}

fn nvml(path: &str) -> bool {
    let lib = match Lib::open(path) {
        Ok(l) => l,
        Err(e) => {
            out(format!("nvml fail dlopen={e}"));
            return false;
        }
    };
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            let p = lib.dlsym($name);
            if p.is_null() {
                out(format!("nvml fail missing={}", $name));
                return false;
            }
            // SAFETY: NVML documents this symbol with exactly this C signature.
            unsafe { std::mem::transmute::<Ptr, $ty>(p) }
        }};
    }
    type Info = unsafe extern "C" fn(Ptr, *mut [u64; 3]) -> i32;
    type Procs = unsafe extern "C" fn(Ptr, *mut u32, *mut [u32; 6]) -> i32;
    type Util = unsafe extern "C" fn(Ptr, *mut [u32; 2]) -> i32;
    type Text = unsafe extern "C" fn(Ptr, *mut c_char, u32) -> i32;
    let init = sym!("nvmlInit_v2", unsafe extern "C" fn() -> i32);
    let count = sym!(
        "nvmlDeviceGetCount_v2",
        unsafe extern "C" fn(*mut u32) -> i32
    );
    let by_index = sym!(
        "nvmlDeviceGetHandleByIndex_v2",
        unsafe extern "C" fn(u32, *mut Ptr) -> i32
    );
    let info = sym!("nvmlDeviceGetMemoryInfo", Info);
    let procs = sym!("nvmlDeviceGetComputeRunningProcesses_v3", Procs);
    let util = sym!("nvmlDeviceGetUtilizationRates", Util);
    let uuid = sym!("nvmlDeviceGetUUID", Text);
    // SAFETY: documented NVML signatures; all pointers are valid locals/buffers.
    unsafe {
        if init() != 0 {
            out("nvml fail init".into());
            return false;
        }
        let mut n = 0u32;
        count(&mut n);
        for d in 0..n {
            let mut h: Ptr = std::ptr::null_mut();
            by_index(d, &mut h);
            let mut m = [0u64; 3];
            info(h, &mut m);
            let mut u = [0u32; 2];
            util(h, &mut u);
            let mut buf = [0 as c_char; 96];
            uuid(h, buf.as_mut_ptr(), buf.len() as u32);
            let id = CStr::from_ptr(buf.as_ptr()).to_string_lossy();
            out(format!(
                "nvml device={d} uuid={id} total={} free={} used={} util={}",
                m[0], m[1], m[2], u[0]
            ));
            let mut cnt = 0u32;
            procs(h, &mut cnt, std::ptr::null_mut());
            let mut list = vec![[0u32; 6]; cnt as usize + 4];
            cnt = list.len() as u32;
            procs(h, &mut cnt, list.as_mut_ptr());
            for p in &list[..cnt as usize] {
                let used = u64::from(p[2]) | (u64::from(p[3]) << 32);
                out(format!("nvml process device={d} pid={} used={used}", p[0]));
            }
        }
    }
    true
}

/// Replaces the launch entry points with the pointers of the simulator's private launch
/// table (fgpu-sim's `cuda::export_table`: `{ size, cuLaunchKernel, cuLaunchKernel_ptsz,
/// cuGraphLaunch }`); exits if the driver has none.
fn launch_table(lib: &Lib, api: &mut Api, ptsz: bool) {
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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    out(format!("pid={}", std::process::id()));
    let mut i = 0;
    let (mut path, mut direct, mut ptsz, mut strict, mut table) =
        ("libcuda.so.1".to_string(), false, false, false, false);
    while i < args.len() && args[i].starts_with("--") {
        match args[i].as_str() {
            "--lib" => {
                i += 1;
                path = args.get(i).cloned().unwrap_or_default();
            }
            "--dlsym-direct" => direct = true,
            "--ptsz" => ptsz = true,
            "--strict" => strict = true,
            "--export-table" => table = true,
            other => {
                out(format!("error unknown-option={other}"));
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let mut lib = match Lib::open(&path) {
        Ok(l) => l,
        Err(e) => {
            out(format!("error dlopen={e}"));
            std::process::exit(2);
        }
    };
    lib.direct = direct;
    lib.flags = if ptsz { 2 } else { 0 };
    let gpa = lib.dlsym("cuGetProcAddress_v2");
    if !gpa.is_null() {
        // SAFETY: cuGetProcAddress_v2's documented C signature.
        lib.gpa = Some(unsafe { fn_ptr(gpa) });
    }
    let init = lib.dlsym("cuInit");
    let version = lib.dlsym("cuDriverGetVersion");
    if init.is_null() || version.is_null() {
        out("error missing=cuInit".into());
        std::process::exit(2);
    }
    let mut api = Api::load(&lib);
    if table {
        launch_table(&lib, &mut api, ptsz);
    }
    let mut v = 0i32;
    let (mut ctx, mut dev) = (0usize, 0i32);
    // SAFETY: documented signatures (cuInit(unsigned), cuDriverGetVersion(int*)).
    let (init, version) = unsafe {
        (
            std::mem::transmute::<Ptr, unsafe extern "C" fn(u32) -> i32>(init),
            std::mem::transmute::<Ptr, unsafe extern "C" fn(*mut i32) -> i32>(version),
        )
    };
    // SAFETY: documented signatures; pointers to valid locals (all calls).
    let rc = (|| unsafe {
        step!(init(0));
        step!(version(&mut v));
        step!((api.device_get)(&mut dev, 0));
        step!((api.ctx_retain)(&mut ctx, dev));
        (api.ctx_set_current)(ctx)
    })();
    out(format!("init rc={rc} driver={v}"));
    if rc != 0 {
        std::process::exit(1);
    }
    let mut d = Driver {
        api,
        ctx,
        dev,
        allocs: Vec::new(),
        pool: 0,
        failed: false,
    };
    let size_arg = |s: Option<&String>| s.and_then(|s| size::parse_size(s));
    let num_arg = |s: Option<&String>| s.and_then(|s| s.parse::<u64>().ok());
    while i < args.len() {
        let cmd = args[i].as_str();
        i += 1;
        match cmd {
            "alloc" | "alloc-api" => {
                let api = if cmd == "alloc" {
                    "mem_alloc".to_string()
                } else {
                    i += 1;
                    args.get(i - 1).cloned().unwrap_or_default()
                };
                let Some(size) = size_arg(args.get(i)) else {
                    out(format!("error bad-size command={cmd}"));
                    std::process::exit(2);
                };
                i += 1;
                d.alloc(&api, size);
            }
            "free-last" => {
                let last = d
                    .allocs
                    .iter()
                    .rposition(|a| !a.freed)
                    .unwrap_or(usize::MAX);
                d.free(last);
            }
            "free" => {
                let n = num_arg(args.get(i)).unwrap_or(u64::MAX);
                i += 1;
                d.free(n as usize);
            }
            "free-all" => {
                for n in 0..d.allocs.len() {
                    if !d.allocs[n].freed {
                        d.free(n);
                    }
                }
            }
            "trim" => d.trim(),
            "info" => d.info(),
            "launch" | "graph" => {
                let n = num_arg(args.get(i)).unwrap_or(1);
                let kernel = args.get(i + 1).cloned().unwrap_or_default();
                i += 2;
                if cmd == "launch" {
                    d.launch(n, &kernel);
                } else {
                    let replays = num_arg(args.get(i)).unwrap_or(1);
                    i += 1;
                    d.graph(n, &kernel, replays);
                }
            }
            "launch-for-each" => {
                let ms = num_arg(args.get(i)).unwrap_or(1000);
                let kernel = args.get(i + 1).cloned().unwrap_or_default();
                i += 2;
                d.launch_for_each(ms, &kernel);
            }
            "launch-for" => {
                let ms = num_arg(args.get(i)).unwrap_or(1000);
                let kernel = args.get(i + 1).cloned().unwrap_or_default();
                i += 2;
                d.launch_for(ms, &kernel);
            }
            "steps-for" => {
                let ms = num_arg(args.get(i)).unwrap_or(1000);
                let k = num_arg(args.get(i + 1)).unwrap_or(1);
                let kernel = args.get(i + 2).cloned().unwrap_or_default();
                let gap = num_arg(args.get(i + 3)).unwrap_or(0);
                i += 4;
                // An optional fifth number: SPIN_US of host work before each launch.
                let spin = match args.get(i).and_then(|a| a.parse::<u64>().ok()) {
                    Some(n) => {
                        i += 1;
                        n
                    }
                    None => 0,
                };
                d.steps_for(ms, k, &kernel, gap, spin);
            }
            "steps-threads" => {
                let ms = num_arg(args.get(i)).unwrap_or(1000);
                let threads = num_arg(args.get(i + 1)).unwrap_or(2).clamp(1, 64);
                let k = num_arg(args.get(i + 2)).unwrap_or(1);
                let kernel = args.get(i + 3).cloned().unwrap_or_default();
                let gap = num_arg(args.get(i + 4)).unwrap_or(0);
                i += 5;
                d.steps_threads(ms, threads, k, &kernel, gap);
            }
            "graph-for" => {
                let ms = num_arg(args.get(i)).unwrap_or(1000);
                let n = num_arg(args.get(i + 1)).unwrap_or(1);
                let kernel = args.get(i + 2).cloned().unwrap_or_default();
                i += 3;
                d.graph_for(ms, n, &kernel);
            }
            "sync" => d.sync(),
            "no-context" => {
                // SAFETY: documented signature; a null context is valid (none current).
                let rc = unsafe { (d.api.ctx_set_current)(0) };
                d.report(
                    rc,
                    "no-context ok".into(),
                    format!("no-context fail rc={rc}"),
                );
            }
            "bench-launch" => {
                let n = num_arg(args.get(i)).unwrap_or(100_000);
                let kernel = args.get(i + 1).cloned().unwrap_or_else(|| "empty".into());
                i += 2;
                d.bench_launch(n, &kernel);
            }
            "stress" | "bench-alloc" => {
                let threads = if cmd == "stress" {
                    i += 1;
                    num_arg(args.get(i - 1)).unwrap_or(1)
                } else {
                    1
                };
                let pairs = num_arg(args.get(i)).unwrap_or(0);
                let Some(size) = size_arg(args.get(i + 1)) else {
                    out(format!("error bad-size command={cmd}"));
                    std::process::exit(2);
                };
                i += 2;
                d.alloc_free_pairs(cmd, threads, pairs, size);
            }
            "device" => {
                let n = num_arg(args.get(i)).unwrap_or(0);
                i += 1;
                d.use_device(n as i32);
            }
            "devices" => d.devices(),
            "sleep" => {
                let ms = num_arg(args.get(i)).unwrap_or(0);
                i += 1;
                std::thread::sleep(std::time::Duration::from_millis(ms));
                out(format!("sleep ok ms={ms}"));
            }
            "hold" => {
                out("ready".into());
                let mut sink = Vec::new();
                let _ = std::io::stdin().read_to_end(&mut sink);
                out("hold done".into());
            }
            "nvml" => {
                let p = if path == "libcuda.so.1" {
                    "libnvidia-ml.so.1"
                } else {
                    &path
                };
                if !nvml(p) {
                    d.failed = true;
                }
            }
            other => {
                out(format!("error unknown-command={other}"));
                std::process::exit(2);
            }
        }
    }
    std::process::exit(i32::from(strict && d.failed));
}
