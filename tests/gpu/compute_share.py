#!/usr/bin/env python3
"""Compute caps of libfgpu.so on a real GPU (driven by compute_share.sh; see docs/compute.md).

Steps (each worker is a separate process with its own timeout):
  (i)   matmul loop alone, no shim: iterations/s (the reference); graph replay loop alone too
  (ii)  matmul loop, FGPU_COMPUTE_SHARE=30: achieved fraction of (i)      target 30 +- 5
  (iii) graph replay loop, FGPU_COMPUTE_SHARE=50: fraction of its (i)     target 50 +- 5
  (iv)  LD_PRELOAD, no limit: matmul throughput >= 99% of (i); a launch-bound loop of tiny
        kernels with and without the shim (docs/design.md section 7: <= 1% overhead)
  (v)   two matmul loops at once without fgpu (the driver's own time-slicing), for comparison
  (vi)  two matmul loops at once, one FGPU_COMPUTE_SHARE=30, one unlimited: the capped one's
        fraction (<= 35 expected; the event-measured GPU time includes time-slices given to
        the neighbour, so the cap errs on the low side)
Results: PASS/FAIL lines, a table last; details in OUT/compute_share.json.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def emit(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


# ---- workers (run as `compute_share.py --worker ROLE ...`) ----------------------------------


def throttled_loop(step, seconds, start_at, batch=10, inflight=2):
    """Runs step() until `seconds` have passed (after start_at), keeping at most `inflight`
    batches of `batch` steps queued (events, no bubbles). Returns (iterations, seconds)."""
    import torch

    if start_at:
        time.sleep(max(0.0, start_at - time.time()))
    torch.cuda.synchronize()
    events = []
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        for _ in range(batch):
            step()
        n += batch
        e = torch.cuda.Event()
        e.record()
        events.append(e)
        if len(events) > inflight:
            events.pop(0).synchronize()
    torch.cuda.synchronize()
    return n, time.perf_counter() - t0


def worker(role, seconds, start_at):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    if role == "matmul":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)

        def step():
            torch.matmul(a, b, out=c)

        for _ in range(20):
            step()
        n, secs = throttled_loop(step, seconds, start_at)
    elif role == "graph":
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                torch.matmul(a, b, out=c)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(10):
                torch.matmul(a, b, out=c)
                c.add_(1.0)
        for _ in range(5):
            g.replay()
        n, secs = throttled_loop(g.replay, seconds, start_at, batch=2)
    elif role == "tiny":
        x = torch.zeros(1, device="cuda")
        for _ in range(1000):
            x.add_(1)
        n, secs = throttled_loop(lambda: x.add_(1), seconds, start_at, batch=100, inflight=4)
    else:
        raise SystemExit(f"unknown role {role}")
    emit(role=role, iterations=n, seconds=secs, per_s=n / secs)


# ---- driver -----------------------------------------------------------------------------------


class Runner:
    def __init__(self, shim, out, seconds):
        self.shim, self.out, self.seconds = shim, out, seconds
        self.records = []

    def env(self, preload, **extra):
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("FGPU_") or k == "LD_PRELOAD":
                del e[k]
        if preload:
            e["LD_PRELOAD"] = self.shim
            e["FGPU_LOG"] = "info"
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def start(self, role, env, start_at=0.0, seconds=None):
        cmd = [sys.executable, HERE, "--worker", role, "--seconds", str(seconds or self.seconds),
               "--start-at", str(start_at)]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def finish(self, p, label, timeout=90):
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            se += "\n(timed out)"
        res = None
        for line in so.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
        gate = [l for l in se.splitlines() if "compute gate" in l or "FGPU_COMPUTE" in l
                or "compute capped" in l]
        self.records.append({"label": label, "rc": p.returncode, "result": res,
                             "gate": gate, "stderr_tail": se[-2000:]})
        if res is None:
            print(f"  {label}: no result (rc {p.returncode}): {se[-500:]}", flush=True)
        return res

    def one(self, label, role, preload, seconds=None, **extra):
        return self.finish(self.start(role, self.env(preload, **extra), seconds=seconds), label)

    def pair(self, label, a, b):
        """Two workers at once (a, b: (role, preload, extra)); both start timing together."""
        start_at = time.time() + 20
        ps = [self.start(role, self.env(pre, **ex), start_at=start_at) for role, pre, ex in (a, b)]
        return [self.finish(p, f"{label} #{i}") for i, p in enumerate(ps)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--start-at", type=float, default=0.0)
    ap.add_argument("--shim")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.seconds, args.start_at)
        return 0

    r = Runner(args.shim, args.out, args.seconds)
    rows, fails = [], 0

    def check(name, ok, figure, target):
        nonlocal fails
        fails += 0 if ok else 1
        print(f"{'PASS' if ok else 'FAIL'}: {name}: {figure} (target {target})", flush=True)
        rows.append((name, figure, target, "PASS" if ok else "FAIL"))

    def rate(res):
        return res["per_s"] if res else float("nan")

    # (i) + (iv): references and the no-limit shim, interleaved, best of two each.
    bare, shim = [], []
    for _ in range(2):
        bare.append(rate(r.one("(i) matmul alone, no shim", "matmul", False)))
        shim.append(rate(r.one("(iv) matmul, LD_PRELOAD, no limit", "matmul", True)))
    ref, pre = max(bare), max(shim)
    check("(i) matmul alone, no shim", ref == ref, f"{ref:.1f} it/s", "reference")
    check("(iv) matmul with shim, no limit", pre >= 0.99 * ref,
          f"{100 * pre / ref:.1f}% of (i)", ">= 99%")
    tb, ts = [], []
    for _ in range(2):
        tb.append(rate(r.one("(iv) tiny kernels, no shim", "tiny", False, seconds=3)))
        ts.append(rate(r.one("(iv) tiny kernels, LD_PRELOAD, no limit", "tiny", True, seconds=3)))
    check("(iv) launch-bound loop with shim, no limit", max(ts) >= 0.99 * max(tb),
          f"{max(ts):.0f} vs {max(tb):.0f} launches/s ({100 * max(ts) / max(tb):.1f}%)", ">= 99%")
    gref = rate(r.one("(i) graph replays alone, no shim", "graph", False))
    check("(i) graph replays alone, no shim", gref == gref, f"{gref:.1f} replays/s", "reference")

    # (ii) cap 30 on matmul, (iii) cap 50 on graph replays.
    res = r.one("(ii) matmul, FGPU_COMPUTE_SHARE=30", "matmul", True, FGPU_COMPUTE_SHARE=30)
    frac = 100 * rate(res) / ref
    check("(ii) matmul at FGPU_COMPUTE_SHARE=30", abs(frac - 30) <= 5, f"{frac:.1f}%", "30 +- 5")
    res = r.one("(iii) graph replays, FGPU_COMPUTE_SHARE=50", "graph", True, FGPU_COMPUTE_SHARE=50)
    frac = 100 * rate(res) / gref
    check("(iii) graph replays at FGPU_COMPUTE_SHARE=50", abs(frac - 50) <= 5, f"{frac:.1f}%",
          "50 +- 5")

    # (v) two tenants without fgpu; (vi) capped next to unlimited.
    a, b = r.pair("(v) two matmul loops, no fgpu", ("matmul", False, {}), ("matmul", False, {}))
    fa, fb = 100 * rate(a) / ref, 100 * rate(b) / ref
    check("(v) two tenants, driver time-slicing", True, f"{fa:.1f}% + {fb:.1f}% = {fa + fb:.1f}%",
          "comparison")
    a, b = r.pair("(vi) cap 30 next to unlimited", ("matmul", True, {"FGPU_COMPUTE_SHARE": 30}),
                  ("matmul", False, {}))
    fa, fb = 100 * rate(a) / ref, 100 * rate(b) / ref
    check("(vi) capped 30 next to an unlimited tenant", fa <= 35,
          f"capped {fa:.1f}%, unlimited {fb:.1f}%, total {fa + fb:.1f}%", "capped <= 35")

    with open(os.path.join(args.out, "compute_share.json"), "w") as f:
        json.dump({"rows": rows, "runs": r.records}, f, indent=1)
    print("\n| step | figure | target | |\n|---|---|---|---|")
    for name, figure, target, verdict in rows:
        print(f"| {name} | {figure} | {target} | {verdict} |")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
