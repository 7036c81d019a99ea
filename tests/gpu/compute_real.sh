#!/usr/bin/env bash
# H200 check of compute shares for everyday workloads (issue 10). From the bundle's parent:
#   OUT=/some/dir bash bundle/tests/gpu/compute_real.sh
# "Containers" = cgroup v2 + own PID namespace with its own /proc; workloads from
# workloads.py (cnn = ResNet-18 training step with loss.item(), attn = flash attention fwd+bwd,
# graph = CUDA-graph matmul replays, decoder = token-by-token decoding, matmul).
#   ref*       each workload alone without fgpu (the references; ref2p: two cnn processes in
#              one container)
#   slice*     the same mixes without fgpu (the driver's own time-slicing, for comparison)
#   s25        cnn 25 / attn 75               s3   cnn 20 / attn 30 / graph 50
#   mp         a container with two cnn processes vs one with one, 50 / 50
#   dec        decoder 50 / cnn 50
#   kill       cnn 50 / attn 50; the cnn container is killed mid-run (cgroup.kill, like
#              `docker kill`), then a new cnn process starts in it
#   alone50    decoder, then cnn, each alone at --compute 50 (gated, nobody else waits): the
#              gated path's own cost; ab: the same interleaved with bare runs (ab1-bare-decoder,
#              ab1-gated-decoder, ab2-..., ab1-bare-cnn, ab1-gated-cnn; AB_ROLES="decoder
#              decoder cnn" by default; also tiny = 100 one-element adds + sync, launches =
#              1000 empty-kernel cuLaunchKernel calls through ctypes + sync)
#   s30 / s50  issue 6's matmul / graph pair; bareN / fullN: matmul without fgpu vs
#              --compute 100 under agent + shim, interleaved
# ILV="dec mp s25 s3": those mixes also interleaved with their workloads alone, window by
# window on the same processes (ilv_phase below: shares free of the machine's drift; with
# NO_REFS=1 ONLY=none nothing else runs, e.g. NO_REFS=1 ONLY=none ILV="dec s3" ~2.5 min);
# ONLY="s25 dec ..." runs the references and just those phases; VARIANTS="ov:FGPU_COMPUTE_OVERLAP=1"
# runs the chosen mixes again under an agent with those tuning overrides (phases MIX@ov);
# TRACE=1 writes every worker's step times ($OUT/PHASE-TENANT-N.trace.json). PASS/FAIL lines and a table
# last (also $OUT/compute_real.txt); details in $OUT/compute_real.json, worker logs in
# $OUT/PHASE-TENANT-N.log, `fgpu status --json` near the end of each gated phase in
# $OUT/status-PHASE.json, the agent's log (debug lines of the controller) in $OUT/agent.log.
set -u
. "$(dirname "$0")/env.sh"  # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
SECS=${SECS:-6}   # measured seconds of a phase (after WARM s of warm-up)
WARM=${WARM:-2}
SOCK=/tmp/fgpu-real/fgpu.sock
ADMIN=/tmp/fgpu-real-admin/fgpu.sock
BPF=/sys/fs/bpf/fgpu-real
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
RUNS=$OUT/runs.jsonl
export PATH=/usr/local/nvidia/bin:$PATH
unset LD_PRELOAD FGPU_SOCKET FGPU_LOG FGPU_COMPUTE_SHARE FGPU_MEMORY_LIMIT
mkdir -p "$OUT"
: > "$OUT/agent.log"
: > "$RUNS"
for f in "$FGPU" "$SHIM" "$PY" "$LIBCUDA"; do [ -e "$f" ] || { echo "FAIL: no $f"; exit 2; }; done
[ -n "$CG" ] || { echo "FAIL: no cgroup2 mount"; exit 2; }
WORK=$(mktemp -d /tmp/fgpu-real.XXXX)
TENANTS="a b c"
# The CLI's door: the admin socket where the agent has one (`fgpu agent --help`).
ADMIN_ARGS=()
"$FGPU" agent --help 2>/dev/null | grep -q -- --admin-socket && ADMIN_ARGS=(--admin-socket "$ADMIN")
cli_sock() { if [ ${#ADMIN_ARGS[@]} -gt 0 ]; then echo "$ADMIN"; else echo "$SOCK"; fi; }

agent_pid=""
wd_pid=""
reported=""
smi_pid=""
cleanup() {
  [ -n "$wd_pid" ] && kill "$wd_pid" 2>/dev/null
  [ -n "$smi_pid" ] && kill "$smi_pid" 2>/dev/null
  [ -n "${nvml_pid:-}" ] && kill "$nvml_pid" 2>/dev/null
  reap 2>/dev/null
  for n in $TENANTS; do rmdir "$CG/fgpu-real-$n" 2>/dev/null; done
  stop_agent
  rm -rf "$WORK"
  [ -n "$reported" ] || report
}
report() {
  reported=1
  echo
  echo "================ compute shares, everyday workloads, on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) ================"
  "$PY" "$HERE/compute_real.py" --runs "$RUNS" --out "$OUT" | tee "$OUT/compute_real.txt"
  local rc=${PIPESTATUS[0]}
  # The probes (toggle windows, NVML samples per phase), when any ran.
  if [ -s "$OUT/toggles.txt" ] || [ -s "$OUT/nvml.jsonl" ]; then
    "$PY" "$HERE/compute_probe.py" --out "$OUT" | tee "$OUT/compute_probe.txt"
  fi
  # Few files come back from a GPU machine: pack the traces and worker logs.
  (cd "$OUT" && tar -czf workers.tgz ./*.trace.json ./*-[abc]-[0-9].log 2>/dev/null \
    && rm -f ./*.trace.json ./*-[abc]-[0-9].log)
  return "$rc"
}
start_agent() {
  rm -rf "$BPF"; rm -f "$SOCK" "$ADMIN"; mkdir -p "$(dirname "$SOCK")"
  # shellcheck disable=SC2086
  env FGPU_LOG= ${AGENT_ENV:-} "$FGPU" agent --socket "$SOCK" "${ADMIN_ARGS[@]}" --libcuda "$LIBCUDA" --bpf-dir "$BPF" \
    --state-dir "$WORK/state" --log "${AGENT_LOG:-info,fgpu::agent::compute=debug}" >> "$OUT/agent.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 150); do [ -S "$(cli_sock)" ] && break; kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done
  [ -S "$(cli_sock)" ] || { echo "FAIL: agent did not start"; tail -20 "$OUT/agent.log"; exit 1; }
}
stop_agent() {
  [ -n "$agent_pid" ] && { kill "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null; }
  agent_pid=""
  rm -rf "$BPF"; rm -f "$SOCK" "$ADMIN"
}
fgpu() { "$FGPU" "$@" --socket "$(cli_sock)"; }
limits() { # "A_ARGS" "B_ARGS" "C_ARGS": replace the cgroups' limits ("" = none)
  local n args i=0
  local -a all=("$@")
  for n in $TENANTS; do
    args=${all[$i]:-}; i=$((i + 1))
    fgpu limit rm "/fgpu-real-$n" >> "$OUT/limits.log" 2>&1
    # shellcheck disable=SC2086
    [ -n "$args" ] && { fgpu limit set "/fgpu-real-$n" $args >> "$OUT/limits.log" 2>&1 \
      || { echo "FAIL: fgpu limit set /fgpu-real-$n $args"; tail -5 "$OUT/limits.log"; exit 1; }; }
  done
}
in_container() { # NAME CMD...
  local n=$1; shift
  sh -c "echo \$\$ > $CG/fgpu-real-$n/cgroup.procs; exec unshare --pid --fork --mount-proc --kill-child \"\$@\"" sh "$@"
}
reap() {
  local n
  for n in $TENANTS; do
    [ -n "$(cat "$CG/fgpu-real-$n/cgroup.procs" 2>/dev/null)" ] || continue
    echo 1 > "$CG/fgpu-real-$n/cgroup.kill"
    for _ in $(seq 30); do [ -n "$(cat "$CG/fgpu-real-$n/cgroup.procs")" ] || break; sleep 0.1; done
  done
}
# worker PHASE TENANT N ROLE MODE SECS WARM GO: one worker in its container, in the background.
worker() {
  local phase=$1 t=$2 n=$3 role=$4 mode=$5 secs=$6 warm=$7 go=$8
  local -a envs
  # SHIM_ENV="VAR=V ...": more variables for every process under the shim (the gate's
  # experiment overrides, docs/compute.md).
  # shellcheck disable=SC2206
  local -a shim_env=(${SHIM_ENV:-})
  if [ "$mode" = fgpu ]; then envs=(env LD_PRELOAD="$SHIM" FGPU_SOCKET="$SOCK" FGPU_LOG=info "${shim_env[@]}")
  elif [ "$mode" = fgpu-old ]; then envs=(env LD_PRELOAD="$SHIM_OLD" FGPU_SOCKET="$SOCK" FGPU_LOG=info)
  elif [ "$mode" = fgpu-local ]; then
    envs=(env LD_PRELOAD="$SHIM" FGPU_SOCKET=/nonexistent FGPU_COMPUTE_SHARE=99 FGPU_LOG=info)
  else envs=(env -u LD_PRELOAD -u FGPU_SOCKET -u FGPU_LOG); fi
  # PIN=1 (the default; PIN=0 turns it off): every workload on CPUs of its own, the same
  # alone and in a mix (the machine's vCPUs differ in speed and change; a role's runs alone
  # and gated then share their CPUs: on the H200 the decoder / cnn mix passed twice pinned,
  # 52.2 / 56.1 and 52.5 / 54.8, and moved between 34 and 56 for the decoder unpinned).
  local -a pin=()
  if [ "${PIN:-1}" != 0 ]; then
    case $role in
      decoder) pin=(taskset -c 2,3) ;; cnn) pin=(taskset -c 4-7) ;; attn) pin=(taskset -c 8,9) ;;
      graph) pin=(taskset -c 10,11) ;; *) pin=(taskset -c 12-15) ;;
    esac
  fi
  in_container "$t" "${pin[@]}" timeout -k 5 $((120 + warm + secs)) "${envs[@]}" "$PY" "$HERE/workloads.py" "$role" \
    --seconds "$secs" --warmup "$warm" --ready "$WORK/$phase.$t.$n.ready" --go "$go" \
    ${TRACE:+--trace "$OUT/$phase-$t-$n.trace.json"} \
    > "$OUT/$phase-$t-$n.log" 2>&1 &
}
record() { # PHASE TENANT N ROLE MODE RC
  printf '{"phase":"%s","tenant":"%s","n":%d,"role":"%s","mode":"%s","rc":%d,"log":"%s"}\n' \
    "$1" "$2" "$3" "$4" "$5" "$6" "$OUT/$1-$2-$3.log" >> "$RUNS"
}
# phase NAME TENANT:ROLE:MODE...  (a tenant named twice runs two processes in its container)
phase() {
  local name=$1; shift
  local spec t role mode i ready pending start rc
  local -a pids=() specs=("$@") idx=()
  declare -A count=()
  echo "== $name: $* (${WARM} s warm-up + ${SECS} s measured)"
  for spec in "${specs[@]}"; do
    IFS=: read -r t role mode <<< "$spec"
    count[$t]=$(( ${count[$t]:-0} + 1 ))
    idx+=("${count[$t]}")
    worker "$name" "$t" "${count[$t]}" "$role" "$mode" "$SECS" "$WARM" "$WORK/$name.go"
    pids+=($!)
  done
  for _ in $(seq 1200); do
    ready=0 pending=0
    for i in "${!specs[@]}"; do
      if [ -f "$WORK/$name.${specs[$i]%%:*}.${idx[$i]}.ready" ]; then ready=$((ready + 1))
      elif kill -0 "${pids[$i]}" 2>/dev/null; then pending=$((pending + 1)); fi
    done
    [ "$pending" = 0 ] && break
    sleep 0.1
  done
  [ "$ready" = "${#specs[@]}" ] || echo "WARN: $name: $ready of ${#specs[@]} workers got ready"
  start=$(awk -v t="$(date +%s.%N)" 'BEGIN { printf "%.3f", t + 0.5 }')
  echo "$start" > "$WORK/$name.go.tmp" && mv "$WORK/$name.go.tmp" "$WORK/$name.go"
  echo "PHASE-START $name" >> "$OUT/agent.log"
  echo "$name start $start" >> "$OUT/phases.txt"
  if [ -n "$agent_pid" ]; then
    sleep "$(awk -v w="$WARM" -v s="$SECS" 'BEGIN { print w + s - 0.7 }')"
    fgpu status --json > "$OUT/status-$name.json" 2>&1
    fgpu status 2>&1 | sed 's/^/   /'
  fi
  for i in "${!specs[@]}"; do
    wait "${pids[$i]}"; rc=$?
    IFS=: read -r t role mode <<< "${specs[$i]}"
    record "$name" "$t" "${idx[$i]}" "$role" "$mode" "$rc"
    [ "$rc" = 0 ] || { echo "   $name/$t-${idx[$i]} exited $rc:"; tail -3 "$OUT/$name-$t-${idx[$i]}.log" | sed 's/^/   /'; }
  done
  echo "PHASE-END $name" >> "$OUT/agent.log"
  echo "$name end $(date +%s.%N)" >> "$OUT/phases.txt"
  reap
}
# The kill phase: cnn (a) and attn (b) at 50/50 under the agent for 16 s. A second cnn
# process in a's container is set up beside the first but waits at its own start line (like
# a supervisor's replacement worker). 5 s into the measurement the first one is SIGKILLed;
# 1.5 s later the second starts (1 s warm-up + 8 s measured, inside b's run).
kill_phase() {
  local pa pb pc victim
  echo "== kill: a cnn 50 / b attn 50; a's process SIGKILLed mid-run, then a new one in a"
  worker kill a 1 cnn fgpu 16 "$WARM" "$WORK/kill.go"; pa=$!
  worker kill b 1 attn fgpu 16 "$WARM" "$WORK/kill.go"; pb=$!
  worker kill a 2 cnn fgpu 8 1 "$WORK/kill.go2"; pc=$!
  for _ in $(seq 1200); do
    [ -f "$WORK/kill.a.1.ready" ] && [ -f "$WORK/kill.b.1.ready" ] && [ -f "$WORK/kill.a.2.ready" ] && break
    kill -0 $pa 2>/dev/null && kill -0 $pb 2>/dev/null && kill -0 $pc 2>/dev/null || break
    sleep 0.1
  done
  awk -v t="$(date +%s.%N)" 'BEGIN { printf "%.3f", t + 0.5 }' > "$WORK/kill.go.tmp" && mv "$WORK/kill.go.tmp" "$WORK/kill.go"
  sleep "$(awk -v w="$WARM" 'BEGIN { print w + 0.5 + 5 }')"
  victim=$(pgrep -f "kill\.a\.1\.ready" | while read -r p; do
    grep -q workloads.py "/proc/$p/cmdline" 2>/dev/null && ! grep -q timeout "/proc/$p/comm" && echo "$p"; done | tail -1)
  echo "{\"t_kill\": $(date +%s.%N), \"pid\": ${victim:-0}}" > "$OUT/kill-time.json"
  [ -n "$victim" ] && kill -KILL "$victim"
  wait $pa; record kill a 1 cnn fgpu $?
  sleep 1.5
  date +%s.%N > "$WORK/kill.go2"
  sleep 5
  fgpu status --json > "$OUT/status-kill.json" 2>&1
  wait $pc; record kill a 2 cnn fgpu $?
  wait $pb; record kill b 1 attn fgpu $?
  reap
}

# The join phase (issue 25): attn (a) at 50 runs alone; 4 s into its measurement a cnn
# process is *started* in b at 50 — it imports PyTorch, builds ResNet-18 and benchmarks
# cuDNN beside the running attn (the light warm-up that used to buy a catch-up), then runs
# 10 s. Per-second rates of both from the cnn's first measured step (compute_real.py).
join_phase() { # SUFFIX: the phase is join SUFFIX (a variant's: join@NAME)
  local pa pb p=join$1
  echo "== $p: a attn 50 alone, then a cnn process started in b at 50 (it warms up beside a)"
  limits "--compute 50" "--compute 50" ""
  worker "$p" a 1 attn fgpu 24 "$WARM" "$WORK/$p.go"; pa=$!
  for _ in $(seq 1200); do [ -f "$WORK/$p.a.1.ready" ] && break; kill -0 $pa 2>/dev/null || break; sleep 0.1; done
  awk -v t="$(date +%s.%N)" 'BEGIN { printf "%.3f", t + 0.5 }' > "$WORK/$p.go.tmp" && mv "$WORK/$p.go.tmp" "$WORK/$p.go"
  echo "PHASE-START $p" >> "$OUT/agent.log"
  echo "$p start $(cat "$WORK/$p.go")" >> "$OUT/phases.txt"
  sleep "$(awk -v w="$WARM" 'BEGIN { print w + 0.5 + 4 }')"
  echo "{\"t_start_b\": $(date +%s.%N)}" > "$OUT/$p-time.json"
  # Its go file is already there: it starts as soon as it is ready (1 s warm-up).
  date +%s.%N > "$WORK/$p.go2"
  worker "$p" b 1 cnn fgpu 10 1 "$WORK/$p.go2"; pb=$!
  sleep 8
  fgpu status --json > "$OUT/status-$p.json" 2>&1
  wait $pb; record "$p" b 1 cnn fgpu $?
  wait $pa; record "$p" a 1 attn fgpu $?
  echo "PHASE-END $p" >> "$OUT/agent.log"
  echo "$p end $(date +%s.%N)" >> "$OUT/phases.txt"
  reap
}

# The interleaved phase (ILV="dec mp s25 s3"): the mix's workers run for the whole phase
# while its windows rotate, each ILV_WIN s (default 3; the first ILV_SETTLE s, default 0.3,
# of each are left out):
#   mix        every tenant at its setting, all running (the share being measured)
#   alone-T    tenant T alone, ungated (no setting: the shim's fast path), the others frozen
#              (cgroup.freeze, like `docker pause`): its rate without fgpu, seconds from the
#              mix windows beside it on the same processes and CPUs
#   slice      every tenant ungated and running: the driver's own time-slicing
# in the order mix, alone-a, slice, alone-b, [mix, alone-c,] ... for ILV_ROUNDS rotations
# (default 3). The machine's speed drifts by 10-40% over minutes (docs/benchmarks.md); over
# the seconds between two windows it does not, so each share is a mix window's rate against
# the alone windows beside it. Windows in $OUT/ilv.txt ("PHASE KIND START END").
ilv_phase() { # NAME "SETTINGS_A" "SETTINGS_B" "SETTINGS_C" TENANT:ROLE...
  local name=$1 sa=$2 sb=$3 sc=$4; shift 4
  local spec t role i win=${ILV_WIN:-3} rounds=${ILV_ROUNDS:-3} total n k
  local -a specs=("$@") pids=() idx=() order=() ts=()
  declare -A count=()
  for spec in "${specs[@]}"; do
    IFS=: read -r t role <<< "$spec"
    [[ " ${ts[*]} " == *" $t "* ]] || ts+=("$t")
  done
  for _ in $(seq "$rounds"); do for t in "${ts[@]}"; do order+=(mix "alone-$t"); done; order+=(slice); done
  n=${#order[@]}
  total=$(awk -v n="$n" -v w="$win" 'BEGIN { printf "%d", n * w + 1.999 }')
  echo "== ilv-$name: ${specs[*]} (${WARM} s warm-up, then $n windows of $win s: ${order[*]})"
  limits "" "" ""
  for spec in "${specs[@]}"; do
    IFS=: read -r t role <<< "$spec"
    count[$t]=$(( ${count[$t]:-0} + 1 ))
    idx+=("${count[$t]}")
    worker "ilv-$name" "$t" "${count[$t]}" "$role" fgpu "$total" "$WARM" "$WORK/ilv-$name.go"
    pids+=($!)
  done
  for _ in $(seq 1200); do
    k=0
    for i in "${!specs[@]}"; do
      [ -f "$WORK/ilv-$name.${specs[$i]%%:*}.${idx[$i]}.ready" ] && k=$((k + 1))
    done
    [ "$k" = "${#specs[@]}" ] && break
    sleep 0.1
  done
  awk -v t="$(date +%s.%N)" 'BEGIN { printf "%.3f", t + 0.5 }' > "$WORK/ilv-$name.go.tmp" && mv "$WORK/ilv-$name.go.tmp" "$WORK/ilv-$name.go"
  echo "PHASE-START ilv-$name" >> "$OUT/agent.log"
  echo "ilv-$name start $(cat "$WORK/ilv-$name.go")" >> "$OUT/phases.txt"
  sleep "$(awk -v w="$WARM" 'BEGIN { print w + 0.5 }')"
  local kind start
  for kind in "${order[@]}"; do
    case $kind in
      mix) limits "$sa" "$sb" "$sc"; for t in "${ts[@]}"; do echo 0 > "$CG/fgpu-real-$t/cgroup.freeze"; done ;;
      slice) limits "" "" ""; for t in "${ts[@]}"; do echo 0 > "$CG/fgpu-real-$t/cgroup.freeze"; done ;;
      alone-*)
        limits "" "" ""
        for t in "${ts[@]}"; do
          if [ "alone-$t" = "$kind" ]; then echo 0 > "$CG/fgpu-real-$t/cgroup.freeze"
          else echo 1 > "$CG/fgpu-real-$t/cgroup.freeze"; fi
        done ;;
    esac
    start=$(date +%s.%N)
    sleep "$win"
    echo "ilv-$name $kind $start $(date +%s.%N)" >> "$OUT/ilv.txt"
    [ "$kind" = mix ] && [ ! -s "$OUT/status-ilv-$name.json" ] && fgpu status --json > "$OUT/status-ilv-$name.json" 2>&1
  done
  for t in "${ts[@]}"; do echo 0 > "$CG/fgpu-real-$t/cgroup.freeze"; done
  limits "" "" ""
  for i in "${!specs[@]}"; do
    wait "${pids[$i]}"; k=$?
    IFS=: read -r t role <<< "${specs[$i]}"
    record "ilv-$name" "$t" "${idx[$i]}" "$role" fgpu "$k"
  done
  echo "PHASE-END ilv-$name" >> "$OUT/agent.log"
  echo "ilv-$name end $(date +%s.%N)" >> "$OUT/phases.txt"
  reap
}

# The toggle phase (TOGGLE_ROLES, default "cnn decoder"): one ROLE process alone under the
# agent for 16 s while its container's setting flips every second between --compute 50
# (gated; alone, its turn is re-granted at once) and none (the ungated fast path): the gate's
# own cost on the same process and CPUs, free of the machine's drift between runs. Flip times
# in $OUT/toggles.txt ("PHASE on|off TIME"); compute_probe.py compares the windows.
toggle_phase() { # ROLE [SUFFIX]
  local r=$1 v=${2:-} p i
  local ph=toggle-$r$v
  limits "" "" ""
  echo "== $ph: a $r alone, --compute 50 / none every second"
  worker "$ph" a 1 "$r" fgpu 16 "$WARM" "$WORK/$ph.go"; p=$!
  for _ in $(seq 1200); do [ -f "$WORK/$ph.a.1.ready" ] && break; kill -0 $p 2>/dev/null || break; sleep 0.1; done
  awk -v t="$(date +%s.%N)" 'BEGIN { printf "%.3f", t + 0.5 }' > "$WORK/$ph.go.tmp" && mv "$WORK/$ph.go.tmp" "$WORK/$ph.go"
  echo "$ph start $(cat "$WORK/$ph.go")" >> "$OUT/phases.txt"
  sleep "$(awk -v w="$WARM" 'BEGIN { print w + 0.5 }')"
  for i in $(seq 7); do
    fgpu limit set /fgpu-real-a --compute 50 >> "$OUT/limits.log" 2>&1
    echo "$ph on $(date +%s.%N)" >> "$OUT/toggles.txt"; sleep 1
    fgpu limit rm /fgpu-real-a >> "$OUT/limits.log" 2>&1
    echo "$ph off $(date +%s.%N)" >> "$OUT/toggles.txt"; sleep 1
  done
  wait $p; record "$ph" a 1 "$r" fgpu $?
  echo "$ph end $(date +%s.%N)" >> "$OUT/phases.txt"
  reap
}

trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
( trap 'kill $s 2>/dev/null; exit 0' TERM; sleep "${DEADLINE:-560}" & s=$!; wait $s
  echo "FAIL: compute_real.sh ran past ${DEADLINE:-560} s, stopping" >&2; kill -TERM $$ ) &
wd_pid=$!

{
  echo "date: $(date -u +%FT%TZ)"
  echo "kernel: $(uname -r)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import torch, torchvision; print("torch", torch.__version__, "cuda", torch.version.cuda, "torchvision", torchvision.__version__)'
  sha256sum "$SHIM" "$FGPU"
  [ -f "$B/MANIFEST" ] && cat "$B/MANIFEST"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"
for n in $TENANTS; do mkdir -p "$CG/fgpu-real-$n" || exit 1; done
reap
# The GPU's clocks and power through the run (per phase in the report).
: > "$OUT/phases.txt"
: > "$OUT/toggles.txt"
: > "$OUT/ilv.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu \
  --format=csv,noheader,nounits -lms 200 > "$OUT/smi.csv" 2>/dev/null &
smi_pid=$!
# NVML=1: NVML's per-process SM utilisation samples through the run ($OUT/nvml.jsonl).
nvml_pid=""
if [ -n "${NVML:-}" ]; then
  "$PY" "$HERE/nvml_probe.py" "$OUT/nvml.jsonl" & nvml_pid=$!
fi
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

# WARM_VM=GIB: touch that much host memory once before the references (a fresh VM backs its
# memory on first touch; the first processes of a run were slower).
if [ -n "${WARM_VM:-}" ]; then
  timeout 60 "$PY" -c "import numpy as np; a = np.ones(${WARM_VM} << 27); print('touched', a.nbytes >> 30, 'GiB')"
fi
# NO_REFS=1: no runs alone before and after (the interleaved mixes carry their own).
if [ -z "${NO_REFS:-}" ]; then
  phase ref-cnn a:cnn:bare
  phase ref-attn a:attn:bare
fi
{ want s3 || want s30 || want s50; } && phase ref-graph a:graph:bare
{ want dec || want alone50; } && phase ref-decoder a:decoder:bare
{ want s30 || want s50 || want full; } && phase ref-matmul a:matmul:bare
want mp && phase ref2p a:cnn:bare a:cnn:bare
if [ -z "${NO_SLICE:-}" ]; then # NO_SLICE=1: skip the time-slicing comparisons
  want s25 && phase slice25 a:cnn:bare b:attn:bare
  want dec && phase slicedec a:decoder:bare b:cnn:bare
  want s3 && phase slice3 a:cnn:bare b:attn:bare c:graph:bare
fi

start_agent
if want alone50; then # the gated path alone (its turn re-granted at once): its cost per launch
  limits "--compute 50" "" ""
  phase alone50-decoder a:decoder:fgpu
  phase alone50-cnn a:cnn:fgpu
fi
if want ab; then # the same, interleaved with bare runs (b has no limit) under the same agent
  limits "--compute 50" "" ""
  declare -A abn=()
  for r in ${AB_ROLES:-decoder decoder cnn}; do
    abn[$r]=$(( ${abn[$r]:-0} + 1 ))
    phase "ab${abn[$r]}-bare-$r" "b:$r:bare"
    phase "ab${abn[$r]}-gated-$r" "a:$r:fgpu"
    # SHIM_OLD=PATH: the same gated run with another build of the shim (A/B of a change)
    [ -n "${SHIM_OLD:-}" ] && phase "ab${abn[$r]}-old-$r" "a:$r:fgpu-old"
    # AB_LOCAL=1: the same under the shim's standalone gate (FGPU_COMPUTE_SHARE=99, no
    # agent): the gate without the agent's turns, watcher and ledger
    [ -n "${AB_LOCAL:-}" ] && phase "ab${abn[$r]}-local-$r" "a:$r:fgpu-local"
  done
fi
# PIN=1 (see worker): each workload on fixed CPUs.
# BRACKET=1: after each mix, its workloads alone again without fgpu (in container c, which
# has no setting then; after mp also the two-process container, ref2pbN): the report takes each share against the nearest run alone
# before and after it (the machine's speed drifts by 10-40% through a run).
BRN=0
br() {
  [ -n "${BRACKET:-}" ] || return 0
  local r
  for r in "$@"; do BRN=$((BRN + 1)); phase "refb$BRN-$r" "c:$r:bare"; done
}
br2p() { # the two-process container's reference again (BRACKET=1)
  [ -n "${BRACKET:-}" ] || return 0
  BRN=$((BRN + 1)); phase "ref2pb$BRN" c:cnn:bare c:cnn:bare
}
gated_phases() { # SUFFIX: the gated mixes (phase names get SUFFIX, e.g. @ov for a variant)
  local v=$1
  if want s25; then limits "--compute 25" "--compute 75" ""; phase "s25$v" a:cnn:fgpu b:attn:fgpu; br cnn attn; fi
  if want dec; then limits "--compute 50" "--compute 50" ""; phase "dec$v" a:decoder:fgpu b:cnn:fgpu; br decoder cnn; fi
  # fill: the decoder ungated (no setting: it runs whenever it launches) beside the cnn at
  # --compute 50, which then holds every turn: what a decoder co-running in a neighbour's
  # turns gets, and what that costs the neighbour.
  if want fill; then limits "" "--compute 50" ""; phase "fill$v" a:decoder:fgpu b:cnn:fgpu; br decoder cnn; fi
  if want mp; then limits "--compute 50" "--compute 50" ""; phase "mp$v" a:cnn:fgpu a:cnn:fgpu b:cnn:fgpu; br cnn; br2p; fi
  if want s3; then limits "--compute 20" "--compute 30" "--compute 50"; phase "s3$v" a:cnn:fgpu b:attn:fgpu c:graph:fgpu; br cnn attn graph; fi
  if [ -z "$v" ] && want kill; then limits "--compute 50" "--compute 50" ""; kill_phase; br cnn attn; fi
  # dech: the decoder at --compute-priority high (served first within its share).
  if want dech; then limits "--compute 50 --compute-priority high" "--compute 50" ""; phase "dech$v" a:decoder:fgpu b:cnn:fgpu; br decoder cnn; fi
  if want join; then join_phase "$v"; fi
  # cap30: attn alone with --compute-cap 30 on an idle GPU.
  if want cap30; then limits "--compute-cap 30" "" ""; phase "cap30$v" a:attn:fgpu; fi
  if want s30; then limits "--compute 30" "--compute 70" ""; phase "s30$v" a:matmul:fgpu b:graph:fgpu; fi
  if want s50; then limits "--compute 50" "--compute 50" ""; phase "s50$v" a:matmul:fgpu b:graph:fgpu; fi
}
ilv_phases() { # SUFFIX MIX...: the interleaved mixes (phase names ilv-MIX then SUFFIX)
  local v=$1 m; shift
  for m in "$@"; do
    case $m in
      dec) ilv_phase "dec$v" "--compute 50" "--compute 50" "" a:decoder b:cnn ;;
      mp) ilv_phase "mp$v" "--compute 50" "--compute 50" "" a:cnn a:cnn b:cnn ;;
      s25) ilv_phase "s25$v" "--compute 25" "--compute 75" "" a:cnn b:attn ;;
      s3) ilv_phase "s3$v" "--compute 20" "--compute 30" "--compute 50" a:cnn b:attn c:graph ;;
      *) echo "WARN: ILV: no interleaved mix '$m' (dec mp s25 s3)" ;;
    esac
  done
}
gated_phases ""
# shellcheck disable=SC2086
ilv_phases "" ${ILV:-}
if want toggle; then
  for r in ${TOGGLE_ROLES:-cnn decoder}; do toggle_phase "$r"; done
  # SHIM_VARIANTS="NAME:VAR=V,VAR=V ...": the toggle phases again with those variables in the
  # shim's environment (e.g. b8:FGPU_GATE_BATCH_US=8000,FGPU_GATE_BATCH_GPU_US=8000), phases
  # toggle-ROLE%NAME.
  for sv in ${SHIM_VARIANTS:-}; do
    SHIM_ENV=$(echo "${sv#*:}" | tr ',' ' ')
    for r in ${TOGGLE_ROLES:-cnn decoder}; do toggle_phase "$r" "%${sv%%:*}"; done
  done
  SHIM_ENV=
fi
stop_agent
# VARIANTS="NAME:VAR=V,VAR=V ...": the gated mixes again under an agent started with those
# variables (the controller's tuning overrides, docs/compute.md), phases named MIX@NAME;
# FGPU_GATE_* variables go to the gated workers instead (the shim's overrides).
# VARIANT_ONLY="dec mp": the mixes a variant runs (default: ONLY's); VARIANT_ONLY_NAME: the
# mixes of variant NAME alone (e.g. a second sample of dec beside fill variants).
MAIN_ONLY=${ONLY:-}
for variant in ${VARIANTS:-}; do
  vonly=VARIANT_ONLY_${variant%%:*}
  ONLY=${!vonly:-${VARIANT_ONLY:-$MAIN_ONLY}}
  vars=$(echo "${variant#*:}" | tr ',' ' ')
  AGENT_ENV=$(for x in $vars; do case $x in FGPU_GATE_*) ;; *) echo "$x" ;; esac; done | xargs)
  SHIM_ENV=$(for x in $vars; do case $x in FGPU_GATE_*) echo "$x" ;; esac; done | xargs)
  echo "== variant ${variant%%:*}: agent with ${AGENT_ENV:-nothing}, gated workers with ${SHIM_ENV:-nothing}"
  start_agent
  gated_phases "@${variant%%:*}"
  # VARIANT_ILV="dec": the interleaved mixes a variant runs (none by default).
  # shellcheck disable=SC2086
  ilv_phases "@${variant%%:*}" ${VARIANT_ILV:-}
  if want toggle; then for r in ${TOGGLE_ROLES:-cnn decoder}; do toggle_phase "$r" "@${variant%%:*}"; done; fi
  stop_agent
done
AGENT_ENV=
SHIM_ENV=
ONLY=$MAIN_ONLY
if want full; then
  n=0
  for mode in bare fgpu fgpu bare; do
    n=$((n + 1))
    if [ "$mode" = fgpu ]; then
      [ -n "$agent_pid" ] || { start_agent; limits "--compute 100" "" ""; }
      phase "full$n" a:matmul:fgpu
    else
      stop_agent
      phase "bare$n" a:matmul:bare
    fi
  done
  stop_agent
fi
# The references again, last: Python-bound loops vary run to run (the H200 host's CPU), so
# a share is taken against the mean of the two.
for r in $(awk '/"phase":"ref-/ { sub(/.*"phase":"ref-/, ""); sub(/".*/, ""); print }' "$RUNS"); do
  phase "ref2-$r" "a:$r:bare"
done
kill "$wd_pid" 2>/dev/null
wd_pid=""
report
exit $?
