//! fgpu-sim-hip's kernel commands: registration as hipcc-built programs do it, launches,
//! module launches, graphs.

use super::*;

type LaunchFn = unsafe extern "C" fn(Ptr, Dim3, Dim3, *mut Ptr, usize, Ptr) -> i32;

impl Run {
    pub(super) fn kernel(&mut self, name: &str) -> Ptr {
        if let Some((_, k)) = self.kernels.iter().find(|(n, _)| n == name) {
            return &**k as *const u8 as Ptr;
        }
        let h = &self.hip;
        if self.modules.is_null() {
            let f = dlsym(h.handle, "__hipRegisterFatBinary");
            if !f.is_null() {
                // SAFETY: __hipRegisterFatBinary(const void *) -> void **.
                let f: unsafe extern "C" fn(Ptr) -> Ptr = unsafe { std::mem::transmute(f) };
                // SAFETY: any bytes are a fat binary for the simulator.
                self.modules = unsafe { f(c"sim".as_ptr() as Ptr) };
            }
        }
        let stub = Box::new(0u8);
        let host = &*stub as *const u8 as Ptr;
        let reg = dlsym(h.handle, "__hipRegisterFunction");
        let cname = CString::new(name).unwrap_or_default();
        if !reg.is_null() {
            type Reg = unsafe extern "C" fn(
                Ptr,
                Ptr,
                *const c_char,
                *const c_char,
                u32,
                Ptr,
                Ptr,
                Ptr,
                Ptr,
                *mut i32,
            );
            // SAFETY: __hipRegisterFunction's C signature.
            let f: Reg = unsafe { std::mem::transmute(reg) };
            let n = std::ptr::null_mut();
            // SAFETY: valid module list, host stub and names.
            unsafe {
                f(
                    self.modules,
                    host,
                    cname.as_ptr(),
                    cname.as_ptr(),
                    0,
                    n,
                    n,
                    n,
                    n,
                    std::ptr::null_mut(),
                )
            };
        }
        self.kernels.push((name.into(), stub));
        host
    }

    /// The kernel launch entry point in use (`--spt`: `hipLaunchKernel_spt`).
    fn launch_fn(&self) -> Option<LaunchFn> {
        let name = if self.spt {
            "hipLaunchKernel_spt"
        } else {
            "hipLaunchKernel"
        };
        let p = self.hip.sym(name);
        // SAFETY: hipLaunchKernel(_spt)'s C signature.
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<Ptr, LaunchFn>(p) })
    }

    /// `n` launches of kernel `k` into `stream` (`--per-thread`: hipStreamPerThread for the
    /// null stream); the first error code.
    pub(super) fn launch_n(&mut self, k: Ptr, n: u64, stream: Ptr) -> i32 {
        let Some(f) = self.launch_fn() else {
            eprintln!("hipLaunchKernel not found");
            return -1;
        };
        let stream = if stream.is_null() {
            self.default_stream
        } else {
            stream
        };
        let d = Dim3 { x: 1, y: 1, z: 1 };
        for _ in 0..n {
            // SAFETY: a registered kernel, no arguments, a valid stream.
            let rc = unsafe { f(k, d, d, std::ptr::null_mut(), 0, stream) };
            if rc != 0 {
                return rc;
            }
        }
        0
    }

    pub(super) fn launch(&mut self, n: u64, name: &str) -> i32 {
        let k = self.kernel(name);
        let t = std::time::Instant::now();
        let rc = self.launch_n(k, n, std::ptr::null_mut());
        let ms = t.elapsed().as_secs_f64() * 1e3;
        out(format!(
            "launch rc={rc} n={n} kernel={name} elapsed_ms={ms:.1}"
        ));
        rc
    }

    fn device_sync(&self) -> i32 {
        call!(self.hip, "hipDeviceSynchronize", fn())
    }

    /// 10 launches + hipDeviceSynchronize, repeated for `ms` of wall time (a bounded queue,
    /// like a training loop): `launch-for ok n=N kernel=K elapsed_ms=E`.
    pub(super) fn launch_for(&mut self, ms: u64, name: &str) -> i32 {
        let k = self.kernel(name);
        let t = std::time::Instant::now();
        let mut n = 0u64;
        let rc = loop {
            let rc = self.launch_n(k, 10, std::ptr::null_mut());
            let sync = self.device_sync();
            if rc != 0 || sync != 0 {
                break if rc != 0 { rc } else { sync };
            }
            n += 10;
            if t.elapsed().as_millis() as u64 >= ms {
                break 0;
            }
        };
        let el = t.elapsed().as_secs_f64() * 1e3;
        if rc == 0 {
            out(format!(
                "launch-for ok n={n} kernel={name} elapsed_ms={el:.1}"
            ));
        } else {
            out(format!("launch-for fail rc={rc} kernel={name}"));
        }
        rc
    }

    /// `n` launches + sync, timed: `bench-launch ok ... ns_per_launch=X`.
    pub(super) fn bench_launch(&mut self, n: u64, name: &str) -> i32 {
        let k = self.kernel(name);
        let _ = self.launch_n(k, 1000.min(n), std::ptr::null_mut());
        let _ = self.device_sync();
        let t = std::time::Instant::now();
        let rc = self.launch_n(k, n, std::ptr::null_mut());
        let sync = self.device_sync();
        let secs = t.elapsed().as_secs_f64();
        if rc != 0 || sync != 0 {
            out(format!("bench-launch fail rc={rc} sync={sync}"));
            return if rc != 0 { rc } else { sync };
        }
        out(format!(
            "bench-launch ok n={n} kernel={name} ns_per_launch={:.0}",
            secs * 1e9 / n as f64
        ));
        0
    }

    /// The counters of the simulated runtime (`fgpuSimHipEventStats`): every event anyone in
    /// this process created or recorded through HIP.
    pub(super) fn event_stats(&mut self) -> i32 {
        let (mut c, mut r, mut i) = (0u64, 0u64, 0u64);
        let rc = call!(
            self.hip,
            "fgpuSimHipEventStats",
            fn(*mut u64, *mut u64, *mut u64),
            &mut c,
            &mut r,
            &mut i
        );
        out(format!(
            "event-stats rc={rc} created={c} recorded={r} into_capture={i}"
        ));
        rc
    }

    pub(super) fn ext_launch(&mut self, k: &str) -> i32 {
        let host = self.kernel(k);
        let h = &self.hip;
        let (mut a, mut b): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
        call!(h, "hipEventCreate", fn(*mut Ptr), &mut a);
        call!(h, "hipEventCreate", fn(*mut Ptr), &mut b);
        let d = Dim3 { x: 1, y: 1, z: 1 };
        let n = std::ptr::null_mut();
        let rc = call!(
            h,
            "hipExtLaunchKernel",
            fn(Ptr, Dim3, Dim3, *mut Ptr, usize, Ptr, Ptr, Ptr, i32),
            host,
            d,
            d,
            n,
            0,
            std::ptr::null_mut(),
            a,
            b,
            0
        );
        call!(h, "hipEventSynchronize", fn(Ptr), b);
        let mut ms = 0f32;
        call!(
            h,
            "hipEventElapsedTime",
            fn(*mut f32, Ptr, Ptr),
            &mut ms,
            a,
            b
        );
        out(format!("ext-launch rc={rc} ms={ms:.3}"));
        rc
    }

    pub(super) fn module_launch(&mut self, n: u64, k: &str) -> i32 {
        let t = std::time::Instant::now();
        let stream = self.default_stream;
        let h = &self.hip;
        let k = CString::new(k).unwrap_or_default();
        let (mut m, mut f): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
        let mut rc = call!(
            h,
            "hipModuleLoadData",
            fn(*mut Ptr, Ptr),
            &mut m,
            c"x".as_ptr() as Ptr
        );
        if rc == 0 {
            rc = call!(
                h,
                "hipModuleGetFunction",
                fn(*mut Ptr, Ptr, *const c_char),
                &mut f,
                m,
                k.as_ptr()
            );
        }
        let z = std::ptr::null_mut::<Ptr>();
        for _ in 0..n {
            if rc != 0 {
                break;
            }
            rc = call!(
                h,
                "hipModuleLaunchKernel",
                fn(Ptr, u32, u32, u32, u32, u32, u32, u32, Ptr, *mut Ptr, *mut Ptr),
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                z,
                z
            );
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        out(format!("module-launch rc={rc} n={n} elapsed_ms={ms:.1}"));
        rc
    }

    /// A new stream with `n` launches of `k` captured into an instantiated graph: (rc,
    /// stream, exec).
    fn capture(&mut self, n: u64, k: &str) -> (i32, Ptr, Ptr) {
        let mut s: Ptr = std::ptr::null_mut();
        call!(self.hip, "hipStreamCreate", fn(*mut Ptr), &mut s);
        let mut rc = call!(self.hip, "hipStreamBeginCapture", fn(Ptr, i32), s, 0);
        let host = self.kernel(k);
        rc |= self.launch_n(host, n, s);
        let h = &self.hip;
        let (mut g, mut e): (Ptr, Ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
        rc |= call!(h, "hipStreamEndCapture", fn(Ptr, *mut Ptr), s, &mut g);
        rc |= call!(
            h,
            "hipGraphInstantiate",
            fn(*mut Ptr, Ptr, Ptr, *mut c_char, usize),
            &mut e,
            g,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0
        );
        (rc, s, e)
    }

    fn graph_launch(&self, e: Ptr, s: Ptr) -> i32 {
        if self.spt {
            call!(self.hip, "hipGraphLaunch_spt", fn(Ptr, Ptr), e, s)
        } else {
            call!(self.hip, "hipGraphLaunch", fn(Ptr, Ptr), e, s)
        }
    }

    pub(super) fn graph(&mut self, n: u64, k: &str, replays: u64) -> i32 {
        let t = std::time::Instant::now();
        let (mut rc, s, e) = self.capture(n, k);
        for _ in 0..replays {
            rc |= self.graph_launch(e, s);
        }
        rc |= call!(self.hip, "hipStreamSynchronize", fn(Ptr), s);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        out(format!(
            "graph rc={rc} replays={replays} kernel={k} elapsed_ms={ms:.1}"
        ));
        rc
    }

    /// A graph of `n` launches replayed for `ms` of wall time (two replays, then a stream
    /// synchronisation): `graph-for ok replays=R n=N kernel=K elapsed_ms=E`.
    pub(super) fn graph_for(&mut self, ms: u64, n: u64, k: &str) -> i32 {
        let t = std::time::Instant::now();
        let (mut rc, s, e) = self.capture(n, k);
        let mut replays = 0u64;
        while rc == 0 {
            rc |= self.graph_launch(e, s);
            rc |= self.graph_launch(e, s);
            rc |= call!(self.hip, "hipStreamSynchronize", fn(Ptr), s);
            replays += 2;
            if t.elapsed().as_millis() as u64 >= ms {
                break;
            }
        }
        let el = t.elapsed().as_secs_f64() * 1e3;
        if rc == 0 {
            out(format!(
                "graph-for ok replays={replays} n={n} kernel={k} elapsed_ms={el:.1}"
            ));
        } else {
            out(format!("graph-for fail rc={rc} kernel={k}"));
        }
        rc
    }

    /// Every AMD SMI processor: UUID, VRAM total and usage (bytes and the MB of
    /// `amdsmi_get_gpu_vram_usage`).
    pub(super) fn amdsmi(&mut self) -> i32 {
        let Some(s) = self.amdsmi else {
            out("amdsmi err rc=-1".into());
            return -1;
        };
        let lib = Hip {
            handle: s,
            gpa: None,
        };
        let mut rc = call!(lib, "amdsmi_init", fn(u64), 2);
        let mut sockets = [std::ptr::null_mut::<c_void>(); 16];
        let mut n = sockets.len() as u32;
        if rc == 0 {
            rc = call!(
                lib,
                "amdsmi_get_socket_handles",
                fn(*mut u32, *mut Ptr),
                &mut n,
                sockets.as_mut_ptr()
            );
        }
        let mut d = 0;
        for &sock in &sockets[..if rc == 0 { n as usize } else { 0 }] {
            let mut procs = [std::ptr::null_mut::<c_void>(); 16];
            let mut k = procs.len() as u32;
            rc |= call!(
                lib,
                "amdsmi_get_processor_handles",
                fn(Ptr, *mut u32, *mut Ptr),
                sock,
                &mut k,
                procs.as_mut_ptr()
            );
            for &p in &procs[..k as usize] {
                let mut uuid = [0 as c_char; 64];
                let mut len = uuid.len() as u32;
                let (mut t, mut u) = (0u64, 0u64);
                let mut vram = [0u32; 4];
                let r = call!(
                    lib,
                    "amdsmi_get_gpu_device_uuid",
                    fn(Ptr, *mut u32, *mut c_char),
                    p,
                    &mut len,
                    uuid.as_mut_ptr()
                ) | call!(
                    lib,
                    "amdsmi_get_gpu_memory_total",
                    fn(Ptr, i32, *mut u64),
                    p,
                    0,
                    &mut t
                ) | call!(
                    lib,
                    "amdsmi_get_gpu_memory_usage",
                    fn(Ptr, i32, *mut u64),
                    p,
                    0,
                    &mut u
                ) | call!(
                    lib,
                    "amdsmi_get_gpu_vram_usage",
                    fn(Ptr, *mut [u32; 4]),
                    p,
                    &mut vram
                );
                // SAFETY: the library wrote a NUL-terminated string (or left zeros).
                let id = unsafe { CStr::from_ptr(uuid.as_ptr()) }.to_string_lossy();
                out(format!(
                    "amdsmi device={d} uuid={id} total={t} used={u} vram_total_mb={} \
                     vram_used_mb={} rc={r}",
                    vram[0], vram[1]
                ));
                rc |= r;
                d += 1;
            }
        }
        rc
    }
}
