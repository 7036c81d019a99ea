//! Launch commands: kernels (`launch`, `launch-for`, `launch-for-each`, `bench-launch`)
//! and graphs (`graph`, `graph-for`).

use std::ffi::{CStr, CString};
use std::time::Instant;

use super::Driver;
use crate::out;

/// A module with one kernel, `empty`, that returns at once.
const EMPTY_PTX: &CStr =
    c".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry empty()\n{\n\tret;\n}\n";

impl Driver {
    pub(crate) fn function(&self, kernel: &str) -> Result<usize, i32> {
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

    pub(crate) fn launch_n(&self, func: usize, n: u64, stream: usize) -> i32 {
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

    pub(crate) fn launch(&mut self, n: u64, kernel: &str) {
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
    pub(crate) fn bench_launch(&mut self, n: u64, kernel: &str) {
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
    pub(crate) fn capture(
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
    pub(crate) fn launch_for(&mut self, ms: u64, kernel: &str) {
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
    pub(crate) fn launch_for_each(&mut self, ms: u64, kernel: &str) {
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

    /// Captures `n` launches of `kernel` into a graph, then replays it for `ms` of wall time
    /// (two replays, then a stream synchronisation), and reports how many replays ran.
    pub(crate) fn graph_for(&mut self, ms: u64, n: u64, kernel: &str) {
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

    pub(crate) fn graph(&mut self, n: u64, kernel: &str, replays: u64) {
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
}
