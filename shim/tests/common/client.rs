//! Clients that fgpu-sim-load does not cover, run as this very test binary (re-executed with
//! `FGPU_TEST_CLIENT=<mode>` and the shim preloaded). Like the CUDA runtime, they `dlopen`
//! libcuda.so.1, `dlsym` only `cuInit` and `cuGetProcAddress_v2`, and get every other entry
//! point from `cuGetProcAddress_v2`. One output line per result.
//!
//! Modes: `race THREADS CHUNK_MIB CHURN`, `fork`, `fork-fresh`, `nvml2`, `rtld`, `probe`,
//! `watch-total`, `tamper`, `forged-hello KIND`, `forge-compute MS`, `forge-room MS MIB`,
//! `forge-parked MS`, `alloc-until MS FIRST_MIB MIB HOLD_MS`.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::{Arc, Barrier};

type Ptr = *mut c_void;
type R = c_int;

fn out(s: String) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{s}");
    let _ = o.flush();
}

fn dlopen(name: &CStr) -> Ptr {
    // SAFETY: valid C string.
    unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
}

fn dlsym(h: Ptr, name: &CStr) -> Ptr {
    // SAFETY: a handle from dlopen (or a pseudo-handle) and a valid C string.
    unsafe { libc::dlsym(h, name.as_ptr()) }
}

/// The driver as the CUDA runtime reaches it.
#[derive(Clone, Copy)]
pub struct Cuda {
    init: unsafe extern "C" fn(u32) -> R,
    gpa: unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> R,
}

macro_rules! f {
    ($cuda:expr, $name:literal, $ty:ty) => {{
        let p = $cuda.resolve($name);
        assert!(!p.is_null(), "cuGetProcAddress_v2 gave no {}", $name);
        // SAFETY: the driver API documents this entry point with this C signature.
        unsafe { std::mem::transmute::<Ptr, $ty>(p) }
    }};
}

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> R;
type Free = unsafe extern "C" fn(u64) -> R;
type Info = unsafe extern "C" fn(*mut usize, *mut usize) -> R;

impl Cuda {
    pub fn open() -> Option<Cuda> {
        let h = dlopen(c"libcuda.so.1");
        if h.is_null() {
            return None;
        }
        let init = dlsym(h, c"cuInit");
        let gpa = dlsym(h, c"cuGetProcAddress_v2");
        if init.is_null() || gpa.is_null() {
            return None;
        }
        // SAFETY: documented signatures of cuInit and cuGetProcAddress_v2.
        unsafe {
            Some(Cuda {
                init: std::mem::transmute::<Ptr, unsafe extern "C" fn(u32) -> R>(init),
                gpa: std::mem::transmute::<
                    Ptr,
                    unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> R,
                >(gpa),
            })
        }
    }

    fn resolve(&self, base: &str) -> Ptr {
        let c = CString::new(base).unwrap();
        let mut p: Ptr = std::ptr::null_mut();
        let mut st = 0;
        // SAFETY: valid C string and out-pointers.
        unsafe { (self.gpa)(c.as_ptr(), &mut p, 12000, 0, &mut st) };
        p
    }

    /// cuInit + primary context of device 0 made current on this thread; returns the context.
    pub fn context(&self) -> Result<usize, R> {
        let dev_get = f!(
            self,
            "cuDeviceGet",
            unsafe extern "C" fn(*mut c_int, c_int) -> R
        );
        let retain = f!(
            self,
            "cuDevicePrimaryCtxRetain",
            unsafe extern "C" fn(*mut usize, c_int) -> R
        );
        let (mut dev, mut ctx) = (0, 0usize);
        // SAFETY: documented signatures, valid out-pointers.
        unsafe {
            let rc = (self.init)(0);
            if rc != 0 {
                return Err(rc);
            }
            let rc = dev_get(&mut dev, 0);
            if rc != 0 {
                return Err(rc);
            }
            let rc = retain(&mut ctx, dev);
            if rc != 0 {
                return Err(rc);
            }
        }
        self.set_current(ctx);
        Ok(ctx)
    }

    pub fn set_current(&self, ctx: usize) {
        let set = f!(self, "cuCtxSetCurrent", unsafe extern "C" fn(usize) -> R);
        // SAFETY: documented signature.
        unsafe { set(ctx) };
    }

    pub fn alloc(&self, n: u64) -> Result<u64, R> {
        let a = f!(self, "cuMemAlloc", Alloc);
        let mut p = 0u64;
        // SAFETY: documented signature, valid out-pointer.
        match unsafe { a(&mut p, n as usize) } {
            0 => Ok(p),
            rc => Err(rc),
        }
    }

    pub fn free(&self, p: u64) -> R {
        let fr = f!(self, "cuMemFree", Free);
        // SAFETY: documented signature.
        unsafe { fr(p) }
    }

    pub fn info(&self) -> String {
        let i = f!(self, "cuMemGetInfo", Info);
        let (mut fr, mut t) = (0usize, 0usize);
        // SAFETY: documented signature, valid out-pointers.
        let rc = unsafe { i(&mut fr, &mut t) };
        format!("info rc={rc} free={fr} total={t}")
    }
}

/// NVML through dlopen + dlsym, like nvidia-smi.
fn nvml_lines(tag: &str) {
    let h = dlopen(c"libnvidia-ml.so.1");
    assert!(!h.is_null(), "no libnvidia-ml.so.1");
    type Init = unsafe extern "C" fn() -> R;
    type ByIndex = unsafe extern "C" fn(u32, *mut Ptr) -> R;
    type V1 = unsafe extern "C" fn(Ptr, *mut [u64; 3]) -> R;
    #[repr(C)]
    struct V2 {
        version: u32,
        total: u64,
        reserved: u64,
        free: u64,
        used: u64,
    }
    type V2f = unsafe extern "C" fn(Ptr, *mut V2) -> R;
    let sym = |n: &CStr| {
        let p = dlsym(h, n);
        assert!(!p.is_null(), "no {n:?}");
        p
    };
    // SAFETY: documented NVML signatures; valid out-pointers.
    unsafe {
        let init = std::mem::transmute::<Ptr, Init>(sym(c"nvmlInit_v2"));
        let by_index = std::mem::transmute::<Ptr, ByIndex>(sym(c"nvmlDeviceGetHandleByIndex_v2"));
        let v1 = std::mem::transmute::<Ptr, V1>(sym(c"nvmlDeviceGetMemoryInfo"));
        let v2 = std::mem::transmute::<Ptr, V2f>(sym(c"nvmlDeviceGetMemoryInfo_v2"));
        assert_eq!(init(), 0);
        let mut d: Ptr = std::ptr::null_mut();
        assert_eq!(by_index(0, &mut d), 0);
        let mut m = [0u64; 3];
        let rc = v1(d, &mut m);
        out(format!(
            "{tag}nvml1 rc={rc} total={} free={} used={}",
            m[0], m[1], m[2]
        ));
        let mut m2 = V2 {
            version: std::mem::size_of::<V2>() as u32 | (2 << 24),
            total: 0,
            reserved: 0,
            free: 0,
            used: 0,
        };
        let rc = v2(d, &mut m2);
        out(format!(
            "{tag}nvml2 rc={rc} total={} free={} used={} reserved={}",
            m2.total, m2.free, m2.used, m2.reserved
        ));
    }
}

fn race(args: &[u64]) {
    let (threads, chunk, churn) = (args[0] as usize, args[1] << 20, args[2]);
    let cuda = Cuda::open().expect("driver");
    let ctx = cuda.context().expect("context");
    out(cuda.info());
    let start = Arc::new(Barrier::new(threads));
    let mid = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (start, mid) = (Arc::clone(&start), Arc::clone(&mid));
            std::thread::spawn(move || {
                cuda.set_current(ctx);
                start.wait();
                let mut mine = Vec::new();
                let last = loop {
                    match cuda.alloc(chunk) {
                        Ok(p) => mine.push(p),
                        Err(rc) => break rc,
                    }
                };
                mid.wait();
                let got = mine.len();
                for p in mine {
                    assert_eq!(cuda.free(p), 0);
                }
                // Churn: allocate and free as fast as possible, all threads at once.
                let mut denied = 0u64;
                for _ in 0..churn {
                    match cuda.alloc(chunk) {
                        Ok(p) => assert_eq!(cuda.free(p), 0),
                        Err(2) => denied += 1,
                        Err(rc) => panic!("alloc rc={rc}"),
                    }
                }
                (got, last, denied)
            })
        })
        .collect();
    let mut total = 0;
    let mut codes = Vec::new();
    let mut denied = 0;
    for h in handles {
        let (g, rc, d) = h.join().unwrap();
        total += g;
        codes.push(rc);
        denied += d;
    }
    codes.sort();
    codes.dedup();
    out(format!(
        "race chunks={total} bytes={} fail_codes={codes:?} churn_denied={denied}",
        total as u64 * chunk
    ));
    out(cuda.info());
}

/// Parent: CUDA context + one allocation, then fork. Child: inherits no CUDA state; the shim
/// must give it its own slot without taking the parent's (the parent's share stays counted
/// while the parent lives), and pass the driver's own answer to its CUDA calls (the simulated
/// driver, like the real one, refuses CUDA in a child of an initialised parent).
/// Args: PARENT_MIB CHILD_MIB.
fn fork(args: &[u64]) {
    let cuda = Cuda::open().expect("driver");
    cuda.context().expect("context");
    cuda.alloc(args[0] << 20).expect("parent alloc");
    out(format!("parent {}", cuda.info()));
    // SAFETY: fork in a process whose other threads hold no locks the child needs (the
    // test harness thread is idle; the child only calls the driver and exits).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        nvml_lines("child ");
        let rc = cuda.alloc(args[1] << 20).err().unwrap_or(0);
        out(format!("child alloc_rc={rc}"));
        // SAFETY: leaving the child without running the parent's atexit handlers.
        unsafe { libc::_exit(0) };
    }
    let mut st = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    out(format!("parent child_status={st}"));
    out(format!("parent after {}", cuda.info()));
    nvml_lines("parent ");
}

/// Parent: no CUDA of its own (it only asks NVML, which opens the ledger and claims a slot),
/// then forks two children that each use CUDA fully: together they must stay in the limit.
/// Args: CHUNK_MIB.
fn fork_fresh(args: &[u64]) {
    nvml_lines("parent ");
    let mut kids: Vec<(libc::pid_t, c_int)> = Vec::new();
    for k in 0..2 {
        let mut fds = [0; 2];
        // SAFETY: a pipe for "go on" signalling.
        unsafe { libc::pipe(fds.as_mut_ptr()) };
        let (rd, wr) = (fds[0], fds[1]);
        // SAFETY: see `fork`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            for (_, w) in &kids {
                // SAFETY: closing the earlier children's pipe ends this child inherited.
                unsafe { libc::close(*w) };
            }
            let cuda = Cuda::open().expect("driver");
            let rc = cuda.context().err().unwrap_or(0);
            let mut n = 0;
            while cuda.alloc(args[0] << 20).is_ok() {
                n += 1;
            }
            out(format!("child{k} ctx_rc={rc} chunks={n}"));
            let mut b = [0u8; 1];
            // SAFETY: wait for the parent's byte (or EOF) before exiting.
            unsafe {
                libc::close(wr);
                libc::read(rd, b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        // SAFETY: closing our read end.
        unsafe { libc::close(rd) };
        // Let the first child finish allocating before the second starts.
        std::thread::sleep(std::time::Duration::from_millis(300));
        kids.push((pid, wr));
    }
    for (pid, wr) in kids {
        let mut st = 0;
        // SAFETY: releasing and reaping our children.
        unsafe {
            libc::close(wr);
            libc::waitpid(pid, &mut st, 0);
        }
    }
    nvml_lines("parent after ");
}

/// `dlsym(RTLD_NEXT, "dlsym")` from the main program must find the next object that defines
/// `dlsym` after the *program*: the shim itself. (If the shim forwarded RTLD_NEXT with an
/// ordinary call, glibc would search after the shim and return libc's.)
fn rtld() {
    let next = dlsym(libc::RTLD_NEXT, c"dlsym");
    let default = dlsym(libc::RTLD_DEFAULT, c"dlsym");
    // SAFETY: valid C strings.
    let libc_dlsym =
        unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), c"GLIBC_2.34".as_ptr()) };
    out(format!(
        "rtld next_is_shim={} next_is_libc={}",
        next == default,
        next == libc_dlsym
    ));
    let malloc_next = dlsym(libc::RTLD_NEXT, c"malloc");
    out(format!("rtld malloc_found={}", !malloc_next.is_null()));
    if Cuda::open().is_some() {
        let w = dlsym(libc::RTLD_NEXT, c"cuMemAlloc_v2");
        let h = dlopen(c"libcuda.so.1");
        let via_handle = dlsym(h, c"cuMemAlloc_v2");
        out(format!(
            "rtld cuda next_is_wrapper={} handle_is_wrapper={}",
            w == default_wrapper(),
            via_handle == default_wrapper()
        ));
    }
}

fn default_wrapper() -> Ptr {
    dlsym(libc::RTLD_DEFAULT, c"cuMemAlloc_v2")
}

/// Without a driver loaded, the shim's exports must not make CUDA look present.
fn probe() {
    let p = dlsym(libc::RTLD_DEFAULT, c"cuMemAlloc_v2");
    let g = dlsym(libc::RTLD_DEFAULT, c"cuGetProcAddress_v2");
    out(format!(
        "probe cuMemAlloc_v2_null={} gpa_null={} cuda_opens={}",
        p.is_null(),
        g.is_null(),
        Cuda::open().is_some()
    ));
}

/// Polls cuMemGetInfo until the total changes (a limit set from outside reached this
/// process), then prints when it saw it (CLOCK_MONOTONIC ns: the same clock in every PID
/// namespace). Gives up after 20 s.
fn watch_total() {
    let cuda = Cuda::open().expect("driver");
    cuda.context().expect("context");
    let i = f!(cuda, "cuMemGetInfo", Info);
    let total = || {
        let (mut fr, mut t) = (0usize, 0usize);
        // SAFETY: documented signature, valid out-pointers.
        unsafe { i(&mut fr, &mut t) };
        t
    };
    let t0 = total();
    out(format!("watch start total={t0}"));
    let start = std::time::Instant::now();
    loop {
        let t = total();
        if t != t0 {
            let ns = fgpu_common::clock::mono_ns();
            out(format!("watch changed total={t} mono_ns={ns}"));
            return;
        }
        if start.elapsed() > std::time::Duration::from_secs(20) {
            out("watch timeout".into());
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// This process's descriptor whose /proc/self/fd link starts with `/memfd:NAME`.
fn own_memfd(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc/self/fd").ok()?.find_map(|e| {
        let e = e.ok()?;
        let target = std::fs::read_link(e.path()).ok()?;
        target
            .to_string_lossy()
            .starts_with(&format!("/memfd:{name}"))
            .then(|| e.file_name().to_string_lossy().parse().ok())?
    })
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `tamper`: takes the agent's ledger (an allocation through the shim), then tries to resize
/// and reseal the usage memfd it was handed and to get the limits page writable. One line
/// per attempt (`tamper OP rc=R errno=E`), then it holds its memory 1.5 s (the agent keeps
/// reading the ledger meanwhile) and prints `tamper done`.
fn tamper() {
    let cuda = Cuda::open().expect("libcuda.so.1");
    let ctx = cuda.context().expect("context");
    cuda.set_current(ctx);
    out(format!("tamper alloc {:?}", cuda.alloc(64 << 20)));
    let usage = own_memfd("fgpu-usage").expect("a usage memfd from the agent");
    let report = |op: &str, rc: i64| out(format!("tamper {op} rc={rc} errno={}", errno()));
    // SAFETY: system calls on our own descriptors; refusing them is what is tested.
    unsafe {
        report("shrink", i64::from(libc::ftruncate(usage, 4096)));
        report("grow", i64::from(libc::ftruncate(usage, 64 << 20)));
        report(
            "seal-write",
            i64::from(libc::fcntl(usage, libc::F_ADD_SEALS, libc::F_SEAL_WRITE)),
        );
        report(
            "seal-future-write",
            i64::from(libc::fcntl(
                usage,
                libc::F_ADD_SEALS,
                libc::F_SEAL_FUTURE_WRITE,
            )),
        );
    }
    // The limits page as the shim mapped it (its descriptor is closed once mapped).
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let start = maps
        .lines()
        .find(|l| l.contains("memfd:fgpu-limits"))
        .and_then(|l| usize::from_str_radix(l.split('-').next()?, 16).ok())
        .expect("the limits page is mapped");
    // SAFETY: asking for write access to our own mapping of the limits page; must fail.
    let rc = unsafe {
        libc::mprotect(
            start as *mut c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    report("mprotect-limits-writable", i64::from(rc));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    out(format!("tamper done info={:?}", cuda.info()));
}

/// `forged-hello KIND`: a Hello to the agent socket ($FGPU_SOCKET) offering a usage memfd
/// that must not be adopted — 1: unsealed, right size; 2: sealed, wrong size; 3: sealed
/// against writes; 4: not a memfd (/dev/zero). Prints `forged reply kind=K text=T`.
fn forged_hello(args: &[u64]) {
    let kind = args.first().copied().unwrap_or(1);
    let size = fgpu_common::ledger::USAGE_SIZE as i64;
    let grow_shrink_seal = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: creating and shaping descriptors of our own.
    let fd = unsafe {
        if kind == 4 {
            libc::open(c"/dev/zero".as_ptr(), libc::O_RDWR)
        } else {
            let fd = libc::memfd_create(c"fgpu-usage".as_ptr(), libc::MFD_ALLOW_SEALING);
            libc::ftruncate(fd, if kind == 2 { 4096 } else { size });
            match kind {
                2 => libc::fcntl(fd, libc::F_ADD_SEALS, grow_shrink_seal),
                3 => libc::fcntl(
                    fd,
                    libc::F_ADD_SEALS,
                    grow_shrink_seal | libc::F_SEAL_FUTURE_WRITE,
                ),
                _ => 0,
            };
            fd
        }
    };
    assert!(fd >= 0);
    let path = std::env::var("FGPU_SOCKET").expect("FGPU_SOCKET");
    let sock = std::os::unix::net::UnixStream::connect(&path).expect("connecting the agent");
    let payload = fgpu_common::proto::shim::HelloPayload {
        version: fgpu_common::proto::shim::VERSION,
        flags: fgpu_common::proto::shim::HELLO_HAS_USAGE_FD,
    }
    .encode();
    let mut frame = Vec::new();
    frame.extend_from_slice(&fgpu_common::proto::MAGIC);
    frame.extend_from_slice(&fgpu_common::proto::VERSION.to_le_bytes());
    frame.extend_from_slice(&(fgpu_common::proto::Kind::Hello as u16).to_le_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&payload);
    use std::os::fd::AsRawFd;
    // SAFETY: sendmsg with one iovec over `frame` and one SCM_RIGHTS control message holding
    // `fd`, in a buffer sized by CMSG_SPACE.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: frame.as_mut_ptr().cast(),
            iov_len: frame.len(),
        };
        let space = libc::CMSG_SPACE(4) as usize;
        let mut cbuf = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as _;
        libc::CMSG_DATA(c).cast::<i32>().write_unaligned(fd);
        assert!(libc::sendmsg(sock.as_raw_fd(), &msg, 0) > 0, "sendmsg");
    }
    let mut head = [0u8; 12];
    use std::io::Read;
    let mut r = &sock;
    r.read_exact(&mut head).expect("a reply header");
    let k = u16::from_le_bytes([head[6], head[7]]);
    let len = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
    let mut body = vec![0u8; len.min(1 << 16)];
    r.read_exact(&mut body).expect("the reply's payload");
    out(format!(
        "forged reply kind={k:#x} text={}",
        String::from_utf8_lossy(&body).replace('\n', " ")
    ));
}

/// `forge-compute MS`: a hostile tenant. It takes its cgroup's ledger (an allocation through
/// the shim), maps the usage memfd it was handed read-write, and for MS ms writes into every
/// slot and device what would keep a naive controller busy with it forever: a fresh waiting
/// and launch stamp (the heartbeat read from its read-only limits page), huge queued work,
/// measured GPU time growing with wall time — without ever launching. Prints
/// `forge done writes=N heartbeats=[..]`. `forge-compute MS 1` (quiet) writes only the
/// queued work — batches in flight that never complete, no stamps, no GPU time: a tenant
/// that sits still while its page says it is busy (to bank device time and spend it later).
/// Takes the agent's ledger (an allocation through the shim), then maps the usage part of it
/// read-write (its usage memfd, which is handed out read-write) and returns each of the
/// first 16 slots' parking records in it; `what` names the output lines.
fn own_slot_parks(what: &str) -> Vec<&'static fgpu_common::ledger::park::SlotPark> {
    use fgpu_common::ledger::park::SlotPark;
    use fgpu_common::ledger::{PAGE, SLOTS_OFFSET, Slot};
    let cuda = Cuda::open().expect("libcuda.so.1");
    let ctx = cuda.context().expect("context");
    cuda.set_current(ctx);
    out(format!("{what} alloc {:?}", cuda.alloc(64 << 20)));
    let usage = own_memfd("fgpu-usage").expect("a usage memfd from the agent");
    let size = fgpu_common::ledger::USAGE_SIZE;
    // SAFETY: a new shared mapping of our own usage memfd (it is handed out read-write).
    let u = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            usage,
            0,
        )
    };
    assert_ne!(u, libc::MAP_FAILED);
    (0..16)
        .map(|slot| {
            let at = u as usize + SLOTS_OFFSET - PAGE
                + slot * std::mem::size_of::<Slot>()
                + std::mem::offset_of!(Slot, park);
            // SAFETY: a slot's parking record inside our mapping of the usage part
            // (aligned), mapped for the rest of the process's life.
            unsafe { &*(at as *const SlotPark) }
        })
        .collect()
}

/// `forge-room MS MIB`: for MS ms asks for MIB MiB of room on device record 0 in every slot
/// it can write, bumping the request's sequence each time, though it needs nothing.
/// `forge-room done writes=N`.
fn forge_room(args: &[u64]) {
    use std::sync::atomic::Ordering::SeqCst;
    let ms = args.first().copied().unwrap_or(3000);
    let bytes = args.get(1).copied().unwrap_or(512) << 20;
    let parks = own_slot_parks("forge-room");
    let start = std::time::Instant::now();
    let mut writes = 0u64;
    while start.elapsed() < std::time::Duration::from_millis(ms) {
        for sp in &parks {
            sp.need_dev.store(0, SeqCst);
            sp.need_bytes.store(bytes, SeqCst);
            sp.need_seq.fetch_add(1, SeqCst);
            writes += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    out(format!("forge-room done writes={writes}"));
}

/// `forge-parked MS`: for MS ms says, in every slot it can write, that it holds
/// `u64::MAX` bytes of every device in host memory (it holds nothing there), then
/// `forge-parked ready` once the first round is written, and `forge-parked done
/// writes=N`.
fn forge_parked(args: &[u64]) {
    use std::sync::atomic::Ordering::SeqCst;
    let ms = args.first().copied().unwrap_or(3000);
    let parks = own_slot_parks("forge-parked");
    let start = std::time::Instant::now();
    let mut writes = 0u64;
    while start.elapsed() < std::time::Duration::from_millis(ms) {
        for sp in &parks {
            for b in &sp.parked {
                b.store(u64::MAX, SeqCst);
            }
            writes += 1;
        }
        if writes == parks.len() as u64 {
            out("forge-parked ready".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    out(format!("forge-parked done writes={writes}"));
}

fn forge_compute(args: &[u64]) {
    use fgpu_common::ledger::{DeviceTurn, Limits, MAX_DEVICES, MAX_SLOTS, PAGE, SLOTS_OFFSET};
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
    let ms = args.first().copied().unwrap_or(3000);
    let quiet = args.get(1) == Some(&1);
    let cuda = Cuda::open().expect("libcuda.so.1");
    let ctx = cuda.context().expect("context");
    cuda.set_current(ctx);
    out(format!("forge alloc {:?}", cuda.alloc(64 << 20)));
    let usage = own_memfd("fgpu-usage").expect("a usage memfd from the agent");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let limits = maps
        .lines()
        .find(|l| l.contains("memfd:fgpu-limits"))
        .and_then(|l| usize::from_str_radix(l.split('-').next()?, 16).ok())
        .expect("the limits page is mapped");
    let size = fgpu_common::ledger::USAGE_SIZE;
    // SAFETY: a new shared mapping of our own usage memfd (it is handed out read-write).
    let u = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            usage,
            0,
        )
    };
    assert_ne!(u, libc::MAP_FAILED);
    let heartbeat = |dev: usize| {
        let off = std::mem::offset_of!(Limits, turns)
            + dev * std::mem::size_of::<DeviceTurn>()
            + std::mem::offset_of!(DeviceTurn, heartbeat);
        // SAFETY: an aligned u64 inside the limits page this process has mapped.
        unsafe { &*((limits + off) as *const AtomicU64) }.load(Relaxed)
    };
    let slot_size = std::mem::size_of::<fgpu_common::ledger::Slot>();
    let compute_off = std::mem::offset_of!(fgpu_common::ledger::Slot, compute);
    let rec = std::mem::size_of::<fgpu_common::ledger::SlotCompute>();
    let start = std::time::Instant::now();
    let mut writes = 0u64;
    while start.elapsed() < std::time::Duration::from_millis(ms) {
        for slot in 0..16.min(MAX_SLOTS) {
            for dev in 0..MAX_DEVICES {
                let beat = heartbeat(dev);
                let base =
                    u as usize + SLOTS_OFFSET - PAGE + slot * slot_size + compute_off + dev * rec;
                // SAFETY: aligned fields of slot records inside our mapping of the usage part
                // (SlotCompute: wait_beat, launch_beat, inflight, queued_ns).
                unsafe {
                    if !quiet {
                        (*(base as *const AtomicU64)).store(beat, Relaxed);
                        (*((base + 8) as *const AtomicU64)).store(beat, Relaxed);
                    }
                    (*((base + 16) as *const AtomicI64)).store(1 << 40, Relaxed);
                    (*((base + 24) as *const AtomicI64)).store(i64::MAX, Relaxed);
                }
                writes += 1;
            }
        }
        // Measured GPU time that grows as fast as wall time: it looks busy, not latency-bound
        // (so it is given turns, which it then does not use).
        for dev in (0..MAX_DEVICES).filter(|_| !quiet) {
            let off = std::mem::offset_of!(fgpu_common::ledger::Usage, compute)
                + dev * std::mem::size_of::<fgpu_common::ledger::DeviceCompute>();
            // SAFETY: an aligned u64 (`DeviceCompute::gpu_ns`) inside our mapping.
            unsafe { &*((u as usize + off) as *const AtomicU64) }.fetch_add(250_000, Relaxed);
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let beats: Vec<u64> = (0..2).map(heartbeat).collect();
    out(format!("forge done writes={writes} heartbeats={beats:?}"));
}

/// Runs the client selected by FGPU_TEST_CLIENT, if any; returns false if none.
pub fn main() -> bool {
    let Ok(mode) = std::env::var("FGPU_TEST_CLIENT") else {
        return false;
    };
    let args: Vec<u64> = std::env::var("FGPU_TEST_CLIENT_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(|a| a.parse().expect("numeric client argument"))
        .collect();
    match mode.as_str() {
        "race" => race(&args),
        "fork" => fork(&args),
        "fork-fresh" => fork_fresh(&args),
        "nvml2" => nvml_lines(""),
        "rtld" => rtld(),
        "probe" => probe(),
        "watch-total" => watch_total(),
        "tamper" => tamper(),
        "forged-hello" => forged_hello(&args),
        "forge-compute" => forge_compute(&args),
        "forge-room" => forge_room(&args),
        "forge-parked" => forge_parked(&args),
        "alloc-until" => alloc_until(&args),
        other => panic!("unknown client mode {other}"),
    }
    true
}

/// `alloc-until MS FIRST_MIB MIB HOLD_MS`: an application that needs its memory and retries. Takes
/// a context and FIRST_MIB MiB (`alloc-until first ok|fail rc=R`), prints `alloc-until
/// ready`, waits for its stdin to close, then tries to allocate MIB MiB (through the shim,
/// which asks the agent for room when the device is full) every 100 ms until it has it or
/// MS ms have passed: `alloc-until ok ms=N tries=K`, or `alloc-until fail ms=N rc=R
/// tries=K`, N counted from the first try; then holds what it has for HOLD_MS ms.
fn alloc_until(args: &[u64]) {
    let ms = args.first().copied().unwrap_or(10_000);
    let first = args.get(1).copied().unwrap_or(0) << 20;
    let bytes = args.get(2).copied().unwrap_or(0) << 20;
    let hold = std::time::Duration::from_millis(args.get(3).copied().unwrap_or(0));
    let cuda = Cuda::open().expect("libcuda.so.1");
    let ctx = cuda.context().expect("context");
    cuda.set_current(ctx);
    if first > 0 {
        match cuda.alloc(first) {
            Ok(_) => out("alloc-until first ok".into()),
            Err(rc) => out(format!("alloc-until first fail rc={rc}")),
        }
    }
    out("alloc-until ready".into());
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    let start = std::time::Instant::now();
    let mut tries = 0u64;
    loop {
        tries += 1;
        let r = cuda.alloc(bytes);
        let took = start.elapsed().as_millis();
        match r {
            Ok(_) => {
                out(format!("alloc-until ok ms={took} tries={tries}"));
                break;
            }
            Err(rc) if took >= u128::from(ms) => {
                out(format!("alloc-until fail ms={took} rc={rc} tries={tries}"));
                break;
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
    std::thread::sleep(hold);
}
