#!/usr/bin/env python3
"""Everyday GPU workloads for the compute-share checks on a real GPU (compute_real.sh).

    workloads.py ROLE --seconds S --warmup W [--ready FILE --go FILE]

Roles (PyTorch, bf16, synthetic data on the GPU):
  cnn      ResNet-18 training step (torchvision, cuDNN, channels_last, batch 64 at 224x224,
           SGD) with `loss.item()` every step, as training loops that log the loss do: the
           GPU idles while Python launches the next step (host gaps).
  attn     flash attention (F.scaled_dot_product_attention, B=4 H=16 L=4096 D=128, causal),
           forward + backward, two steps in flight at most.
  graph    a CUDA graph of 10 x (4096^2 matmul + add_) replayed, two replays in flight.
  matmul   one 8192^2 matmul per step, 20 in flight at most (the issue-6 loop).
  decoder  token-by-token decoding at batch 1: embedding, 8 MLP blocks (2048 -> 8192 ->
           2048), a 32000-way head, argmax and `.item()` per token (it waits for every token,
           like a server streaming tokens): little GPU work per step, latency-bound.

Each worker builds and warms its step, writes --ready, waits for the shared start time in
--go, runs W s at full speed (warm-up, not counted), then S measured seconds, and prints one
line `RESULT {json}`: role, iterations, seconds, per_s, t_start, t_end (wall clock),
progress (a [time, iterations] sample every 100 ms, for rates over windows), pid.
"""

import argparse
import json
import os
import sys
import time


def barrier(ready, go, timeout=150.0):
    with open(ready, "w") as f:
        f.write(str(os.getpid()))
    deadline = time.time() + timeout
    # The start time, once the file holds one whole (a writer that does not rename a
    # finished file into place may be seen half-written: read again).
    while True:
        try:
            with open(go) as f:
                return float(f.read().strip())
        except (OSError, ValueError):
            pass
        if time.time() > deadline:
            raise SystemExit(f"no start signal ({go}) within {timeout:.0f} s")
        time.sleep(0.005)


def build(role):
    """(step, in_flight): step() queues one iteration; in_flight = how many may be queued
    (0: step() waits for its own result)."""
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    dev = "cuda"
    if role == "cnn":
        import torchvision

        model = torchvision.models.resnet18(num_classes=1000).to(dev, torch.bfloat16)
        model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(64, 3, 224, 224, device=dev, dtype=torch.bfloat16).to(
            memory_format=torch.channels_last
        )
        y = torch.randint(0, 1000, (64,), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss.item()

        return step, 0
    if role == "attn":
        q, k, v = (
            torch.randn(4, 16, 4096, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )

        def step():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.sum().backward()

        return step, 2
    if role == "graph":
        a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
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
        return g.replay, 2
    if role == "matmul":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        return (lambda: torch.matmul(a, b, out=c)), 20
    if role == "decoder":
        d, h, vocab = 2048, 8192, 32000
        emb = torch.randn(vocab, d, device=dev, dtype=torch.bfloat16) * 0.02
        layers = [
            (
                torch.randn(d, h, device=dev, dtype=torch.bfloat16) * 0.02,
                torch.randn(h, d, device=dev, dtype=torch.bfloat16) * 0.02,
            )
            for _ in range(8)
        ]
        head = torch.randn(d, vocab, device=dev, dtype=torch.bfloat16) * 0.02
        state = {"tok": 1}

        def step():
            with torch.no_grad():
                x = emb[state["tok"]].unsqueeze(0)
                for w1, w2 in layers:
                    x = x + F.gelu(x @ w1) @ w2
                state["tok"] = int((x @ head).argmax().item())

        return step, 0
    if role == "tiny":
        # 100 elementwise ops on a one-element tensor, then a sync: PyTorch's launch path.
        x = torch.zeros(1, device=dev)

        def step():
            for _ in range(100):
                x.add_(1.0)
            torch.cuda.synchronize()

        return step, 0
    if role == "launches":
        return driver_launches(), 0
    raise SystemExit(f"unknown role {role}")


EMPTY_PTX = b""".version 7.0
.target sm_50
.address_size 64
.visible .entry fgpu_empty() { ret; }
"""


def driver_launches():
    """1000 launches of an empty kernel through the driver API (ctypes: the exported
    cuLaunchKernel, as a dlsym client reaches it), then a context sync: the host cost of a
    launch, gate included."""
    import ctypes

    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context, current on this thread
    cu = ctypes.CDLL("libcuda.so.1")
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    rc = cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(EMPTY_PTX))
    rc = rc or cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"fgpu_empty")
    if rc:
        raise SystemExit(f"cuModuleLoadData/GetFunction: {rc}")
    launch, sync = cu.cuLaunchKernel, cu.cuCtxSynchronize
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    one = ctypes.c_uint(1)

    def step():
        for _ in range(1000):
            launch(fn, one, one, one, one, one, one, 0, None, None, None)
        sync()

    return step


def run(step, in_flight, seconds, progress, trace=None):
    """Runs step() for `seconds`; with in_flight > 0, at most that many steps queued (an
    event per step); `trace` (a list) gets the wall time after every step. Returns
    (iterations, seconds)."""
    import torch

    torch.cuda.synchronize()
    events = []
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    next_sample = 0.0
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        if progress is not None and now - t0 >= next_sample:
            progress.append([round(time.time(), 3), n])
            next_sample += 0.1
        step()
        n += 1
        if trace is not None:
            trace.append(time.time())
        if in_flight:
            e = torch.cuda.Event()
            e.record()
            events.append(e)
            if len(events) > in_flight:
                events.pop(0).synchronize()
    torch.cuda.synchronize()
    return n, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--ready")
    ap.add_argument("--go")
    ap.add_argument("--trace", help="write the wall time after every measured step (JSON)")
    args = ap.parse_args()
    step, in_flight = build(args.role)
    for _ in range(5):
        step()
    import torch

    torch.cuda.synchronize()
    start_at = barrier(args.ready, args.go) if args.go else time.time()
    time.sleep(max(0.0, start_at - time.time()))
    late = round(time.time() - start_at, 3)
    if args.warmup > 0:
        run(step, in_flight, args.warmup, None)
    progress = []
    trace = [] if args.trace else None
    import resource

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t_start = time.time()
    n, secs = run(step, in_flight, args.seconds, progress, trace)
    t_end = time.time()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    # The process's CPU time (all threads) and context switches over the measured run.
    cpu = {"cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 3),
           "nvcsw": r1.ru_nvcsw - r0.ru_nvcsw, "nivcsw": r1.ru_nivcsw - r0.ru_nivcsw}
    if args.trace:
        with open(args.trace, "w") as f:
            json.dump([round(t, 6) for t in trace], f)
    print("RESULT " + json.dumps({
        "role": args.role, "iterations": n, "seconds": secs, "per_s": n / secs,
        "t_start": t_start, "t_end": t_end, "late_s": late, "pid": os.getpid(), **cpu,
        "progress": progress,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
