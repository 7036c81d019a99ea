"""What the launch gate's driver calls cost on this machine's real driver (no shim needed):
each call the gate makes, timed in a loop, and a decoder-like step (35 empty-kernel launches
then a stream sync) bare and with the calls the gate adds at the first launch after a pause
(capture-mode exchange, stream query, is-capturing, a timing event record).
  python3 gate_calls.py [--steps-only] [--label L]
Under the shim (LD_PRELOAD=libfgpu.so FGPU_COMPUTE_SHARE=99) --steps-only times the gated
step as the gate really runs it. One line per figure: `CALL name ns_per_call` / `STEP ...`."""
import argparse
import ctypes
import time

EMPTY_PTX = b""".version 7.0
.target sm_50
.address_size 64
.visible .entry fgpu_empty() { ret; }
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps-only", action="store_true")
    ap.add_argument("--label", default="bare")
    ap.add_argument("--steps", type=int, default=3000)
    a = ap.parse_args()
    import torch

    torch.zeros(1, device="cuda")
    cu = ctypes.CDLL("libcuda.so.1")
    vp, u = ctypes.c_void_p, ctypes.c_uint
    mod, fn = vp(), vp()
    assert cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(EMPTY_PTX)) == 0
    assert cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"fgpu_empty") == 0
    launch = cu.cuLaunchKernel
    launch.argtypes = [vp] + [u] * 7 + [vp] * 3
    one = u(1)
    ev, ev2 = vp(), vp()
    assert cu.cuEventCreate(ctypes.byref(ev), 0) == 0
    assert cu.cuEventCreate(ctypes.byref(ev2), 0) == 0
    st, mode, ctx, ms = ctypes.c_int(), ctypes.c_int(2), vp(), ctypes.c_float()

    def timeit(name, f, n=20000):
        f()
        t = time.perf_counter_ns()
        for _ in range(n):
            f()
        ns = (time.perf_counter_ns() - t) / n
        print(f"CALL {a.label} {name} {ns:.0f}", flush=True)

    if not a.steps_only:
        # What a call through ctypes costs by itself (a libc function that does nothing
        # much), then the calls the gate makes on every gated launch: cuCtxGetCurrent (the
        # default streams' key) and the host clock (one reading a launch; on a VM whose
        # clocksource the vDSO cannot read, each is a system call — compare the two lines).
        libc = ctypes.CDLL(None, use_errno=True)
        ts = (ctypes.c_long * 2)()
        timeit("ctypes-baseline(libc labs)", lambda: libc.labs(1))
        timeit("cuCtxGetCurrent", lambda: cu.cuCtxGetCurrent(ctypes.byref(ctx)))
        timeit("clock_gettime(MONOTONIC, vDSO)", lambda: libc.clock_gettime(1, ts))
        timeit("clock_gettime(MONOTONIC, syscall)", lambda: libc.syscall(228, 1, ts))
        try:
            cs = open("/sys/devices/system/clocksource/clocksource0/current_clocksource").read().strip()
        except OSError:
            cs = "unknown"
        print(f"CLOCKSOURCE {a.label} {cs}", flush=True)
        timeit("cuStreamQuery(idle legacy)", lambda: cu.cuStreamQuery(None))
        timeit("cuStreamIsCapturing", lambda: cu.cuStreamIsCapturing(None, ctypes.byref(st)))
        timeit("cuThreadExchangeStreamCaptureMode", lambda: cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)))
        cu.cuEventRecord(ev, None)
        cu.cuCtxSynchronize()
        timeit("cuEventQuery(done)", lambda: cu.cuEventQuery(ev))
        cu.cuEventRecord(ev2, None)
        cu.cuCtxSynchronize()
        timeit("cuEventElapsedTime", lambda: cu.cuEventElapsedTime(ctypes.byref(ms), ev, ev2))
        timeit("cuEventRecord(timing, idle stream)", lambda: cu.cuEventRecord(ev, None), 5000)
        cu.cuCtxSynchronize()
        timeit("cuLaunchKernel(empty)", lambda: launch(fn, one, one, one, one, one, one, 0, None, None, None), 5000)
        cu.cuCtxSynchronize()

    def step_bare():
        for _ in range(35):
            launch(fn, one, one, one, one, one, one, 0, None, None, None)
        cu.cuStreamSynchronize(None)

    def step_gate_calls():
        cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
        cu.cuStreamQuery(None)
        cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
        cu.cuStreamIsCapturing(None, ctypes.byref(st))
        cu.cuEventRecord(ev, None)
        for _ in range(35):
            launch(fn, one, one, one, one, one, one, 0, None, None, None)
        cu.cuStreamSynchronize(None)

    variants = [("35 launches + sync", step_bare)]
    if not a.steps_only:
        variants.append(("the gate's calls + 35 launches + sync", step_gate_calls))
    for _ in range(2):
        for name, f in variants:
            for _ in range(200):
                f()
            t = time.perf_counter_ns()
            for _ in range(a.steps):
                f()
            us = (time.perf_counter_ns() - t) / a.steps / 1000
            print(f"STEP {a.label} {name} {us:.1f} us", flush=True)


if __name__ == "__main__":
    main()
