#!/usr/bin/env bash
# libfgpu.so on a real GPU: FGPU_MEMORY_LIMIT=8GiB with PyTorch (three allocators), JAX, CuPy,
# Numba, nvidia-smi, two processes sharing one limit, and the shim's overhead.
#
# Usage: tests/gpu/shim_limits.sh [BUNDLE_DIR] [--only STEP]...
#        (BUNDLE_DIR/lib/libfgpu.so; default ./bundle; steps: "torch default", jax, overhead, ...)
# Results: PASS/FAIL lines and a table on stdout; details in $OUT/shim_limits.json.
# Needs: /opt/torch/.venv/bin/python3 (torch, jax, cupy, numba), nvidia-smi, an idle GPU.
# Every step has its own timeout; the whole run is capped at 6 minutes.
set -euo pipefail

bundle=${1:-bundle}
shift || true
shim=$(realpath "$bundle/lib/libfgpu.so")
py=${PYTHON:-/opt/torch/.venv/bin/python3}
export OUT=${OUT:-$(mktemp -d /tmp/fgpu-shim-limits.XXXXXX)}
export PATH=/usr/local/nvidia/bin:$PATH
mkdir -p "$OUT"

[ -f "$shim" ] || { echo "FAIL: no $shim"; exit 2; }
[ -x "$py" ] || { echo "FAIL: no $py"; exit 2; }

{
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' || true
    sha256sum "$shim"
} >"$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

timeout --kill-after=10 360 "$py" "$(dirname "$(realpath "$0")")/shim_limits.py" \
    --shim "$shim" --out "$OUT" "$@"
