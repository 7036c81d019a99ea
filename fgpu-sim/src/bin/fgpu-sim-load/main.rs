//! fgpu-sim-load: drives a CUDA driver exactly as the CUDA runtime reaches it.
//!
//! `dlopen("libcuda.so.1")` (or `--lib PATH`), `dlsym` of `cuGetProcAddress_v2`, `cuInit` and
//! `cuDriverGetVersion` only; every other entry point through
//! `cuGetProcAddress_v2(base, 12000, flags, &status)`. `--dlsym-direct` dlsyms the versioned
//! names instead; `--ptsz` asks for per-thread-default-stream variants (flags = 2);
//! `--export-table` launches (kernels and graphs) through the pointers of the driver's
//! private launch table (`cuGetExportTable`, as the real runtime does) instead;
//! `--strict` exits 1 if any step fails; `--error-names` ends every failure's line with the
//! driver's name for its code (`cuGetErrorName`), e.g. `error=CUDA_ERROR_OUT_OF_MEMORY`.
//!
//! Commands (one output line each, flushed):
//!   alloc SIZE | alloc-api {mem_alloc|pitch|managed|async|pool|vmm|array} SIZE
//!   free-last | free N | free-all | trim | info | launch N KERNEL | graph N KERNEL REPLAYS
//!   sync | sleep MS | hold | nvml
//!   fill IDX SEED | check IDX SEED (a pattern of SEED over allocation IDX, written with
//!                                cuMemcpyHtoD_v2 / read back with cuMemcpyDtoH_v2, 64 MiB at
//!                                most per call; `check IDX ok` or `check IDX mismatch at OFF`)
//!   check-byte IDX BYTE | memset IDX BYTE (cuMemsetD8_v2) | copy DST SRC (cuMemcpyDtoD_v2)
//!   unmap IDX | map IDX | remap IDX (a vmm allocation's mapping: unmapped with its
//!                                reservation kept, mapped again there, or mapped at a fresh
//!                                reservation that becomes its address); lines: driver/data.rs
//!   access IDX ORD FLAGS        (cuMemSetAccess of a vmm allocation for ordinal ORD: FLAGS 0
//!                                none, 1 read, 3 read and write)
//!   batch-check IDX SEED | batch12-check IDX SEED (as check, read with cuMemcpyBatchAsync_v2 /
//!                                CUDA 12.8's cuMemcpyBatchAsync) | write-value IDX SEED |
//!                                wait-value IDX SEED (cuStreamWriteValue32_v2 /
//!                                cuStreamWaitValue32_v2 of the pattern's first word at the
//!                                allocation's start) | mem-ops IDX SEED (the same word
//!                                written, waited for, and a barrier, in one
//!                                cuStreamBatchMemOp_v2); lines: driver/streamops.rs
//!   fault                       (fgpu-sim only: the current context faults, as a kernel
//!                                touching an illegal address makes it; later calls fail 700)
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
//!
//! Layout: `api` (the library, its entry points), `driver` (the commands: `memory`,
//! `launch`, `steps`), `nvml`.

#[path = "../../size.rs"]
mod size;

use std::io::{Read, Write};

/// Evaluates a driver call; returns its code from the enclosing function if it failed.
macro_rules! step {
    ($e:expr) => {{
        let rc = $e;
        if rc != 0 {
            return rc;
        }
    }};
}

mod api;
mod driver;
mod nvml;

use api::{Api, Lib, Ptr, fn_ptr, launch_table};
use driver::Driver;

use fgpu_common::clock::mono_ms;

fn out(line: String) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    out(format!("pid={}", std::process::id()));
    let mut i = 0;
    let (mut path, mut direct, mut ptsz, mut strict, mut table, mut names) = (
        "libcuda.so.1".to_string(),
        false,
        false,
        false,
        false,
        false,
    );
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
            "--error-names" => names = true,
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
    // Resolved only when asked for: a driver without it still runs everything else.
    let error_name = if names {
        let p = lib.resolve("cuGetErrorName", "cuGetErrorName");
        if p.is_null() {
            out("error missing=cuGetErrorName".into());
            std::process::exit(2);
        }
        // SAFETY: cuGetErrorName(CUresult, const char**)'s documented C signature.
        Some(unsafe { fn_ptr(p) })
    } else {
        None
    };
    let mut d = Driver {
        api,
        ctx,
        dev,
        allocs: Vec::new(),
        pool: 0,
        failed: false,
        error_name,
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
            "fill" | "check" | "check-byte" | "memset" | "copy" => {
                let idx = num_arg(args.get(i)).unwrap_or(u64::MAX) as usize;
                let Some(v) = num_arg(args.get(i + 1)) else {
                    out(format!("error bad-argument command={cmd}"));
                    std::process::exit(2);
                };
                i += 2;
                match cmd {
                    "fill" => d.fill(idx, v),
                    "check" => d.check(idx, v),
                    "check-byte" => d.check_byte(idx, v as u8),
                    "memset" => d.memset(idx, v as u8),
                    _ => d.copy(idx, v as usize),
                }
            }
            "batch-check" | "batch12-check" | "write-value" | "wait-value" | "mem-ops" => {
                let idx = num_arg(args.get(i)).unwrap_or(u64::MAX) as usize;
                let Some(seed) = num_arg(args.get(i + 1)) else {
                    out(format!("error bad-argument command={cmd}"));
                    std::process::exit(2);
                };
                i += 2;
                match cmd {
                    "batch-check" | "batch12-check" => {
                        d.batch_check(idx, seed, cmd == "batch-check")
                    }
                    "mem-ops" => d.mem_ops(idx, seed),
                    _ => d.stream_value(idx, seed, cmd == "write-value"),
                }
            }
            "unmap" | "map" | "remap" => {
                let idx = num_arg(args.get(i)).unwrap_or(u64::MAX) as usize;
                i += 1;
                if cmd == "unmap" {
                    d.unmap(idx);
                } else {
                    d.map(idx, cmd == "remap");
                }
            }
            "access" => {
                let idx = num_arg(args.get(i)).unwrap_or(u64::MAX) as usize;
                let (Some(ord), Some(flags)) = (num_arg(args.get(i + 1)), num_arg(args.get(i + 2)))
                else {
                    out(format!("error bad-argument command={cmd}"));
                    std::process::exit(2);
                };
                i += 3;
                d.access(idx, ord as i32, flags as i32);
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
            "fault" => {
                // The simulator's own fault injection (fgpu-sim cuda::context::fgpu_sim_fault),
                // looked up by name: not a driver entry point, so no shim sees it.
                let p = lib.dlsym("fgpuSimFault");
                if p.is_null() {
                    out("fault fail missing=fgpuSimFault".into());
                    d.failed = true;
                } else {
                    // SAFETY: fgpuSimFault(void) -> CUresult.
                    let f: unsafe extern "C" fn() -> i32 = unsafe { fn_ptr(p) };
                    // SAFETY: no arguments.
                    let rc = unsafe { f() };
                    d.report(rc, "fault ok".into(), format!("fault fail rc={rc}"));
                }
            }
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
                if !nvml::nvml(p) {
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
