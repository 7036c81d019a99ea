#!/usr/bin/env bash
# H200 check of compute shares under the agent (issue 6). From the bundle's parent folder:
#   OUT=/some/dir bash bundle/tests/gpu/compute_agent.sh
# Two "containers" (cgroup v2 + own PID namespace with its own /proc): a = PyTorch matmul
# loop, b = CUDA-graph replay loop (compute_agent.py, loops from compute_share.py).
#   ref      each alone without fgpu (the references)
#   slice    both at once without fgpu (the driver's time-slicing, for comparison)
#   s30/s50  both at once under the agent and the shim, `fgpu limit set --compute` 30/70, 50/50:
#            achieved share (iter/s / ref) within +-5 points, total >= 90 %
#   cap30    a alone, --compute-cap 30 on an idle GPU: <= 33 %
#   bare/full  a alone without fgpu (no agent, no shim) and with --compute 100 under both,
#            interleaved 3 + 3 runs: median >= 99 %
# PASS/FAIL lines and a table last (also $OUT/compute_agent.txt); details in $OUT/compute_agent.json,
# worker logs (stdout + stderr, with the shim's gate line) in $OUT/PHASE-TENANT.log,
# `fgpu status` during each phase under the agent in $OUT/status-PHASE.{txt,json}.
# About 4-5 minutes; every worker has its own timeout and the whole script stops at 540 s.
set -u
. "$(dirname "$0")/env.sh"  # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
SECS=${SECS:-10}   # measured seconds of a shared phase (after WARM s of warm-up)
WARM=${WARM:-3}
# Two doors: shims get the containers' socket (alone in its directory), the CLI the admin one
# (limits are refused on the containers' door).
SOCK=/tmp/fgpu-cmp/fgpu.sock
ADMIN=/tmp/fgpu-cmp-admin/fgpu.sock
BPF=/sys/fs/bpf/fgpu-cmp
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
RUNS=$OUT/runs.jsonl
export PATH=/usr/local/nvidia/bin:$PATH
unset LD_PRELOAD FGPU_SOCKET FGPU_LOG FGPU_COMPUTE_SHARE FGPU_MEMORY_LIMIT
mkdir -p "$OUT"
: > "$OUT/agent.log"
: > "$RUNS"
rm -f "$OUT"/status-{s30,s50,cap30,full[0-9]}.{txt,json,err} "$OUT/limits.log"
for f in "$FGPU" "$SHIM" "$PY" "$LIBCUDA"; do [ -e "$f" ] || { echo "FAIL: no $f"; exit 2; }; done
[ -n "$CG" ] || { echo "FAIL: no cgroup2 mount"; exit 2; }
WORK=$(mktemp -d /tmp/fgpu-cmp.XXXX)

agent_pid=""
wd_pid=""
reported=""
cleanup() {
  [ -n "$wd_pid" ] && kill "$wd_pid" 2>/dev/null
  reap 2>/dev/null
  rmdir "$CG/fgpu-cmp-a" "$CG/fgpu-cmp-b" 2>/dev/null
  stop_agent
  rm -rf "$WORK"
  [ -n "$reported" ] || report # stopped early: the criteria on what was measured
}
report() { # the criteria and the table, last on stdout
  reported=1
  echo
  echo "================ compute shares under the agent on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) ================"
  "$PY" "$HERE/compute_agent.py" --analyze --runs "$RUNS" --out "$OUT" | tee "$OUT/compute_agent.txt"
  return "${PIPESTATUS[0]}"
}
start_agent() {
  rm -rf "$BPF"; rm -f "$SOCK" "$ADMIN"
  "$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" --bpf-dir "$BPF" \
    --state-dir "$WORK/state" --log "${AGENT_LOG:-info}" >> "$OUT/agent.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 150); do [ -S "$ADMIN" ] && break; kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done
  [ -S "$ADMIN" ] || { echo "FAIL: agent did not start"; tail -20 "$OUT/agent.log"; exit 1; }
}
stop_agent() { # the probes stay pinned after the agent exits: removing the pins detaches them
  [ -n "$agent_pid" ] && { kill "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null; }
  agent_pid=""
  rm -rf "$BPF"; rm -f "$SOCK" "$ADMIN"
}
limits() { # A_ARGS B_ARGS: replace both cgroups' limits ("" = none); `limit set` merges, so rm first
  local n args
  for n in a b; do
    [ "$n" = a ] && args=$1 || args=$2
    "$FGPU" limit rm "/fgpu-cmp-$n" --socket "$ADMIN" >> "$OUT/limits.log" 2>&1
    # shellcheck disable=SC2086
    [ -n "$args" ] && { "$FGPU" limit set "/fgpu-cmp-$n" $args --socket "$ADMIN" >> "$OUT/limits.log" 2>&1 \
      || { echo "FAIL: fgpu limit set /fgpu-cmp-$n $args"; tail -5 "$OUT/limits.log"; exit 1; }; }
  done
  "$FGPU" limit ls --socket "$ADMIN" >> "$OUT/limits.log" 2>&1
}
in_container() { # NAME CMD...: run CMD in cgroup fgpu-cmp-NAME and a new PID namespace (own /proc)
  local n=$1; shift
  sh -c "echo \$\$ > $CG/fgpu-cmp-$n/cgroup.procs; exec unshare --pid --fork --mount-proc --kill-child \"\$@\"" sh "$@"
}
reap() { # kill whatever is left in the cgroups and wait until they are empty
  local n
  for n in a b; do
    [ -n "$(cat "$CG/fgpu-cmp-$n/cgroup.procs" 2>/dev/null)" ] || continue # (stat size is 0)
    echo 1 > "$CG/fgpu-cmp-$n/cgroup.kill"
    for _ in $(seq 30); do [ -n "$(cat "$CG/fgpu-cmp-$n/cgroup.procs")" ] || break; sleep 0.1; done
  done
}

# phase NAME SECS WARM TENANT:ROLE:MODE:SETTING...  (MODE bare = no shim, fgpu = LD_PRELOAD + agent)
# Starts one worker per spec in its container, waits until all are set up, gives them one start
# time, saves `fgpu status` near the end of the measurement (when the agent runs), waits.
phase() {
  local name=$1 secs=$2 warm=$3; shift 3
  local spec tenant role mode setting i ready pending start rc
  local -a pids=() specs=("$@") envs
  rm -f "$WORK/$name".*
  echo "== $name: $* (${warm} s warm-up + ${secs} s measured)"
  for spec in "${specs[@]}"; do
    IFS=: read -r tenant role mode setting <<< "$spec"
    if [ "$mode" = fgpu ]; then
      envs=(env LD_PRELOAD="$SHIM" FGPU_SOCKET="$SOCK" FGPU_LOG=info)
    else
      envs=(env -u LD_PRELOAD -u FGPU_SOCKET -u FGPU_LOG)
    fi
    in_container "$tenant" timeout -k 5 $((150 + warm + secs + 30)) "${envs[@]}" \
      "$PY" "$HERE/compute_agent.py" --worker "$role" --seconds "$secs" --warmup "$warm" \
      --ready "$WORK/$name.$tenant.ready" --go "$WORK/$name.go" > "$OUT/$name-$tenant.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 1200); do # up to 120 s to import torch, set up and capture
    ready=0 pending=0
    for i in "${!specs[@]}"; do
      if [ -f "$WORK/$name.${specs[$i]%%:*}.ready" ]; then ready=$((ready + 1))
      elif kill -0 "${pids[$i]}" 2>/dev/null; then pending=$((pending + 1)); fi # else died
    done
    [ "$pending" = 0 ] && break
    sleep 0.1
  done
  [ "$ready" = "${#specs[@]}" ] || echo "WARN: $name: $ready of ${#specs[@]} workers got ready (see $OUT/$name-*.log)"
  start=$(awk -v t="$(date +%s.%N)" 'BEGIN { printf "%.3f", t + 0.5 }')
  echo "$start" > "$WORK/$name.go.tmp" && mv "$WORK/$name.go.tmp" "$WORK/$name.go"
  if [ -n "$agent_pid" ]; then
    # Near the end of the measured window: the agent's GPU-TIME covers the last 5 s.
    sleep "$(awk -v w="$warm" -v s="$secs" 'BEGIN { print w + s - 0.7 }')"
    "$FGPU" status --socket "$ADMIN" > "$OUT/status-$name.txt" 2>&1
    "$FGPU" status --json --detail --socket "$ADMIN" > "$OUT/status-$name.json" 2> "$OUT/status-$name.err"
    sed 's/^/   /' "$OUT/status-$name.txt"
  fi
  for i in "${!specs[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    IFS=: read -r tenant role mode setting <<< "${specs[$i]}"
    printf '{"phase":"%s","tenant":"%s","role":"%s","mode":"%s","setting":"%s","rc":%d,"log":"%s"}\n' \
      "$name" "$tenant" "$role" "$mode" "$setting" "$rc" "$OUT/$name-$tenant.log" >> "$RUNS"
    [ "$rc" = 0 ] || { echo "   $name/$tenant exited $rc:"; tail -5 "$OUT/$name-$tenant.log" | sed 's/^/   /'; }
  done
  reap
}

trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
# Watchdog: the device tool allows 600 s a call; stop (and clean up) before that.
( trap 'kill $s 2>/dev/null; exit 0' TERM; sleep "${DEADLINE:-540}" & s=$!; wait $s
  echo "FAIL: compute_agent.sh ran past ${DEADLINE:-540} s, stopping" >&2; kill -TERM $$ ) &
wd_pid=$!

{
  echo "date: $(date -u +%FT%TZ)"
  echo "kernel: $(uname -r)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "compute processes before the run:"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  sha256sum "$SHIM" "$FGPU"
  [ -f "$B/MANIFEST" ] && cat "$B/MANIFEST"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

mkdir -p "$CG/fgpu-cmp-a" "$CG/fgpu-cmp-b" || exit 1
reap # left over from an earlier run that was stopped hard

# ONLY="s30 cap30 ...": the references and just these phases (a quicker look).
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

# 1-2: no fgpu at all (no agent, no shim).
phase ref "$SECS" "$WARM" a:matmul:bare:-
phase ref "$SECS" "$WARM" b:graph:bare:-
want slice && phase slice "$SECS" "$WARM" a:matmul:bare:- b:graph:bare:-

# 3, 4, 6: under the agent.
start_agent
if want s30; then
  limits "--compute 30" "--compute 70"
  phase s30 "$SECS" "$WARM" a:matmul:fgpu:share30 b:graph:fgpu:share70
fi
if want s50; then
  limits "--compute 50" "--compute 50"
  phase s50 "$SECS" "$WARM" a:matmul:fgpu:share50 b:graph:fgpu:share50
fi
if want cap30; then
  limits "--compute-cap 30" ""
  phase cap30 8 2 a:matmul:fgpu:cap30
fi
stop_agent

# 5: --compute 100 under agent + shim vs no fgpu at all, interleaved (bare full full bare bare
# full: a linear drift weighs on both alike; medians of 3).
n=0

for mode in $(want full && echo bare fgpu fgpu bare bare fgpu); do
  n=$((n + 1))
  if [ "$mode" = fgpu ]; then
    [ -n "$agent_pid" ] || { start_agent; limits "--compute 100" ""; }
    phase "full$n" 5 2 a:matmul:fgpu:share100
  else
    stop_agent
    phase "bare$n" 5 2 a:matmul:bare:-
  fi
done
stop_agent

kill "$wd_pid" 2>/dev/null
wd_pid=""
report
exit $?
