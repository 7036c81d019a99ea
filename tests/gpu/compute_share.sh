#!/usr/bin/env bash
# Compute caps of libfgpu.so on a real GPU: PyTorch matmul and CUDA-graph loops under
# FGPU_COMPUTE_SHARE, the no-limit overhead, and the driver's own time-slicing beside it.
#
# Usage: tests/gpu/compute_share.sh [BUNDLE_DIR]   (BUNDLE_DIR/lib/libfgpu.so; default ./bundle)
# Results: PASS/FAIL lines and a table on stdout; details in $OUT/compute_share.json.
# Needs: /opt/torch/.venv/bin/python3 (torch), nvidia-smi, an idle GPU.
# Every worker has its own timeout; the whole run is capped at 290 s.
set -euo pipefail

bundle=${1:-bundle}
shift || true
shim=$(realpath "$bundle/lib/libfgpu.so")
py=${PYTHON:-/opt/torch/.venv/bin/python3}
export OUT=${OUT:-$(mktemp -d /tmp/fgpu-compute-share.XXXXXX)}
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

timeout --kill-after=10 290 "$py" "$(dirname "$(realpath "$0")")/compute_share.py" \
    --shim "$shim" --out "$OUT" "$@" | tee "$OUT/compute_share.txt"
