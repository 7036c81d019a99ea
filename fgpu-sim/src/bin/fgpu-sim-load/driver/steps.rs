//! Step loops: K launches, a synchronisation and some host time, repeated (`steps-for`,
//! `steps-threads`): training loops, decoders, CPU-bound launchers.

use std::time::{Duration, Instant};

use super::Driver;
use crate::{mono_ms, out};

impl Driver {
    /// A training or decoding loop: steps of `k` launches of `kernel`, a synchronisation and
    /// `gap_us` of host time (an optimizer step, data loading, a decoder's sampling), for `ms`
    /// of wall time. Every 100 ms a `steps-at mono_ms=T steps=N` line (T: CLOCK_MONOTONIC,
    /// the same in every PID namespace), so that rates over windows can be compared across
    /// processes; at the end `steps-for ok steps=N ... elapsed_ms=E`.
    pub(crate) fn steps_for(&mut self, ms: u64, k: u64, kernel: &str, gap_us: u64, spin_us: u64) {
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
    pub(crate) fn steps_threads(
        &mut self,
        ms: u64,
        threads: u64,
        k: u64,
        kernel: &str,
        gap_us: u64,
    ) {
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
}
