#!/usr/bin/env python3
"""NVML's per-process SM utilisation as it comes (compute_real.sh NVML=1):

    nvml_probe.py OUT.jsonl [--every-ms 20]

Polls nvmlDeviceGetProcessUtilization on every GPU with the newest timestamp seen, and writes
one JSON line per new sample: {"t": host wall time of the poll, "gpu", "pid" (host PID),
"ts": NVML's sample timestamp (s), "sm": smUtil %, "cg": the process's cgroup}. Tells how
often NVML samples per-process utilisation on this driver and what a workload's busy share is.
Runs until killed.
"""

import ctypes
import json
import sys
import time


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("ts", ctypes.c_ulonglong), ("sm", ctypes.c_uint),
                ("mem", ctypes.c_uint), ("enc", ctypes.c_uint), ("dec", ctypes.c_uint)]


def cgroup_of(pid, cache):
    if pid not in cache:
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                cache[pid] = f.read().strip().split("::")[-1]
        except OSError:
            cache[pid] = "?"
    return cache[pid]


def main():
    out = open(sys.argv[1], "a", buffering=1)
    every = float(sys.argv[sys.argv.index("--every-ms") + 1]) / 1000 if "--every-ms" in sys.argv else 0.02
    nv = ctypes.CDLL("libnvidia-ml.so.1")
    if nv.nvmlInit_v2() != 0:
        raise SystemExit("nvmlInit failed")
    n = ctypes.c_uint()
    nv.nvmlDeviceGetCount_v2(ctypes.byref(n))
    handles = []
    for i in range(n.value):
        h = ctypes.c_void_p()
        nv.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
        handles.append(h)
    last = [0] * len(handles)
    cache = {}
    buf = (Sample * 64)()
    errors = {}
    while True:
        now = time.time()
        for i, h in enumerate(handles):
            # The size query first (as NVML's documentation asks: a NULL buffer gives the
            # count); the first H200 run, which skipped it, got no samples at all.
            cnt = ctypes.c_uint(0)
            nv.nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(cnt), ctypes.c_ulonglong(last[i]))
            if cnt.value == 0:
                continue
            cnt = ctypes.c_uint(min(cnt.value, 64))
            rc = nv.nvmlDeviceGetProcessUtilization(h, buf, ctypes.byref(cnt), ctypes.c_ulonglong(last[i]))
            if rc != 0:
                errors[rc] = errors.get(rc, 0) + 1
                if errors[rc] == 1:
                    print(f"nvml_probe: nvmlDeviceGetProcessUtilization returned {rc}", file=sys.stderr)
                continue
            for s in buf[: cnt.value]:
                if s.ts <= last[i]:
                    continue
                out.write(json.dumps({"t": round(now, 3), "gpu": i, "pid": s.pid, "ts": s.ts / 1e6,
                                      "sm": s.sm, "cg": cgroup_of(s.pid, cache)}) + "\n")
            if cnt.value:
                last[i] = max(last[i], max(s.ts for s in buf[: cnt.value]))
        time.sleep(every)


if __name__ == "__main__":
    main()
