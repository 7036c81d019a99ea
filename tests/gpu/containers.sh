#!/usr/bin/env bash
# H200 check of containers through CDI (issue 12). From the bundle's parent folder:
#   OUT=/some/dir bash bundle/tests/gpu/containers.sh
# SIM=1 runs the same on the bundle's simulated driver (no GPU; fgpu-sim-load instead of
# PyTorch), to check the script itself.
#
# The GPU machine has no container runtime (and no registry for a CUDA + PyTorch image), so
# the runtime's part is done by hand, from the spec `fgpu cdi generate` writes: two
# "containers" get a cgroup named as podman names them (…/libpod-<64 hex>), a process in it
# that waits like runc's init while the spec's createRuntime hook runs (fed a synthetic OCI
# state and config.json whose env asks for 1 GiB / 2 GiB), then execs PyTorch in its own PID
# namespace with its own /proc, with the spec's env edits applied (LD_PRELOAD of the bundle's
# libfgpu.so, FGPU_SOCKET). Then: fgpu status by container id, `fgpu limit set container:ID`,
# a process without the shim in the 1 GiB one (the kernel backstop kills it), and the
# containers' removal (their limits go with their cgroups). Table last.
set -u
SIM=${SIM:-0}
if [ "$SIM" = 1 ]; then PY=${PY:-python3}; fi
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
WORK=$(mktemp -d /tmp/fgpu-ctr.XXXX)
SOCK=$WORK/run/fgpu.sock
ADMIN=$WORK/admin/fgpu.sock
SPEC=$WORK/cdi/fgpu.json
BPF=/sys/fs/bpf/fgpu-ctr-$$
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
PARENT=$CG/fgpu_ctr_parent
export PATH=/usr/local/nvidia/bin:$PATH
mkdir -p "$OUT" "$PARENT"
declare -a ROWS
row() { ROWS+=("$*"); echo "$*"; }
agent_pid=""
declare -A CID INIT
cleanup() {
  for d in "$PARENT"/libpod-*; do
    [ -d "$d" ] && { echo 1 > "$d/cgroup.kill"; sleep 0.3; rmdir "$d"; }
  done
  rmdir "$PARENT" 2>/dev/null
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  rm -rf "$BPF" "$WORK"
}
trap cleanup EXIT

if [ "$SIM" = 1 ]; then
  export FGPU_SIM_DIR=$B/sim FGPU_SIM_STATE=$WORK/sim-state
  agent_driver=(--sim)
else
  agent_driver=(--libcuda "$LIBCUDA")
fi
timeout 175 "$FGPU" agent "${agent_driver[@]}" --socket "$SOCK" --admin-socket "$ADMIN" \
  --bpf-dir "$BPF" --state-dir "$WORK/state" --log info > "$OUT/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 150); do [ -S "$SOCK" ] && [ -S "$ADMIN" ] && break; sleep 0.1; done
[ -S "$ADMIN" ] || { echo "agent did not start"; cat "$OUT/agent.log"; exit 1; }

if command -v podman >/dev/null; then
  row "runtime: $(podman --version) is here, but there is no CUDA+PyTorch image without a registry: the runtime's part is done by hand"
else
  row "runtime: none on this machine (no podman): the CDI spec's edits and hook are applied by hand"
fi
gen=(--socket "$SOCK" --admin-socket "$ADMIN" --shim "$SHIM" --output "$SPEC")
[ "$SIM" = 1 ] && gen+=(--sim)
timeout 30 "$FGPU" cdi generate "${gen[@]}" 2> "$OUT/cdi-generate.txt" || { cat "$OUT/cdi-generate.txt"; exit 1; }
cp "$SPEC" "$OUT/fgpu-cdi.json"
row "cdi generate: $(tr '\n' ' ' < "$OUT/cdi-generate.txt")"
mapfile -t SPEC_ENV < <("$PY" "$B/tests/gpu/containers_cdi.py" env "$SPEC")

# NAME LIMIT CMD...: a "container": cgroup libpod-<id>, the hook, then CMD with the spec's env.
start_container() {
  local name=$1 limit=$2; shift 2
  local id bundle cg
  id=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  cg=$PARENT/libpod-$id
  bundle=$WORK/bundle-$name
  mkdir -p "$cg" "$bundle"
  CID[$name]=$id
  printf '{"ociVersion":"1.0.2","process":{"env":["PATH=/usr/bin:/bin","FGPU_MEMORY_LIMIT=%s"]}}\n' \
    "$limit" > "$bundle/config.json"
  mkfifo "$bundle/start"
  (
    echo "$BASHPID" > "$cg/cgroup.procs"
    read -r go < "$bundle/start"
    [ "$go" = go ] || exit 125
    exec env -u LD_PRELOAD "${SPEC_ENV[@]}" FGPU_MEMORY_LIMIT="$limit" FGPU_WORK="$WORK" \
      timeout 150 unshare --pid --fork --mount-proc --kill-child "$@"
  ) > "$OUT/workload-$name.log" 2>&1 &
  INIT[$name]=$!
  for _ in $(seq 100); do grep -q "libpod-$id" "/proc/${INIT[$name]}/cgroup" 2>/dev/null && break; sleep 0.02; done
  local state
  state=$(printf '{"ociVersion":"1.0.2","id":"%s","status":"creating","pid":%d,"bundle":"%s"}' \
    "$id" "${INIT[$name]}" "$bundle")
  if timeout 20 "$PY" "$B/tests/gpu/containers_cdi.py" hook "$SPEC" "$state" 2> "$OUT/hook-$name.txt"; then
    echo go > "$bundle/start"
  else
    row "$name: the hook refused the container: $(tr '\n' ' ' < "$OUT/hook-$name.txt")"
    echo no > "$bundle/start"
  fi
}

if [ "$SIM" = 1 ]; then
  allocs() { for _ in $(seq "$1"); do printf 'alloc %s ' "$2"; done; }
  # shellcheck disable=SC2046
  start_container a 1GiB env FGPU_CONTEXT_OVERHEAD=300MiB LD_LIBRARY_PATH="$B/sim" "$B/sim/fgpu-sim-load" info $(allocs 12 256MiB) sleep 4000
  # shellcheck disable=SC2046
  start_container b 2GiB env FGPU_CONTEXT_OVERHEAD=300MiB LD_LIBRARY_PATH="$B/sim" "$B/sim/fgpu-sim-load" info $(allocs 12 256MiB) sleep 4000
  for n in a b; do
    for _ in $(seq 100); do grep -q "^sleep\|alloc fail" "$OUT/workload-$n.log" 2>/dev/null && break; sleep 0.05; done
    sleep 0.3
    total=$(sed -n 's/^info free=[0-9]* total=\([0-9]*\)/\1/p' "$OUT/workload-$n.log")
    row "$n (${CID[$n]:0:12}): cuMemGetInfo total=$(awk -v t="${total:-0}" 'BEGIN{printf "%.2f", t/2^30}') GiB | $(grep -c '^alloc ok' "$OUT/workload-$n.log") x 256 MiB then $(grep -m1 '^alloc fail' "$OUT/workload-$n.log" || echo 'no failure')"
  done
else
  start_container a 1GiB "$PY" "$B/tests/gpu/containers_workload.py" shim a
  start_container b 2GiB "$PY" "$B/tests/gpu/containers_workload.py" shim b
  for n in a b; do
    for _ in $(seq 900); do [ -f "$WORK/$n.json" ] && break; sleep 0.1; done
    [ -f "$WORK/$n.json" ] || { row "$n: no report"; tail -20 "$OUT/workload-$n.log"; continue; }
    cp "$WORK/$n.json" "$OUT/workload-$n.json"
    row "$n (${CID[$n]:0:12}): $("$PY" - "$WORK/$n.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("env FGPU_MEMORY_LIMIT=%s | torch.cuda.mem_get_info() total=%.2f GiB free=%.2f GiB | nvidia-smi %s | %d x 256 MiB then %s" % (
    d["env_limit"], d["mem_get_info_total"] / 2**30, d["mem_get_info_free"] / 2**30,
    d["nvidia_smi"], d["tensors_256mib"], (d["error"] or "no OOM")[:60]))
PYEOF
)"
  done
fi

timeout 20 "$FGPU" status --socket "$ADMIN" > "$OUT/status-during.txt" 2>&1
timeout 20 "$FGPU" status --json --socket "$ADMIN" > "$OUT/status-during.json" 2>&1
seen=0
for n in a b; do grep -q "${CID[$n]:0:12}" "$OUT/status-during.txt" && seen=$((seen + 1)); done
row "fgpu status: $seen of 2 containers listed by container id"
if timeout 20 "$FGPU" limit set "container:${CID[b]:0:12}" --memory 3GiB --socket "$ADMIN" > "$OUT/limit-set.txt" 2>&1; then
  row "fgpu limit set container:${CID[b]:0:12} --memory 3GiB: $(tail -1 "$OUT/limit-set.txt" | awk '{print $1, $2}')"
else
  row "fgpu limit set container:${CID[b]:0:12} failed: $(tr '\n' ' ' < "$OUT/limit-set.txt")"
fi

echo "== a process without the shim in container a (1 GiB, already full) allocating 1 GiB tensors"
if [ "$SIM" = 1 ]; then
  bypass=(env LD_LIBRARY_PATH="$B/sim" "$B/sim/fgpu-sim-load" alloc 1GiB alloc 1GiB alloc 1GiB alloc 1GiB)
else
  bypass=(env FGPU_WORK="$WORK" "$PY" "$B/tests/gpu/containers_workload.py" bypass bypass 4)
fi
# unshare cannot pass a SIGKILL on as its own status: a shell inside reports it.
# shellcheck disable=SC2016
timeout 90 sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec unshare --pid --fork --mount-proc --kill-child sh -c "\"\$@\"; echo exit=\$?" sh "$@"' \
  sh "$PARENT/libpod-${CID[a]}" "${bypass[@]}" > "$OUT/bypass.log" 2>&1
rc=$(sed -n 's/^exit=//p' "$OUT/bypass.log" | tail -1)
row "bypass (no LD_PRELOAD) in a: exit status $rc (137 = SIGKILL); agent: $(grep -c 'killed by the kernel' "$OUT/agent.log") kill(s) logged"

# Remove the containers: their limits go with their cgroups.
for n in a b; do touch "$WORK/$n.go"; done
for n in a b; do
  d=$PARENT/libpod-${CID[$n]}
  for _ in $(seq 50); do [ -s "$d/cgroup.procs" ] || break; sleep 0.1; done
  echo 1 > "$d/cgroup.kill"; sleep 0.3; rmdir "$d"
done
left=-1
for _ in $(seq 40); do
  left=$(timeout 10 "$FGPU" limit ls --socket "$ADMIN" | grep -c 'libpod-')
  [ "$left" = 0 ] && break
  sleep 0.1
done
row "after removing both containers: $left container limit(s) left (expected 0)"
timeout 10 "$FGPU" limit ls --socket "$ADMIN" > "$OUT/limits-end.txt" 2>&1

echo
if [ "$SIM" = 1 ]; then gpu="simulated driver"; else gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); fi
echo "================ containers through CDI on $gpu ================"
printf '%s\n' "${ROWS[@]}" | tee "$OUT/summary.txt"
echo "--- fgpu status during the run:"
cat "$OUT/status-during.txt"
