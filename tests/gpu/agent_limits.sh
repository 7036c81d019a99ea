#!/usr/bin/env bash
# H200 check of agent-enforced limits (issue 5). From the bundle's parent folder:
#   OUT=/some/dir bash bundle/tests/gpu/agent_limits.sh
# Two "containers" (cgroup v2 + own PID namespace with its own /proc; no hostPID) with
# limits of 8 GiB and 16 GiB set by `fgpu limit set`, PyTorch under the shim in each at once;
# then a process without the shim in the 8 GiB one allocating past the limit. Table last.
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
WORK=$(mktemp -d /tmp/fgpu-lim.XXXX)
# Two doors: the containers' socket (what shims get, alone in its directory) and the admin
# socket the CLI uses (limits are refused on the containers' door).
SOCK=$WORK/run/fgpu.sock
ADMIN=$WORK/admin/fgpu.sock
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
export PATH=/usr/local/nvidia/bin:$PATH
mkdir -p "$OUT"
declare -a ROWS
row() { ROWS+=("$*"); echo "$*"; }
agent_pid=""
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  rm -rf /sys/fs/bpf/fgpu-lim
  for n in a b; do
    [ -d "$CG/fgpu-lim-$n" ] && { echo 1 > "$CG/fgpu-lim-$n/cgroup.kill"; sleep 0.3; rmdir "$CG/fgpu-lim-$n"; }
  done
}
trap cleanup EXIT

"$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" --bpf-dir /sys/fs/bpf/fgpu-lim \
  --state-dir "$WORK/state" --log info > "$OUT/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 100); do [ -S "$ADMIN" ] && break; sleep 0.1; done
[ -S "$ADMIN" ] || { echo "agent did not start"; cat "$OUT/agent.log"; exit 1; }

mkdir -p "$CG/fgpu-lim-a" "$CG/fgpu-lim-b"
"$FGPU" limit set /fgpu-lim-a --memory 8GiB --socket "$ADMIN"
"$FGPU" limit set /fgpu-lim-b --memory 16GiB --socket "$ADMIN"

in_container() { # NAME CMD...: run CMD in cgroup fgpu-lim-NAME and a new PID namespace
  local n=$1; shift
  sh -c "echo \$\$ > $CG/fgpu-lim-$n/cgroup.procs; exec unshare --pid --fork --mount-proc \"\$@\"" sh "$@"
}
for n in a b; do
  FGPU_WORK=$WORK LD_PRELOAD=$SHIM FGPU_SOCKET=$SOCK \
    in_container "$n" "$PY" "$B/tests/gpu/agent_limits_workload.py" shim "$n" > "$OUT/workload-$n.log" 2>&1 &
done
for n in a b; do
  for _ in $(seq 900); do [ -f "$WORK/$n.json" ] && break; sleep 0.1; done
  [ -f "$WORK/$n.json" ] || { echo "workload $n did not report"; tail -20 "$OUT/workload-$n.log"; }
done
"$FGPU" status --socket "$ADMIN" | tee "$OUT/status-during.txt"
"$FGPU" status --json --detail --socket "$ADMIN" > "$OUT/status-during.json"
for n in a b; do
  cp "$WORK/$n.json" "$OUT/workload-$n.json" 2>/dev/null
  row "$("$PY" - "$WORK/$n.json" "$n" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("%s: mem_get_info total=%.2f GiB | nvidia-smi %s | OOM after %d x 1 GiB (reserved %.2f GiB) | %s" % (
    "fgpu-lim-" + sys.argv[2], d["mem_get_info_total"] / 2**30, d["nvidia_smi"], d["tensors"],
    d["reserved"] / 2**30, (d["error"] or "no OOM")[:40]))
PYEOF
)"
done

echo "== a process without the shim in fgpu-lim-a (8 GiB, ~7.5 GiB already held) allocating 4 x 1 GiB"
FGPU_WORK=$WORK in_container a "$PY" "$B/tests/gpu/agent_limits_workload.py" bypass bypass 4 > "$OUT/bypass.log" 2>&1
rc=$?
tensors=$("$PY" -c "import json; print(json.load(open('$WORK/bypass.json')).get('tensors', 0))" 2>/dev/null || echo 0)
row "bypass process (no LD_PRELOAD): exit status $rc (137 = SIGKILL), got $tensors x 1 GiB before it was stopped; agent: $(grep -c 'killed' "$OUT/agent.log") kill(s) logged"
"$FGPU" status --socket "$ADMIN" | tee "$OUT/status-after-bypass.txt"
for n in a b; do touch "$WORK/$n.go"; done
sleep 2
"$FGPU" status --socket "$ADMIN" > "$OUT/status-end.txt"

echo
echo "================ agent-enforced limits on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) ================"
printf '%s\n' "${ROWS[@]}" | tee "$OUT/summary.txt"
echo "--- fgpu status during the run:"
cat "$OUT/status-during.txt"
