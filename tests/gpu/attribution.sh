#!/usr/bin/env bash
# H200 check of kernel-side attribution (issue 3). Run from the bundle's parent folder:
#   bash bundle/tests/gpu/attribution.sh          (OUT=folder for details, default /tmp/fgpu-out)
# Needs root, the real driver, /opt/torch/.venv/bin/python3 (PyTorch). Prints a table last.
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
LOAD=$B/sim/fgpu-sim-load
SOCK=/tmp/fgpu-attr.sock
WORK=$(mktemp -d /tmp/fgpu-attr.XXXX)
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
mkdir -p "$OUT"
export PATH=/usr/local/nvidia/bin:$PATH
declare -a ROWS

row() { ROWS+=("$*"); echo "$*"; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
agent_pid=""
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  rm -rf /sys/fs/bpf/fgpu-attr
  for n in default expandable async; do
    [ -d "$CG/fgpu-attr-$n" ] && { echo 1 > "$CG/fgpu-attr-$n/cgroup.kill" 2>/dev/null; sleep 0.2; rmdir "$CG/fgpu-attr-$n" 2>/dev/null; }
  done
}
trap cleanup EXIT

start_agent() {
  "$FGPU" agent --socket "$SOCK" --libcuda "$LIBCUDA" --log info --bpf-dir /sys/fs/bpf/fgpu-attr \
    --state-dir /tmp/fgpu-attr-state > "$OUT/agent.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 100); do [ -S "$SOCK" ] && return 0; sleep 0.1; done
  echo "agent did not start:"; cat "$OUT/agent.log"; exit 1
}
stop_agent() { kill "$agent_pid"; wait "$agent_pid" 2>/dev/null; agent_pid=""; rm -rf /sys/fs/bpf/fgpu-attr; }

bench_pairs() { # prints ns per cuMemAlloc_v2+cuMemFree_v2 pair (median of 5 runs)
  for _ in 1 2 3 4 5; do
    timeout 60 "$LOAD" --lib "$LIBCUDA" bench-alloc 20000 2MiB | awk -F'ns_per_pair=' '/ns_per_pair/{print $2+0}'
  done | median
}
train_ms() { # median of 3 runs of the training loop
  for _ in 1 2 3; do timeout 120 "$PY" "$B/tests/gpu/train_loop.py" 300; done | median
}

echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"

echo "== cost without the agent"
base_ns=$(bench_pairs); base_ms=$(train_ms)
start_agent
echo "== cost with the agent (probes on $LIBCUDA)"
probed_ns=$(bench_pairs); probed_ms=$(train_ms)
row "alloc/free pair, no agent        ${base_ns} ns"
row "alloc/free pair, agent probing   ${probed_ns} ns  (added $(awk -v a="$probed_ns" -v b="$base_ns" 'BEGIN{printf "%.2f", (a-b)/1000}') us per pair)"
row "train step, no agent             ${base_ms} ms"
row "train step, agent probing        ${probed_ms} ms  ($(awk -v a="$probed_ms" -v b="$base_ms" 'BEGIN{printf "%+.2f", (a-b)*100/b}')%)"

echo "== three PyTorch containers (cgroup + PID namespace), three allocators"
declare -A CONF=([default]="" [expandable]="expandable_segments:True" [async]="backend:cudaMallocAsync")
for n in default expandable async; do
  mkdir -p "$CG/fgpu-attr-$n"
  FGPU_WORK=$WORK PYTORCH_CUDA_ALLOC_CONF=${CONF[$n]} sh -c \
    "echo \$\$ > $CG/fgpu-attr-$n/cgroup.procs; exec unshare --pid --fork --mount-proc $PY $B/tests/gpu/attribution_workload.py $n" \
    > "$OUT/workload-$n.log" 2>&1 &
done
for n in default expandable async; do
  for _ in $(seq 600); do [ -f "$WORK/$n.json" ] && break; sleep 0.1; done
  [ -f "$WORK/$n.json" ] || { echo "workload $n did not report"; cat "$OUT/workload-$n.log"; }
done
sleep 0.5
"$FGPU" status --socket "$SOCK" | tee "$OUT/status.txt"
"$FGPU" status --json --detail --socket "$SOCK" > "$OUT/status.json"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$OUT/nvml-apps.csv"
for n in default expandable async; do cp "$WORK/$n.json" "$OUT/workload-$n.json" 2>/dev/null; done
for n in default expandable async; do
  cgpath="/fgpu-attr-$n"
  fg=$("$PY" -c "import json,sys; s=json.load(open('$OUT/status.json')); r=[c for c in s['cgroups'] if c['cgroup']=='$cgpath']; print(r[0]['memory_used_bytes'] if r else 0)")
  pids=$(cat "$CG/fgpu-attr-$n/cgroup.procs" | tr '\n' ' ')
  nvml=0
  for p in $pids; do
    m=$(awk -F', ' -v p="$p" '$1==p{print $2}' "$OUT/nvml-apps.csv"); [ -n "$m" ] && nvml=$((nvml + m * 1048576))
  done
  torch=$("$PY" -c "import json; print(json.load(open('$WORK/$n.json'))['torch_reserved_bytes'])" 2>/dev/null || echo 0)
  row "$(printf '%-10s fgpu=%6d MiB  torch_reserved=%6d MiB  gap=%+5d MiB  nvml=%6d MiB  context_overhead=%5d MiB' \
      "$n" $((fg >> 20)) $((torch >> 20)) $(((fg - torch) >> 20)) $((nvml >> 20)) $(((nvml - fg) >> 20)))"
done
for n in default expandable async; do touch "$WORK/$n.go"; done
wait_start=$(date +%s.%N)
for _ in $(seq 100); do
  left=$("$FGPU" status --json --socket "$SOCK" | "$PY" -c "import json,sys; print(sum(c['memory_used_bytes'] for c in json.load(sys.stdin) if c['cgroup'].startswith('/fgpu-attr-')))")
  [ "$left" = 0 ] && break; sleep 0.1
done
row "released after exit: $left bytes left, $(awk -v s="$wait_start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.2f", e-s}') s after the workloads were told to exit"
"$FGPU" status --json --detail --socket "$SOCK" | "$PY" -c "import json,sys; print('kernel counters', json.load(sys.stdin)['counters'])" | tee -a "$OUT/status.txt"
stop_agent

echo
echo "================ attribution on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) ================"
printf '%s\n' "${ROWS[@]}" | tee "$OUT/summary.txt"
