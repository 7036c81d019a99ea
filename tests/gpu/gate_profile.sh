#!/usr/bin/env bash
# Where the launch gate's cost goes in a CPU-bound training loop (issue 10): one cnn process
# (workloads.py) alone under the agent, profiled with `perf record` for PROF_SECS (4) s while
# gated (--compute 50: alone, its turn is re-granted at once) and again while ungated (no
# setting: the shim's fast path), the same process and CPUs, the setting flipped between.
#   OUT=/some/dir bash bundle/tests/gpu/gate_profile.sh
# Writes $OUT/perf-{gated,ungated}.txt (top symbols by DSO, self time) and a short summary
# last: samples per DSO in each state, the process's CPU time per step, and the shim's own
# profile of its gated launches (FGPU_GATE_PROFILE=1: the gate's host time per launch and
# each kind of driver call it makes). Without perf (the H200 image has none) it says so.
# SHIM_ENV="VAR=V ..." adds variables for the worker (e.g. FGPU_GATE_BATCH_US=8000).
set -u
. "$(dirname "$0")/env.sh"  # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
SECS=${PROF_SECS:-4}
SOCK=/tmp/fgpu-prof/fgpu.sock
ADMIN=/tmp/fgpu-prof-admin/fgpu.sock
BPF=/sys/fs/bpf/fgpu-prof
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)/fgpu-prof
mkdir -p "$OUT" "$(dirname "$SOCK")" "$(dirname "$ADMIN")" "$CG"
WORK=$(mktemp -d /tmp/fgpu-prof.XXXX)
agent=""
cleanup() {
  [ -n "$(cat "$CG/cgroup.procs" 2>/dev/null)" ] && echo 1 > "$CG/cgroup.kill"
  sleep 0.5; rmdir "$CG" 2>/dev/null
  [ -n "$agent" ] && kill "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
  rm -rf "$BPF" "$WORK"
}
trap cleanup EXIT
"$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" --bpf-dir "$BPF" \
  --state-dir "$WORK/state" --log info > "$OUT/agent.log" 2>&1 &
agent=$!
for _ in $(seq 150); do [ -S "$ADMIN" ] && break; sleep 0.1; done
[ -S "$ADMIN" ] || { echo "FAIL: agent did not start"; exit 1; }
fgpu() { "$FGPU" "$@" --socket "$ADMIN"; }
total=$((6 * SECS + 8))
sh -c "echo \$\$ > $CG/cgroup.procs; exec unshare --pid --fork --mount-proc --kill-child \"\$@\"" sh \
  timeout -k 5 $((total + 60)) env LD_PRELOAD="$SHIM" FGPU_SOCKET="$SOCK" FGPU_LOG=info FGPU_GATE_PROFILE=1 ${SHIM_ENV:-} "$PY" "$HERE/workloads.py" cnn \
  --seconds "$total" --warmup 1 --ready "$WORK/ready" --go "$WORK/go" > "$OUT/worker.log" 2>&1 &
w=$!
for _ in $(seq 1200); do [ -f "$WORK/ready" ] && break; kill -0 $w 2>/dev/null || break; sleep 0.1; done
date +%s.%N > "$WORK/go.tmp" && mv "$WORK/go.tmp" "$WORK/go"  # whole, never read half-written
sleep 3
pid=$(for p in $(cat "$CG/cgroup.procs"); do grep -q workloads.py "/proc/$p/cmdline" 2>/dev/null \
  && ! grep -q timeout "/proc/$p/comm" && echo "$p"; done | tail -1)
[ -n "$pid" ] || { echo "FAIL: the worker is not running"; tail -5 "$OUT/worker.log"; exit 1; }
have_perf=$(command -v perf || true)
: > "$OUT/windows.txt"
for round in 1 2 3; do
  for state in gated ungated; do
    if [ $state = gated ]; then fgpu limit set /fgpu-prof --compute 50 >/dev/null; else fgpu limit rm /fgpu-prof >/dev/null; fi
    sleep 0.5
    t0=$(date +%s.%N); c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    if [ -n "$have_perf" ] && [ "$round" = 1 ]; then
      timeout $((SECS + 20)) perf record -F 1999 -g -p "$pid" -o "$WORK/$state.data" -- sleep "$SECS" > /dev/null 2>&1
    else
      sleep "$SECS"
    fi
    t1=$(date +%s.%N); c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    echo "$state $round $t0 $t1 $(( c1 - c0 ))" >> "$OUT/windows.txt"
  done
done
wait $w
for state in gated ungated; do
  [ -f "$WORK/$state.data" ] || continue
  perf report -i "$WORK/$state.data" --no-children --sort dso,sym --stdio 2> /dev/null | grep -E '^ +[0-9]' | head -80 > "$OUT/perf-$state.txt"
  perf report -i "$WORK/$state.data" --no-children --sort dso --stdio 2> /dev/null | grep -E '^ +[0-9]' | head -20 > "$OUT/perf-dso-$state.txt"
done
"$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
res = next(json.loads(l[7:]) for l in open(f"{out}/worker.log") if l.startswith("RESULT "))
prog = res["progress"]
def rate(t0, t1):
    pts = [p for p in prog if t0 <= p[0] <= t1]
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) if len(pts) > 1 else float("nan")
rows = [l.split() for l in open(f"{out}/windows.txt")]
print("state round steps/s cpu-ticks/step")
for st, rd, t0, t1, ticks in rows:
    r = rate(float(t0), float(t1))
    print(st, rd, f"{r:.1f}", f"{int(ticks) / max(1, r * (float(t1) - float(t0))):.3f}")
PYEOF
for state in gated ungated; do
  [ -s "$OUT/perf-dso-$state.txt" ] && { echo "== perf $state (self time by DSO)"; head -8 "$OUT/perf-dso-$state.txt"; }
done
[ -n "$have_perf" ] || echo "INFO: no perf on this machine: step rates and the gate's own profile only"
# The gate's own timing of its gated launches (FGPU_GATE_PROFILE=1, docs/compute.md).
grep -h "compute gate" "$OUT/worker.log" || echo "INFO: no gate lines in the worker's log"
[ -s "$OUT/perf-gated.txt" ] && { echo "== gated, top symbols"; head -25 "$OUT/perf-gated.txt"; }
exit 0
