"""A stand-in inference server for the parking check (tests/gpu/park.sh, issue 29).

Holds WEIGHTS_GIB of fp16 "weights" (LAYERS matrices of 8192 x 8192, generated on the GPU
from SEED) and a 1 GiB "cache" that every request reads and updates, so that an answer
depends on every weight and on the whole history of requests (a cache lost or corrupted
across a park shows as a different answer).

Protocol: one request per stdin line (`req N`); one JSON line per answer on stdout:
  {"req": N, "first_ms": ..., "total_ms": ..., "out": sha256}
`first_ms`: from reading the request to the first result back on the host (a 16-float
embedding of the input: the "first token"); it includes the unpark when the server was
parked. `--reference` instead answers requests 0..R-1 in order right away and exits (run
without the shim, alone on the GPU: the answers to compare with).
"""

import argparse
import hashlib
import json
import sys
import time

import torch

DIM = 8192
LAYER_BYTES = DIM * DIM * 2
CACHE_ROWS = (1 << 30) // (DIM * 2)


def build(seed, weights_gib):
    layers = int(weights_gib * (1 << 30) // LAYER_BYTES)
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    ws = []
    for _ in range(layers):
        w = torch.randn(DIM, DIM, device="cuda", dtype=torch.float16, generator=g)
        w.mul_(1.0 / DIM**0.5)
        ws.append(w)
    cache = torch.zeros(CACHE_ROWS, DIM, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    return ws, cache


def answer(ws, cache, seed, n):
    """Request n: an input from (seed, n); the first token; a pass over every layer; the
    cache row n mod CACHE_ROWS written; the answer's hash. Returns (first_ms, hash)."""
    t0 = time.perf_counter()
    g = torch.Generator(device="cpu")
    g.manual_seed(seed * 100003 + n)
    x = torch.randn(16, DIM, generator=g).to("cuda", torch.float16)
    first = (x[0, :16] * 2).float().cpu()  # the first token: needs the GPU back
    first_ms = (time.perf_counter() - t0) * 1000
    row = n % CACHE_ROWS
    x = x + cache[row].unsqueeze(0)
    for w in ws:
        x = torch.tanh(x @ w)
    cache[row] = x[0]
    cache[(row + 1) % CACHE_ROWS] += x[1]
    out = x.float().cpu().numpy().tobytes() + first.numpy().tobytes()
    return first_ms, hashlib.sha256(out).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--weights-gib", type=float, required=True)
    ap.add_argument("--reference", type=int, default=0, metavar="R")
    ap.add_argument("--pace-ms", type=float, default=0,
                    help="with --reference: host time between requests (as a paced client's)")
    a = ap.parse_args()
    t = time.perf_counter()
    ws, cache = build(a.seed, a.weights_gib)
    load_ms = (time.perf_counter() - t) * 1000
    if a.reference:
        outs = []
        for n in range(a.reference):
            if a.pace_ms and n:
                time.sleep(a.pace_ms / 1000)
            t = time.perf_counter()
            first_ms, h = answer(ws, cache, a.seed, n)
            outs.append({"req": n, "out": h, "first_ms": round(first_ms, 1),
                         "total_ms": round((time.perf_counter() - t) * 1000, 1)})
        print(json.dumps({"seed": a.seed, "load_ms": round(load_ms), "answers": outs}), flush=True)
        return
    print(json.dumps({"ready": True, "load_ms": round(load_ms),
                      "reserved": torch.cuda.memory_reserved()}), flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] != "req":
            continue
        n = int(parts[1])
        t = time.perf_counter()
        first_ms, h = answer(ws, cache, a.seed, n)
        print(json.dumps({"req": n, "first_ms": round(first_ms, 1),
                          "total_ms": round((time.perf_counter() - t) * 1000, 1), "out": h}),
              flush=True)


if __name__ == "__main__":
    main()
