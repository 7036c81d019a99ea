#!/usr/bin/env python3
"""Does a kernel take less GPU time when the GPU is busy only part of the time? (No fgpu.)

The 8192x8192 bf16 matmul of compute_share.py's matmul loop, timed with CUDA events per
kernel: (a) back to back (saturated), (b) one kernel then a host sleep, so that the GPU is
busy about 30% of the time. Prints median kernel time and the SM clock / power that
nvidia-smi reports during each. Usage: python3 duty_cycle.py [SECONDS_PER_PHASE]
"""
import statistics
import subprocess
import sys
import time

import torch

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(20):
    a @ b
torch.cuda.synchronize()


def phase(gap_s):
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                          "--format=csv,noheader,nounits", "-lms", "200"],
                         stdout=subprocess.PIPE, text=True)
    times, busy = [], 0.0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        ms = s.elapsed_time(e)
        times.append(ms)
        busy += ms / 1e3
        if gap_s is not None:
            time.sleep(ms / 1e3 * gap_s)
    wall = time.perf_counter() - t0
    p.terminate()
    out = p.communicate()[0].split("\n")
    rows = [r.split(",") for r in out if r.count(",") == 1]
    half = rows[len(rows) // 3:]  # skip the ramp
    clk = statistics.median(float(r[0]) for r in half) if half else float("nan")
    pwr = statistics.median(float(r[1]) for r in half) if half else float("nan")
    return statistics.median(times), 100 * busy / wall, clk, pwr


sat = phase(None)
duty = phase(7.0 / 3.0)  # sleep 7/3 of the kernel time: ~30% busy
print("| load | median kernel ms | GPU busy % | SM MHz | power W |")
print("|---|---|---|---|---|")
for name, r in (("back to back", sat), ("~30% duty cycle", duty)):
    print("| %s | %.3f | %.1f | %.0f | %.0f |" % (name, *r))
print("kernel time at ~30%% duty / saturated: %.3f" % (duty[0] / sat[0]))
