//! fgpu-sim-hip: drives a HIP runtime (`libamdhip64.so`) and ROCm SMI (`librocm_smi64.so`)
//! the way programs reach them: `dlopen` + `dlsym` of each entry point, or (`--gpa`)
//! `dlsym` of `hipGetProcAddress` only and every other entry point through it.
//!
//! Options: `--lib PATH` (default libamdhip64.so), `--smi-lib PATH` (default
//! librocm_smi64.so), `--amdsmi-lib PATH` (default libamd_smi.so), `--gpa`, `--strict` (exit 1 if any step fails), `--spt` (launch with
//! `hipLaunchKernel_spt` / `hipGraphLaunch_spt`), `--per-thread` (kernels into
//! `hipStreamPerThread` instead of the null stream).
//!
//! Commands (one output line each, flushed):
//!   alloc-api {malloc|ext|managed|pitch|async|pool|vmm|array} SIZE
//!       → `alloc ok api=A size=SIZE` or `alloc err api=A rc=RC`
//!   free N            free the N-th successful allocation (0-based) with its API's free
//!   info              hipMemGetInfo → `info free=F total=T`
//!   total             hipDeviceTotalMem(current) → `total bytes=B`
//!   count | device N | uuid
//!   smi               rsmi → `smi device=D total=T used=U` per device
//!   amdsmi            AMD SMI → `amdsmi device=D uuid=U total=T used=U vram_total_mb=M
//!                     vram_used_mb=M` per processor (sockets, then their processors)
//!   launch N KERNEL   N hipLaunchKernel of a registered kernel (duration from its name)
//!   launch-for MS KERNEL  10 launches + hipDeviceSynchronize, repeated for MS ms
//!   graph-for MS N KERNEL a graph of N launches replayed for MS ms (prints replays)
//!   bench-launch N KERNEL N launches + sync → `ns_per_launch=`
//!   ext-launch KERNEL hipExtLaunchKernel with start/stop events → `ext-launch rc= ms=`
//!   module-launch N KERNEL | graph N KERNEL REPLAYS | sync | sleep MS | hold
//!   event-stats       the simulator's counts of events created / recorded (sim only)
//! Timed commands print `elapsed_ms=`.
//! SIZE accepts 16GiB, 512MiB, 8GB or plain bytes.

#[path = "../../size.rs"]
mod size;

use std::ffi::{CStr, CString, c_char, c_void};
use std::io::{Read, Write};

type Ptr = *mut c_void;
type Gpa = unsafe extern "C" fn(*const c_char, *mut Ptr, i32, u64, *mut i32) -> i32;

struct Hip {
    handle: Ptr,
    gpa: Option<Gpa>,
}

fn open(path: &str) -> Result<Ptr, String> {
    let c = CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: valid C string.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a valid C string after a failed dlopen.
        return Err(unsafe { CStr::from_ptr(libc::dlerror()) }
            .to_string_lossy()
            .into_owned());
    }
    Ok(h)
}

fn dlsym(handle: Ptr, name: &str) -> Ptr {
    let c = CString::new(name).unwrap_or_default();
    // SAFETY: a handle from dlopen and a valid C string.
    unsafe { libc::dlsym(handle, c.as_ptr()) }
}

impl Hip {
    fn sym(&self, name: &str) -> Ptr {
        if let Some(gpa) = self.gpa {
            let c = CString::new(name).unwrap_or_default();
            let mut p: Ptr = std::ptr::null_mut();
            let mut status = 0;
            // SAFETY: hipGetProcAddress with valid pointers.
            let rc = unsafe { gpa(c.as_ptr(), &mut p, 70_000_000, 0, &mut status) };
            return if rc == 0 { p } else { std::ptr::null_mut() };
        }
        dlsym(self.handle, name)
    }
}

/// Calls entry point `$name` of `$lib` with type `fn($t...) -> i32`.
macro_rules! call {
    ($lib:expr, $name:literal, fn($($t:ty),*) $(, $arg:expr)*) => {{
        let p = $lib.sym($name);
        if p.is_null() {
            eprintln!("{} not found", $name);
            -1
        } else {
            // SAFETY: the entry point of that name has this C signature (HIP API).
            let f: unsafe extern "C" fn($($t),*) -> i32 = unsafe { std::mem::transmute(p) };
            // SAFETY: arguments as the HIP API documents them.
            unsafe { f($($arg),*) }
        }
    }};
}

mod exec;

#[repr(C)]
#[derive(Clone, Copy)]
struct Dim3 {
    x: u32,
    y: u32,
    z: u32,
}

#[repr(C)]
struct AllocProp {
    ty: i32,
    handle_types: i32,
    location_type: i32,
    location_id: i32,
    rest: [u8; 32],
}

#[repr(C)]
struct ChannelDesc {
    x: i32,
    y: i32,
    z: i32,
    w: i32,
    kind: i32,
}

struct Alloc {
    api: String,
    ptr: u64,
}

fn out(line: String) {
    let mut o = std::io::stdout();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

struct Run {
    hip: Hip,
    smi: Option<Ptr>,
    amdsmi: Option<Ptr>,
    allocs: Vec<Alloc>,
    kernels: Vec<(String, Box<u8>)>,
    modules: Ptr,
    failed: bool,
    spt: bool,
    default_stream: Ptr,
}

impl Run {
    fn alloc(&mut self, api: &str, size: u64) -> i32 {
        let h = &self.hip;
        let mut p: Ptr = std::ptr::null_mut();
        let n = size as usize;
        let rc = match api {
            "malloc" => call!(h, "hipMalloc", fn(*mut Ptr, usize), &mut p, n),
            "ext" => call!(
                h,
                "hipExtMallocWithFlags",
                fn(*mut Ptr, usize, u32),
                &mut p,
                n,
                0
            ),
            "managed" => call!(
                h,
                "hipMallocManaged",
                fn(*mut Ptr, usize, u32),
                &mut p,
                n,
                1
            ),
            "pitch" => {
                let (w, ht) = if n >= 65536 {
                    (65536, n / 65536)
                } else {
                    (n, 1)
                };
                let mut pitch = 0usize;
                call!(
                    h,
                    "hipMallocPitch",
                    fn(*mut Ptr, *mut usize, usize, usize),
                    &mut p,
                    &mut pitch,
                    w,
                    ht
                )
            }
            "async" => call!(
                h,
                "hipMallocAsync",
                fn(*mut Ptr, usize, Ptr),
                &mut p,
                n,
                std::ptr::null_mut()
            ),
            "pool" => {
                let mut pool: Ptr = std::ptr::null_mut();
                let mut dev = 0i32;
                call!(h, "hipGetDevice", fn(*mut i32), &mut dev);
                let rc = call!(
                    h,
                    "hipDeviceGetDefaultMemPool",
                    fn(*mut Ptr, i32),
                    &mut pool,
                    dev
                );
                if rc != 0 {
                    rc
                } else {
                    call!(
                        h,
                        "hipMallocFromPoolAsync",
                        fn(*mut Ptr, usize, Ptr, Ptr),
                        &mut p,
                        n,
                        pool,
                        std::ptr::null_mut()
                    )
                }
            }
            "vmm" => {
                let mut dev = 0i32;
                call!(h, "hipGetDevice", fn(*mut i32), &mut dev);
                let prop = AllocProp {
                    ty: 1,
                    handle_types: 0,
                    location_type: 1,
                    location_id: dev,
                    rest: [0; 32],
                };
                let g = 2u64 << 20;
                let mut handle = 0u64;
                let rc = call!(
                    h,
                    "hipMemCreate",
                    fn(*mut u64, usize, *const AllocProp, u64),
                    &mut handle,
                    size.div_ceil(g).max(1) as usize * g as usize,
                    &prop,
                    0
                );
                p = handle as Ptr;
                rc
            }
            "array" => {
                let desc = ChannelDesc {
                    x: 8,
                    y: 0,
                    z: 0,
                    w: 0,
                    kind: 1,
                };
                let (w, ht) = if n >= 65536 {
                    (65536, n / 65536)
                } else {
                    (n.max(1), 0)
                };
                call!(
                    h,
                    "hipMallocArray",
                    fn(*mut Ptr, *const ChannelDesc, usize, usize, u32),
                    &mut p,
                    &desc,
                    w,
                    ht,
                    0
                )
            }
            _ => {
                eprintln!("unknown alloc api {api}");
                -1
            }
        };
        if rc == 0 {
            self.allocs.push(Alloc {
                api: api.into(),
                ptr: p as u64,
            });
            out(format!("alloc ok api={api} size={size}"));
        } else {
            out(format!("alloc err api={api} rc={rc}"));
        }
        rc
    }

    fn free(&mut self, i: usize) -> i32 {
        let Some(a) = self.allocs.get(i) else {
            out(format!("free err index={i}"));
            return -1;
        };
        let h = &self.hip;
        let p = a.ptr as Ptr;
        let rc = match a.api.as_str() {
            "async" | "pool" => call!(h, "hipFreeAsync", fn(Ptr, Ptr), p, std::ptr::null_mut()),
            "vmm" => call!(h, "hipMemRelease", fn(u64), a.ptr),
            "array" => call!(h, "hipFreeArray", fn(Ptr), p),
            _ => call!(h, "hipFree", fn(Ptr), p),
        };
        out(format!("free rc={rc} index={i}"));
        rc
    }

    fn smi(&mut self) -> i32 {
        let Some(s) = self.smi else {
            out("smi err rc=-1".into());
            return -1;
        };
        let lib = Hip {
            handle: s,
            gpa: None,
        };
        let mut n = 0u32;
        let mut rc = call!(lib, "rsmi_init", fn(u64), 0);
        if rc == 0 {
            rc = call!(lib, "rsmi_num_monitor_devices", fn(*mut u32), &mut n);
        }
        for d in 0..n {
            let (mut t, mut u, mut id) = (0u64, 0u64, 0u64);
            let r1 = call!(
                lib,
                "rsmi_dev_memory_total_get",
                fn(u32, i32, *mut u64),
                d,
                0,
                &mut t
            );
            let r2 = call!(
                lib,
                "rsmi_dev_memory_usage_get",
                fn(u32, i32, *mut u64),
                d,
                0,
                &mut u
            );
            call!(lib, "rsmi_dev_unique_id_get", fn(u32, *mut u64), d, &mut id);
            out(format!(
                "smi device={d} total={t} used={u} id={id:#018x} rc={}",
                r1 | r2
            ));
            rc |= r1 | r2;
        }
        rc
    }

    fn step(&mut self, cmd: &str, args: &mut std::slice::Iter<'_, String>) -> i32 {
        let mut next = || args.next().cloned().unwrap_or_default();
        let num = |s: String| size::parse_size(&s).unwrap_or(0);
        let h = &self.hip;
        match cmd {
            "alloc-api" => {
                let api = next();
                let s = num(next());
                self.alloc(&api, s)
            }
            "free" => {
                let i = num(next()) as usize;
                self.free(i)
            }
            "info" => {
                let (mut f, mut t) = (0usize, 0usize);
                let rc = call!(
                    h,
                    "hipMemGetInfo",
                    fn(*mut usize, *mut usize),
                    &mut f,
                    &mut t
                );
                out(format!("info rc={rc} free={f} total={t}"));
                rc
            }
            "total" => {
                let mut dev = 0i32;
                call!(h, "hipGetDevice", fn(*mut i32), &mut dev);
                let mut b = 0usize;
                let rc = call!(h, "hipDeviceTotalMem", fn(*mut usize, i32), &mut b, dev);
                out(format!("total rc={rc} bytes={b}"));
                rc
            }
            "count" => {
                let mut n = 0i32;
                let rc = call!(h, "hipGetDeviceCount", fn(*mut i32), &mut n);
                out(format!("count rc={rc} n={n}"));
                rc
            }
            "device" => {
                let d = num(next()) as i32;
                let rc = call!(h, "hipSetDevice", fn(i32), d);
                out(format!("device rc={rc} n={d}"));
                rc
            }
            "uuid" => {
                let mut dev = 0i32;
                call!(h, "hipGetDevice", fn(*mut i32), &mut dev);
                let mut u = [0u8; 16];
                let rc = call!(h, "hipDeviceGetUuid", fn(*mut [u8; 16], i32), &mut u, dev);
                let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
                out(format!("uuid rc={rc} device={dev} hex={hex}"));
                rc
            }
            "smi" => self.smi(),
            "amdsmi" => self.amdsmi(),
            "launch" => {
                let n = num(next());
                let k = next();
                self.launch(n, &k)
            }
            "launch-for" => {
                let ms = num(next());
                let k = next();
                self.launch_for(ms, &k)
            }
            "graph-for" => {
                let ms = num(next());
                let n = num(next());
                let k = next();
                self.graph_for(ms, n, &k)
            }
            "bench-launch" => {
                let n = num(next());
                let k = next();
                self.bench_launch(n, &k)
            }
            "event-stats" => self.event_stats(),
            "ext-launch" => {
                let k = next();
                self.ext_launch(&k)
            }
            "module-launch" => {
                let n = num(next());
                let k = next();
                self.module_launch(n, &k)
            }
            "graph" => {
                let n = num(next());
                let k = next();
                let replays = num(next());
                self.graph(n, &k, replays)
            }
            "sync" => {
                let t = std::time::Instant::now();
                let rc = call!(h, "hipDeviceSynchronize", fn());
                out(format!(
                    "sync rc={rc} ms={} elapsed_ms={:.1}",
                    t.elapsed().as_millis(),
                    t.elapsed().as_secs_f64() * 1e3
                ));
                rc
            }
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_millis(num(next())));
                0
            }
            "hold" => {
                out("ready".into());
                let mut buf = Vec::new();
                let _ = std::io::stdin().read_to_end(&mut buf);
                0
            }
            other => {
                eprintln!("unknown command {other}");
                -1
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut lib, mut smi_lib, mut gpa, mut strict) = (
        "libamdhip64.so".to_string(),
        "librocm_smi64.so".to_string(),
        false,
        false,
    );
    let (mut spt, mut per_thread) = (false, false);
    let mut amdsmi_lib = "libamd_smi.so".to_string();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--lib" => lib = it.next().cloned().unwrap_or_default(),
            "--smi-lib" => smi_lib = it.next().cloned().unwrap_or_default(),
            "--amdsmi-lib" => amdsmi_lib = it.next().cloned().unwrap_or_default(),
            "--gpa" => gpa = true,
            "--strict" => strict = true,
            "--spt" => spt = true,
            "--per-thread" => per_thread = true,
            "--help" | "-h" => {
                println!(
                    "{}",
                    include_str!("main.rs")
                        .lines()
                        .take_while(|l| l.starts_with("//!"))
                        .map(|l| l.trim_start_matches("//!").trim_start_matches(' '))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                return;
            }
            _ => rest.push(a.clone()),
        }
    }
    let handle = match open(&lib) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("fgpu-sim-hip: cannot load {lib}: {e}");
            std::process::exit(2);
        }
    };
    let mut hip = Hip { handle, gpa: None };
    if gpa {
        let p = dlsym(handle, "hipGetProcAddress");
        if p.is_null() {
            eprintln!("fgpu-sim-hip: no hipGetProcAddress in {lib}");
            std::process::exit(2);
        }
        // SAFETY: hipGetProcAddress's C signature.
        hip.gpa = Some(unsafe { std::mem::transmute::<Ptr, Gpa>(p) });
    }
    let rc = call!(hip, "hipInit", fn(u32), 0);
    out(format!("init rc={rc} pid={}", std::process::id()));
    let mut run = Run {
        hip,
        smi: open(&smi_lib).ok(),
        amdsmi: open(&amdsmi_lib).ok(),
        allocs: Vec::new(),
        kernels: Vec::new(),
        modules: std::ptr::null_mut(),
        failed: rc != 0,
        spt,
        // hipStreamPerThread.
        default_stream: if per_thread {
            2 as Ptr
        } else {
            std::ptr::null_mut()
        },
    };
    let mut it = rest.iter();
    while let Some(cmd) = it.next() {
        if run.step(cmd, &mut it) != 0 {
            run.failed = true;
        }
    }
    if strict && run.failed {
        std::process::exit(1);
    }
}
