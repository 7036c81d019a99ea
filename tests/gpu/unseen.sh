#!/usr/bin/env bash
# H200 check of the backstop for memory no allocation call shows (fgpu-agent/src/agent/unseen.rs).
# From the bundle's parent folder:   OUT=/some/dir bash bundle/tests/gpu/unseen.sh
# Three "containers" (cgroup v2 + own PID namespace, no hostPID), each with a 4 GiB limit:
#   honest  PyTorch under the shim, training at the largest batch that fits: must be left
#           alone; the driver's figure for it (nvidia-smi, host PIDs) against the limit says
#           how much of the 1 GiB tolerance real contexts and lazily loaded modules use;
#   lmem    no shim: a kernel with 64 KiB of local memory per thread (the driver grows the
#           context by ~17 GiB inside the launch): must be killed within ~3 s;
#   arrays  no shim: 1 GiB CUDA arrays (not probed) up to 6: must be killed.
# Every worker has a timeout. Table last; details (agent log, JSON reports) under $OUT.
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
WORK=$(mktemp -d /tmp/fgpu-unseen.XXXX)
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
  rm -rf /sys/fs/bpf/fgpu-unseen
  for n in honest lmem arrays; do
    [ -d "$CG/fgpu-unseen-$n" ] && { echo 1 > "$CG/fgpu-unseen-$n/cgroup.kill"; sleep 0.3; rmdir "$CG/fgpu-unseen-$n"; }
  done
}
trap cleanup EXIT

"$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" --bpf-dir /sys/fs/bpf/fgpu-unseen \
  --state-dir "$WORK/state" --log info > "$OUT/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 100); do [ -S "$ADMIN" ] && break; sleep 0.1; done
[ -S "$ADMIN" ] || { echo "agent did not start"; cat "$OUT/agent.log"; exit 1; }
for n in honest lmem arrays; do
  mkdir -p "$CG/fgpu-unseen-$n"
  "$FGPU" limit set "/fgpu-unseen-$n" --memory 4GiB --socket "$ADMIN"
done

in_container() { # SECONDS NAME CMD...: CMD in cgroup fgpu-unseen-NAME and a new PID namespace,
  # under `timeout` (which cannot run a shell function itself: on its first H200 run every
  # worker failed with "failed to run command 'in_container'")
  local secs=$1 n=$2; shift 2
  timeout -k 5 "$secs" sh -c "echo \$\$ > $CG/fgpu-unseen-$n/cgroup.procs; exec unshare --pid --fork --mount-proc \"\$@\"" sh "$@"
}
driver_mib() { # NAME: what nvidia-smi counts for the cgroup's processes, MiB
  local pids total=0
  pids=$(tr '\n' ' ' < "$CG/fgpu-unseen-$1/cgroup.procs" 2>/dev/null)
  while IFS=, read -r pid mib; do
    for p in $pids; do [ "$p" = "${pid// /}" ] && total=$((total + ${mib// MiB/})); done
  done < <(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null)
  echo "$total"
}
json() { "$PY" -c "import json,sys; d=json.load(open('$WORK/$1.json')); print(d.get('$2', '$3'))" 2>/dev/null || echo "$3"; }

# 1. The honest tenant first, alone, until it trains at its largest batch.
FGPU_WORK=$WORK LD_PRELOAD=$SHIM FGPU_SOCKET=$SOCK \
  in_container 120 honest "$PY" "$HERE/unseen_workload.py" honest honest > "$OUT/honest.log" 2>&1 &
honest_pid=$!
for _ in $(seq 900); do [ -f "$WORK/honest.json" ] && break; sleep 0.1; done
peak=0
for _ in $(seq 20); do # 10 s of training at the fitted batch: the driver's figure, sampled
  m=$(driver_mib honest); [ "$m" -gt "$peak" ] && peak=$m; sleep 0.5
done

# 2. The two without the shim, one after the other, each timed from its memory being held.
for n in lmem arrays; do
  t0=$(date +%s.%N)
  FGPU_WORK=$WORK in_container 60 "$n" "$PY" "$HERE/unseen_workload.py" "$n" "$n" 6 > "$OUT/$n.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  held_at=$(json "$n" held_at 0)
  after=$("$PY" -c "print('%.1f' % ($t1 - $held_at) if $held_at else 'never held')")
  case $n in
    lmem) what="local memory grown by $(( $(json lmem grown_bytes 0) >> 20 )) MiB in the launch (launch rc $(json lmem launch_rc -))" ;;
    arrays) what="$(json arrays arrays 0) x 1 GiB CUDA arrays" ;;
  esac
  row "$n (no shim, 4 GiB limit): $what; exit $rc (137 = SIGKILL) $after s after it held it, survived=$(json "$n" survived False); $("$PY" -c "print('%.1f' % ($t1 - $t0))") s in all"
done

touch "$WORK/honest.go"
wait "$honest_pid"
honest_rc=$?
row "honest (shim, 4 GiB limit, PyTorch CNN at batch $(json honest batch -)): exit $honest_rc, $(json honest steps 0) steps, OOMs after fitting $(json honest ooms_after 0); the driver counted at most $peak MiB (limit 4096 MiB + tolerance 1024 MiB)"
row "agent: $(grep -c 'unseen_over_limit' "$OUT/agent.log") over-limit report(s), $(grep -c 'unseen_kill' "$OUT/agent.log") kill(s); for the honest tenant: $(grep 'fgpu-unseen-honest' "$OUT/agent.log" | grep -c 'unseen_')"
cp "$WORK"/*.json "$OUT/" 2>/dev/null
"$FGPU" status --socket "$ADMIN" > "$OUT/status-end.txt"

echo
echo "================ memory no allocation call shows, on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) ================"
printf '%s\n' "${ROWS[@]}" | tee "$OUT/summary.txt"
