#!/usr/bin/env bash
# H200 check of the trust boundary's memory side (issue 11). From the bundle's parent folder:
#   OUT=/some/dir bash bundle/tests/gpu/trust.sh
# "Containers" are cgroup v2 + own PID namespace with its own /proc (no hostPID).
# (a) pod-level limit: a parent cgroup with an 8 GiB limit, two child cgroups each running
#     PyTorch under the shim that tries to take 7 GiB in 256 MiB tensors, at once: together
#     they must stay within 8 GiB (contexts included); each reports its bytes and its OOM.
# (a2) the same pod with a child that bypasses the shim holding 5 GiB, then a shim child
#     trying for 7 GiB: the pod's budget holds both.
# (b) bypass: PyTorch WITHOUT the shim in a 4 GiB cgroup allocating 256 MiB tensors as fast
#     as it can: the kernel kills it at the allocation that crosses (16 tensors fit).
# Every worker runs under `timeout`; details under $OUT; a short table last.
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
SOCK=/tmp/fgpu-trust/fgpu.sock          # the containers' socket (shims), alone in its directory
ADMIN=/tmp/fgpu-trust-admin/fgpu.sock   # the admin socket (the CLI), never in a container
mkdir -p "$(dirname "$SOCK")"
WORK=$(mktemp -d /tmp/fgpu-trust.XXXX)
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
WL=$B/tests/gpu/trust_workload.py
T=${T:-300} # seconds per worker
GIB=$((1 << 30))
export PATH=/usr/local/nvidia/bin:$PATH
mkdir -p "$OUT"
declare -a ROWS
row() { ROWS+=("$*"); echo "$*"; }
agent_pid=""
CGS=(fgpu-trust-pod/a fgpu-trust-pod/b fgpu-trust-pod/raw fgpu-trust-pod/c fgpu-trust-pod fgpu-trust-raw)
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  rm -rf /sys/fs/bpf/fgpu-trust
  for n in "${CGS[@]}"; do
    [ -d "$CG/$n" ] && { echo 1 > "$CG/$n/cgroup.kill"; sleep 0.3; rmdir "$CG/$n" 2>/dev/null; }
  done
}
trap cleanup EXIT

# FGPU_AGENT_ARGS=--sim tries the script on the simulated driver (with a stand-in for torch).
# shellcheck disable=SC2086
"$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" ${FGPU_AGENT_ARGS:---libcuda $LIBCUDA} --bpf-dir /sys/fs/bpf/fgpu-trust \
  --state-dir "$WORK/state" --log info > "$OUT/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 100); do [ -S "$ADMIN" ] && break; sleep 0.1; done
[ -S "$ADMIN" ] || { echo "agent did not start"; cat "$OUT/agent.log"; exit 1; }
fgpu() { "$FGPU" "$@" --socket "$ADMIN"; }

in_container() { # CGROUP CMD...: CMD in cgroup CGROUP and a new PID namespace (own /proc),
  # under `timeout` (unshare --kill-child takes the namespace down with it)
  local n=$1; shift
  timeout -k 5 "$T" sh -c "echo \$\$ > $CG/$n/cgroup.procs; exec unshare --pid --fork --mount-proc --kill-child \"\$@\"" sh "$@"
}
# Inside the namespace: run CMD and write its exit status (137 = SIGKILL) to RCFILE, which
# unshare cannot always pass on as its own.
cat > "$WORK/rc.sh" <<'SHEOF'
rc_file=$1; shift
"$@"; echo $? > "$rc_file"
SHEOF
field() { # FILE KEY: a value of a workload report
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); v=d.get(sys.argv[2]); print('' if v is None else v)" "$1" "$2" 2>/dev/null
}
gib() { awk -v b="${1:-0}" 'BEGIN{printf "%.2f GiB", b/2^30}'; }
subtree() { # CGROUP: the kernel's subtree total of a cgroup from fgpu status
  fgpu status --json | "$PY" -c "import json,sys; r=[c for c in json.load(sys.stdin) if c['cgroup']==sys.argv[1]]; print(r[0].get('memory_subtree_bytes',0) if r else 0)" "$1"
}

# ---------------- (a) pod-level limit, two shim children at once
workers=()
mkdir -p "$CG/fgpu-trust-pod"
fgpu limit set /fgpu-trust-pod --memory 8GiB
mkdir -p "$CG/fgpu-trust-pod/a" "$CG/fgpu-trust-pod/b" # created after the limit: they share it
fgpu limit get /fgpu-trust-pod/a | tee "$OUT/limit-get-child.txt"
for n in a b; do
  FGPU_WORK=$WORK LD_PRELOAD=$SHIM FGPU_SOCKET=$SOCK \
    in_container "fgpu-trust-pod/$n" "$PY" "$WL" shim "$n" 7 > "$OUT/pod-$n.log" 2>&1 &
  workers+=($!)
done
for n in a b; do
  for _ in $(seq 1200); do [ -n "$(field "$WORK/$n.json" bytes)" ] && break; sleep 0.1; done
done
pod_total=$(subtree /fgpu-trust-pod)
fgpu status | tee "$OUT/status-pod.txt"
fgpu status --json --detail > "$OUT/status-pod.json"
sum=0
for n in a b; do
  cp "$WORK/$n.json" "$OUT/pod-$n.json" 2>/dev/null
  bytes=$(field "$WORK/$n.json" bytes); bytes=${bytes:-0}; sum=$((sum + bytes))
  row "(a) pod child $n (shim): $(gib "$bytes") in 256 MiB tensors, mem_get_info total $(gib "$(field "$WORK/$n.json" mem_get_info_total)"); $(field "$WORK/$n.json" error | cut -c1-90)"
done
row "(a) pod (8 GiB limit): children's tensors together $(gib $sum), kernel-observed subtree $(gib "$pod_total") (contexts are on top: the shim counts them)"
for n in a b; do touch "$WORK/$n.go"; done
wait "${workers[@]}"
workers=()

# ---------------- (a2) the same pod: a bypassing child first, then a shim child
mkdir -p "$CG/fgpu-trust-pod/raw" "$CG/fgpu-trust-pod/c"
# "shim" mode for its hold-until-go, but without LD_PRELOAD: the shim is bypassed
FGPU_WORK=$WORK in_container fgpu-trust-pod/raw "$PY" "$WL" shim raw 5 > "$OUT/pod-raw.log" 2>&1 &
workers+=($!)
for _ in $(seq 1200); do [ -n "$(field "$WORK/raw.json" bytes)" ] && break; sleep 0.1; done
sleep 0.5
FGPU_WORK=$WORK LD_PRELOAD=$SHIM FGPU_SOCKET=$SOCK \
  in_container fgpu-trust-pod/c "$PY" "$WL" shim c 7 > "$OUT/pod-c.log" 2>&1 &
workers+=($!)
for _ in $(seq 1200); do [ -n "$(field "$WORK/c.json" bytes)" ] && break; sleep 0.1; done
pod_total2=$(subtree /fgpu-trust-pod)
fgpu status | tee "$OUT/status-pod-mixed.txt"
raw_b=$(field "$WORK/raw.json" bytes); c_b=$(field "$WORK/c.json" bytes)
row "(a2) pod: bypassing child $(gib "$raw_b") + shim child $(gib "$c_b") ($(field "$WORK/c.json" error | cut -c1-60)); kernel subtree $(gib "$pod_total2") of 8 GiB"
touch "$WORK/raw.go" "$WORK/c.go"
wait "${workers[@]}"

# ---------------- (b) bypass: no shim, 4 GiB cgroup, 256 MiB tensors as fast as it can
mkdir -p "$CG/fgpu-trust-raw"
fgpu limit set /fgpu-trust-raw --memory 4GiB
FGPU_WORK=$WORK in_container fgpu-trust-raw sh "$WORK/rc.sh" "$WORK/bypass.rc" "$PY" "$WL" bypass bypass 40 \
  > "$OUT/bypass.log" 2>&1
rc=$(cat "$WORK/bypass.rc" 2>/dev/null || echo "?")
sleep 0.5
cp "$WORK/bypass.json" "$OUT/bypass.json" 2>/dev/null
held=$(field "$WORK/bypass.json" bytes); held=${held:-0}
record=$(grep -a 'over limit' "$OUT/agent.log" | grep -a 'fgpu-trust-raw' | sed 's/\x1b\[[0-9;]*m//g' | tail -1)
kills=$(grep -a 'over limit' "$OUT/agent.log" | grep -a 'fgpu-trust-raw' | grep -ac 'killed by the kernel')
row "(b) bypass (no LD_PRELOAD, 4 GiB limit): exit $rc (137 = SIGKILL), held $(gib "$held") = $((held / (256 << 20))) tensors at death vs limit 4.00 GiB (16 fit); kernel kill records: $kills"
row "(b) kernel record: ${record:-none}"
fgpu status | tee "$OUT/status-end.txt"
fgpu status --json --detail > "$OUT/status-end.json"

echo
echo "================ trust boundary (memory) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) ================"
printf '%s\n' "${ROWS[@]}" | tee "$OUT/summary.txt"
