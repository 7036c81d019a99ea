#!/usr/bin/env bash
# Are the inline launch hooks installed on the real driver, and do PyTorch's launches reach
# the gate? Prints the first bytes of libcuda's launch entry points, then runs a matmul, a
# cuBLAS-free elementwise loop and CUDA-graph replays under the shim (FGPU_LOG=info,
# FGPU_COMPUTE_SHARE=50) and shows the shim's hook and gate lines. From the repo root:
#   OUT=/some/dir bash tests/gpu/launch_hooks.sh [BUNDLE_DIR]
set -u
B=${1:-bundle}
SHIM=$(realpath "$B/lib/libfgpu.so")
PY=${PY:-/opt/torch/.venv/bin/python3}
LIBCUDA=${LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
OUT=${OUT:-/tmp/fgpu-out}
mkdir -p "$OUT"
"$PY" - "$LIBCUDA" <<'PYEOF' | tee "$OUT/entry_bytes.txt"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
for n in ["cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
          "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch",
          "cuGraphLaunch_ptsz", "cuMemAlloc_v2"]:
    try:
        a = ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
        print("%-32s %#x  %s" % (n, a, ctypes.string_at(a, 24).hex(" ")))
    except AttributeError:
        print("%-32s missing" % n)
PYEOF
cat > "$OUT/hook_workload.py" <<'PYEOF'
import time, torch
x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
y = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
def loop(f, seconds):
    torch.cuda.synchronize(); n = 0; t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        for _ in range(10): f()
        n += 10
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t)
mm = lambda: x @ y
ew = lambda: x.mul_(1.0000001).add_(0.0)
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3): mm()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(8): mm()
res = {k: loop(f, 3.0) for k, f in [("matmul", mm), ("elementwise", ew), ("graph", g.replay)]}
print("RATES", " ".join("%s=%.1f" % kv for kv in res.items()), flush=True)
PYEOF
echo "== no shim"; "$PY" "$OUT/hook_workload.py" 2>&1 | tee "$OUT/noshim.txt" | grep RATES
echo "== shim, FGPU_COMPUTE_SHARE=50"
FGPU_LOG=info FGPU_COMPUTE_SHARE=50 LD_PRELOAD=$SHIM "$PY" "$OUT/hook_workload.py" > "$OUT/shim50.txt" 2>&1
grep -E "RATES|launch hook|compute gate|error|warn" "$OUT/shim50.txt" | head -20
echo "== shim, no limit"
FGPU_LOG=info LD_PRELOAD=$SHIM "$PY" "$OUT/hook_workload.py" > "$OUT/shim0.txt" 2>&1
grep -E "RATES|launch hook|error|warn" "$OUT/shim0.txt" | head -20
