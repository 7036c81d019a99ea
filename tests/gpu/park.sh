#!/usr/bin/env bash
# H200 check of parking (issue 29, docs/parking.md). From the bundle's parent folder:
#   OUT=/some/dir bash bundle/tests/gpu/park.sh
# The PCIe link measured with plain pinned copies; three stand-in inference servers
# (tests/gpu/park_server.py: WEIGHTS_GIB of weights + a 1 GiB cache each, more than the GPU
# together) answered alone without fgpu (the reference); then the three in "containers"
# (cgroup v2 + their own PID namespace and /proc) under the shim and the agent, each
# `--park-after 1s`, answering requests round-robin: the answers must equal the reference,
# and each unpark is timed against the link. A fourth server (RESIDENT_GIB of weights, not
# parkable) answers a request every 50 ms all along: its request times while the others park
# and unpark, compute, or are quiet, against its own reference without fgpu. Table last;
# details in $OUT.
# Env: WEIGHTS_GIB (47), REQUESTS (3), GAP (1.5 s between requests), PARK_HOST (100GiB),
#      RESIDENT_GIB (4; 0: no resident server).
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
WORK=$(mktemp -d /tmp/fgpu-park.XXXX)
SOCK=$WORK/run/fgpu.sock
ADMIN=$WORK/admin/fgpu.sock
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
export PATH=/usr/local/nvidia/bin:$PATH
mkdir -p "$OUT"
agent_pid=""
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  rm -rf /sys/fs/bpf/fgpu-park
  for n in a b c r; do
    [ -d "$CG/fgpu-park-$n" ] && { echo 1 > "$CG/fgpu-park-$n/cgroup.kill"; sleep 0.3; rmdir "$CG/fgpu-park-$n"; }
  done
}
trap cleanup EXIT
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  free -g | head -2
  echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
} 2>&1 | tee "$OUT/environment.txt"

"$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" --bpf-dir /sys/fs/bpf/fgpu-park \
  --state-dir "$WORK/state" --park-host-memory "${PARK_HOST:-100GiB}" --log info > "$OUT/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 100); do [ -S "$ADMIN" ] && break; sleep 0.1; done
[ -S "$ADMIN" ] || { echo "agent did not start"; cat "$OUT/agent.log"; exit 1; }
for n in a b c; do
  mkdir -p "$CG/fgpu-park-$n"
  "$FGPU" limit set /fgpu-park-$n --memory 60GiB --park-after 1s --socket "$ADMIN"
done
# The fourth, resident server: a limit, not parkable; asked every 50 ms all along.
mkdir -p "$CG/fgpu-park-r"
"$FGPU" limit set /fgpu-park-r --memory 8GiB --socket "$ADMIN"
timeout --kill-after=10 540 "$PY" "$HERE/park_driver.py" --fgpu "$FGPU" --admin "$ADMIN" --sock "$SOCK" \
  --shim "$SHIM" --cg-root "$CG" --py "$PY" --out "$OUT" --weights-gib "${WEIGHTS_GIB:-47}" \
  --requests "${REQUESTS:-3}" --gap "${GAP:-1.5}" --resident-gib "${RESIDENT_GIB:-4}"
rc=$?
"$FGPU" status --socket "$ADMIN" > "$OUT/status-end.txt" 2>&1
grep -E "park|room" "$OUT/agent.log" | tail -40 > "$OUT/agent-park.txt"
echo "--- the agent on parking (last lines):"
tail -12 "$OUT/agent-park.txt" | cut -c1-220
exit $rc
