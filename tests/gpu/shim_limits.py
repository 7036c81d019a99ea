#!/usr/bin/env python3
"""libfgpu.so memory limits and overhead on a real GPU (issue 4). Run through shim_limits.sh.

Every check runs in child processes of this script (``--child ROLE``), each with a timeout;
the parent observes them from outside with nvidia-smi (without the shim, so it sees the real
per-process usage). Results: one PASS/FAIL line per check with figures, details as JSON in
$OUT (or --out), and a table at the end. Exit status 1 if any check failed.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

GIB = 1 << 30
MIB = 1 << 20
LIMIT = 8 * GIB
LIMIT_ENV = "8GiB"
SMI = "/usr/local/nvidia/bin/nvidia-smi"
HERE = os.path.abspath(__file__)


# --------------------------------------------------------------------------- children


def emit(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def hold():
    """Tell the parent we are ready to be observed, wait until it says go (max 90 s)."""
    print("HOLD", flush=True)
    signal.alarm(90)
    sys.stdin.readline()


def child_torch_oom(alloc_conf):
    import torch

    free, total = torch.cuda.mem_get_info()
    tensors, err = [], None
    try:
        for _ in range(200):
            tensors.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
            torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:  # the exact type the issue asks for
        err = "OutOfMemoryError: " + str(e).splitlines()[0][:200]
    except Exception as e:  # noqa: BLE001 - reported as a failure
        err = "OTHER %s: %s" % (type(e).__name__, str(e)[:200])
    emit(
        alloc_conf=alloc_conf,
        total=total,
        free=free,
        tensors=len(tensors),
        error=err,
        reserved=torch.cuda.memory_reserved(),
    )
    hold()


def child_torch_hold(gib):
    import torch

    t = torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    emit(allocated=t.numel())
    hold()


def child_jax():
    import jax
    import jax.numpy as jnp

    x = jnp.ones(16).block_until_ready()
    stats = jax.devices()[0].memory_stats() or {}
    emit(bytes_limit=stats.get("bytes_limit"), sum=float(x.sum()))
    hold()


def child_cupy():
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    emit(free=free, total=total, device_total=cupy.cuda.Device(0).mem_info[1])


def child_numba():
    from numba import cuda

    free, total = cuda.current_context().get_memory_info()
    emit(free=free, total=total)


def child_cupy_bench():
    import cupy

    k = cupy.RawKernel(r'extern "C" __global__ void k() {}', "k")
    k((1,), (1,), ())
    cupy.cuda.Device(0).synchronize()
    best = 0.0
    for _ in range(3):
        n = 100000
        t = time.perf_counter()
        for _ in range(n):
            k((1,), (1,), ())
        cupy.cuda.Device(0).synchronize()
        best = max(best, n / (time.perf_counter() - t))
    rt = cupy.cuda.runtime
    for _ in range(100):
        rt.free(rt.malloc(MIB))
    pair = 1e9
    for _ in range(3):
        n = 5000
        t = time.perf_counter()
        for _ in range(n):
            rt.free(rt.malloc(MIB))
        pair = min(pair, (time.perf_counter() - t) / n * 1e6)
    emit(launches_per_s=best, alloc_free_pair_us=pair)


def child_torch_train():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    y = torch.randn(256, 1024, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(50):
        step()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        n = 300
        t = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e3)
    emit(step_ms=best)


CHILDREN = {
    "torch_oom": lambda a: child_torch_oom(a[0] if a else ""),
    "torch_hold": lambda a: child_torch_hold(float(a[0])),
    "jax": lambda a: child_jax(),
    "cupy": lambda a: child_cupy(),
    "numba": lambda a: child_numba(),
    "cupy_bench": lambda a: child_cupy_bench(),
    "torch_train": lambda a: child_torch_train(),
}


# --------------------------------------------------------------------------- parent


class Ctx:
    def __init__(self, shim, out):
        self.shim, self.out = shim, out
        self.rows, self.details, self.n = [], {}, 0

    def env(self, shim=True, **extra):
        e = dict(os.environ)
        for k in ("LD_PRELOAD", "FGPU_MEMORY_LIMIT", "GPU_MEM_LIMIT_GB", "PYTORCH_CUDA_ALLOC_CONF"):
            e.pop(k, None)
        if shim:
            self.n += 1
            e["LD_PRELOAD"] = self.shim
            e["FGPU_MEMORY_LIMIT"] = LIMIT_ENV
            e["FGPU_LEDGER"] = "/dev/shm/fgpu-gpu-test-%d-%d" % (os.getpid(), self.n)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def record(self, name, ok, figures, detail):
        self.rows.append((name, "PASS" if ok else "FAIL", figures))
        self.details[name] = detail
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, figures), flush=True)


def result_of(text):
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return None


def run_child(role, args, env, timeout):
    """Runs a child to completion: (result dict or None, stdout+stderr tail)."""
    cmd = [sys.executable, HERE, "--child", role] + list(args)
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        text = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        text = "TIMEOUT after %ss\n%s%s" % (
            timeout,
            (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""),
            (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""),
        )
    return result_of(text), text[-4000:]


class Held:
    """A child stopped at HOLD, to be observed; release() lets it exit."""

    def __init__(self, role, args, env, timeout):
        cmd = [sys.executable, HERE, "--child", role] + list(args)
        self.p = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        self.lines, self.result = [], None
        deadline = time.time() + timeout
        # readline blocks; the child's own alarm and our kill bound it.
        import threading

        timer = threading.Timer(timeout, self.p.kill)
        timer.start()
        try:
            for line in self.p.stdout:
                self.lines.append(line)
                if line.startswith("RESULT "):
                    self.result = json.loads(line[7:])
                if line.strip() == "HOLD" or time.time() > deadline:
                    break
        finally:
            timer.cancel()

    def release(self):
        try:
            self.p.stdin.write("go\n")
            self.p.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass
        try:
            rest, _ = self.p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rest, _ = self.p.communicate()
        return "".join(self.lines) + (rest or "")


def smi_process_mib():
    """Real per-process GPU memory (MiB) by pid, from nvidia-smi without the shim."""
    try:
        p = subprocess.run(
            [SMI, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    usage = {}
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            usage[int(parts[0])] = int(parts[1])
    return usage


def check_torch_oom(c, label, alloc_conf):
    extra = {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf} if alloc_conf else {}
    h = Held("torch_oom", [alloc_conf], c.env(**extra), timeout=120)
    used = smi_process_mib().get(h.p.pid)
    text = h.release()
    r = h.result or {}
    oom = (r.get("error") or "").startswith("OutOfMemoryError")
    ok = oom and used is not None and used <= LIMIT // MIB and r.get("tensors", 0) >= 5
    figures = "tensors=%s nvml_process=%sMiB limit=%dMiB error=%s" % (
        r.get("tensors"), used, LIMIT // MIB, (r.get("error") or "none")[:60])
    if not alloc_conf:
        total_ok = r.get("total") == LIMIT
        c.record("torch mem_get_info total == 8GiB", total_ok,
                 "total=%s free=%s" % (r.get("total"), r.get("free")), text)
    c.record("torch OOM before 8GiB (%s)" % label, ok, figures, text)


def check_jax(c):
    h = Held("jax", [], c.env(), timeout=120)
    used = smi_process_mib().get(h.p.pid)
    text = h.release()
    r = h.result or {}
    want = int(0.75 * LIMIT)
    ok = used is not None and want // MIB <= used <= LIMIT // MIB
    c.record("JAX preallocates 75% of 8GiB", ok,
             "nvml_process=%sMiB expected>=%dMiB bytes_limit=%s" % (used, want // MIB, r.get("bytes_limit")),
             text)


def check_simple(c, role, name):
    r, text = run_child(role, [], c.env(), timeout=90)
    r = r or {}
    c.record(name, r.get("total") == LIMIT, "total=%s free=%s" % (r.get("total"), r.get("free")), text)


def check_smi(c):
    try:
        p = subprocess.run([SMI, "--query-gpu=memory.total,memory.used", "--format=csv,noheader"],
                           env=c.env(), capture_output=True, text=True, timeout=60)
        text = p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        text = "nvidia-smi failed: %r" % e
    first = text.splitlines()[0] if text.strip() else ""
    c.record("nvidia-smi under the shim shows 8192MiB", first.startswith("8192 MiB"), first, text)


def check_two(c):
    env = c.env()  # both processes share this ledger: one container
    a = Held("torch_hold", ["3"], env, timeout=120)
    b = Held("torch_oom", [""], env, timeout=120)
    usage = smi_process_mib()
    ua, ub = usage.get(a.p.pid), usage.get(b.p.pid)
    tb, ta = b.release(), a.release()
    rb = b.result or {}
    total = (ua or 0) + (ub or 0)
    ok = ua is not None and ub is not None and total <= LIMIT // MIB and \
        (rb.get("error") or "").startswith("OutOfMemoryError")
    c.record("two processes stay under one limit", ok,
             "A=%sMiB B=%sMiB sum=%dMiB limit=%dMiB B_tensors=%s" % (ua, ub, total, LIMIT // MIB, rb.get("tensors")),
             ta + "\n----\n" + tb)


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def native_launch_rate(c, shim, n=200000):
    """Empty-kernel launches per second from a native client (fgpu-sim-load, which reaches
    the real driver like the CUDA runtime does): no Python in the loop."""
    load = os.path.join(os.path.dirname(os.path.dirname(c.shim)), "sim", "fgpu-sim-load")
    lib = os.environ.get("LIBCUDA", "/usr/local/nvidia/lib64/libcuda.so.1")
    p = subprocess.run([load, "--lib", lib, "bench-launch", str(n), "empty"], env=c.env(shim=shim),
                       capture_output=True, text=True, timeout=60)
    for line in p.stdout.splitlines():
        if line.startswith("bench-launch ok"):
            return float(line.split("launches_per_s=")[1].split()[0])
    raise RuntimeError("bench-launch failed: " + (p.stdout + p.stderr)[-300:])


def check_native_launch(c, rounds=5):
    rates = {"without": [], "with": []}
    for _ in range(rounds):
        for mode in ("without", "with"):
            rates[mode].append(native_launch_rate(c, mode == "with"))
    l0, l1 = _median(rates["without"]), _median(rates["with"])
    diff = (l0 - l1) / l0 * 100
    c.record("native empty-kernel launch rate (<=1% slower)", diff <= 1.0,
             "without=%.0f/s with=%.0f/s diff=%.2f%% (median of %d, interleaved)" % (l0, l1, diff, rounds),
             rates)


def check_overhead(c, rounds=3):
    """Without and with the shim, interleaved (A B A B ...) so that clock drift and other
    tenants affect both alike; each figure is the median over the rounds."""
    runs = {"cupy_bench": {"without": [], "with": []}, "torch_train": {"without": [], "with": []}}
    texts = {}
    for role in runs:
        for i in range(rounds):
            for mode in ("without", "with"):
                r, text = run_child(role, [], c.env(shim=(mode == "with")), timeout=120)
                texts["%s %s %d" % (role, mode, i)] = text
                if r:
                    runs[role][mode].append(r)
    cb = runs["cupy_bench"]
    if len(cb["without"]) == rounds and len(cb["with"]) == rounds:
        l0 = _median([r["launches_per_s"] for r in cb["without"]])
        l1 = _median([r["launches_per_s"] for r in cb["with"]])
        diff = (l0 - l1) / l0 * 100
        # Python-driven launches vary by ±15% between runs whatever the shim does (which
        # does not wrap launches at all): recorded here, gated by the native check below.
        c.record("CuPy empty-kernel launch rate (recorded; Python-bound)", True,
                 "without=%.0f/s with=%.0f/s diff=%.2f%% (median of %d, interleaved)" % (l0, l1, diff, rounds),
                 runs["cupy_bench"])
        p0 = _median([r["alloc_free_pair_us"] for r in cb["without"]])
        p1 = _median([r["alloc_free_pair_us"] for r in cb["with"]])
        c.record("alloc/free pair latency (1MiB, cudaMalloc+cudaFree; recorded)", True,
                 "without=%.1fus with=%.1fus added=%.2fus" % (p0, p1, p1 - p0), runs["cupy_bench"])
    else:
        c.record("CuPy empty-kernel launch rate", False, "benchmark failed", texts)
    tt = runs["torch_train"]
    if len(tt["without"]) == rounds and len(tt["with"]) == rounds:
        s0 = _median([r["step_ms"] for r in tt["without"]])
        s1 = _median([r["step_ms"] for r in tt["with"]])
        # A 0.6 ms step of tiny kernels is bound by Python's launch loop and varies by
        # ±20% run to run: recorded. The gate is the GPU-bound loop below.
        c.record("small MLP step (recorded; launch-bound, noisy)", True,
                 "without=%.3fms with=%.3fms diff=%.2f%% (median of %d, interleaved; all: %s / %s)"
                 % (s0, s1, (s1 - s0) / s0 * 100, rounds,
                    ",".join("%.3f" % r["step_ms"] for r in tt["without"]),
                    ",".join("%.3f" % r["step_ms"] for r in tt["with"])),
                 runs["torch_train"])
    else:
        c.record("small MLP step", False, "benchmark failed", texts)
    loop = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_loop.py")
    steps = {"without": [], "with": []}
    for _ in range(rounds):
        for mode in ("without", "with"):
            p = subprocess.run([sys.executable, loop, "300"], env=c.env(shim=(mode == "with")),
                               capture_output=True, text=True, timeout=120)
            try:
                steps[mode].append(float(p.stdout.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                pass
    if len(steps["without"]) == rounds and len(steps["with"]) == rounds:
        s0, s1 = _median(steps["without"]), _median(steps["with"])
        diff = (s1 - s0) / s0 * 100
        c.record("PyTorch training step, GPU-bound (<=1% slower)", diff <= 1.0,
                 "without=%.4fms with=%.4fms diff=%.2f%% (median of %d, interleaved)" % (s0, s1, diff, rounds),
                 steps)
    else:
        c.record("PyTorch training step, GPU-bound", False, "benchmark failed", steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--shim")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--only", action="append", help="run only the named step(s), e.g. --only overhead")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.child:
        CHILDREN[a.child](a.rest)
        return 0
    if not a.shim or not os.path.exists(a.shim):
        print("FAIL: libfgpu.so not found at %r" % a.shim)
        return 2
    out = a.out or "/tmp/fgpu-shim-limits"
    os.makedirs(out, exist_ok=True)
    c = Ctx(os.path.abspath(a.shim), out)
    t0 = time.time()
    steps = [
        ("torch default", lambda: check_torch_oom(c, "default allocator", "")),
        ("torch expandable", lambda: check_torch_oom(c, "expandable_segments:True", "expandable_segments:True")),
        ("torch async", lambda: check_torch_oom(c, "backend:cudaMallocAsync", "backend:cudaMallocAsync")),
        ("jax", lambda: check_jax(c)),
        ("cupy", lambda: check_simple(c, "cupy", "CuPy memGetInfo total == 8GiB")),
        ("numba", lambda: check_simple(c, "numba", "Numba get_memory_info total == 8GiB")),
        ("nvidia-smi", lambda: check_smi(c)),
        ("two processes", lambda: check_two(c)),
        ("overhead", lambda: check_overhead(c)),
        ("native launch", lambda: check_native_launch(c)),
    ]
    for name, step in steps:
        if a.only and name not in a.only:
            continue
        try:
            step()
        except Exception as e:  # noqa: BLE001 - one broken check must not hide the others
            c.record("%s: script error" % name, False, repr(e)[:200], repr(e))
    for f in os.listdir("/dev/shm"):
        if f.startswith("fgpu-gpu-test-%d-" % os.getpid()):
            os.unlink(os.path.join("/dev/shm", f))
    with open(os.path.join(out, "shim_limits.json"), "w") as f:
        json.dump({"rows": c.rows, "details": c.details, "seconds": time.time() - t0}, f, indent=1, default=str)
    print("\n%-58s %-5s %s" % ("check", "", "figures"))
    for name, status, figures in c.rows:
        print("%-58s %-5s %s" % (name[:58], status, figures))
    failed = sum(1 for _, s, _ in c.rows if s != "PASS")
    print("\n%d checks, %d failed, %.0fs; details in %s/shim_limits.json" % (len(c.rows), failed, time.time() - t0, out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
