#!/usr/bin/env bash
# The gate's driver calls on the real driver (tests/gpu/gate_calls.py): bare, then the
# decoder-like step under the shim's standalone gate (FGPU_COMPUTE_SHARE=99), interleaved
# twice. From the bundle's parent: OUT=/some/dir bash bundle/tests/gpu/gate_calls.sh
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
mkdir -p "$OUT"
export PATH=/usr/local/nvidia/bin:$PATH
unset LD_PRELOAD FGPU_SOCKET FGPU_COMPUTE_SHARE FGPU_MEMORY_LIMIT
for i in 1 2; do
  timeout -k 5 60 "$PY" "$HERE/gate_calls.py" --label "bare$i"
  timeout -k 5 60 env LD_PRELOAD="$B/lib/libfgpu.so" FGPU_SOCKET=/nonexistent FGPU_COMPUTE_SHARE=99 FGPU_LOG=info \
    "$PY" "$HERE/gate_calls.py" --steps-only --label "gated$i"
  [ -f "$B/lib/old/libfgpu.so" ] && timeout -k 5 60 env LD_PRELOAD="$B/lib/old/libfgpu.so" FGPU_SOCKET=/nonexistent \
    FGPU_COMPUTE_SHARE=99 FGPU_LOG=info "$PY" "$HERE/gate_calls.py" --steps-only --label "old$i"
done 2>&1 | tee "$OUT/gate_calls.txt" | grep -E "^(CALL|STEP|CLOCKSOURCE)|compute gate"
