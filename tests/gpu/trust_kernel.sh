#!/usr/bin/env bash
# H200 check of the kernel side against a hostile bypasser on the real libcuda: calls in
# flight, rewritten output slots, cgroup floods, and tenants without a limit. From the bundle's parent folder:   OUT=/some/dir bash bundle/tests/gpu/trust_kernel.sh
# The attacker is fgpu-agent/tests/hostile/hostile.c, built on the build machine into
# bundle/tests/gpu/hostile (HOSTILE=... overrides; cc builds it here if it is missing).
# "Containers": cgroup v2 + own PID namespace with its own /proc (no hostPID), no shim.
#   block-free  64 threads in cuMemFree_v2 behind a 5 s kernel while the main thread allocates
#               256 MiB at a time in a 4 GiB cgroup: killed at the crossing allocation; how long
#               a real free blocks, and whether allocations wait for it
#   race-ptr    a second thread rewrites cuMemAlloc_v2's output slot back to a held address:
#               64 MiB allocations in a 1 GiB cgroup, killed at the 17th (16 fit)
#   race-pitch  a second thread rewrites cuMemAllocPitch_v2's pitch to 0: 64 MiB each, the same
#   cg-bound    1100 child cgroups, 1 MiB allocated and freed in each: killed at the 1025th
#   cg-churn    5000 cgroups come and go (one in ten removed while still holding): all pruned,
#               nothing left charged, admin status < 100 ms throughout
#   spread      a tenant with NO limit holds 16 x 1024 allocations of 4 KiB in 16 child
#               cgroups, then allocates in a 17th: killed there (its own bound of 16384 live
#               allocations; its children count against it, not each against a bound of its own)
#   unl-bound   a tenant with NO limit makes 1100 child cgroups: killed at the 1025th (its own
#               bound); a neighbour with no limit then allocates 256 MiB in a new cgroup and lives
# Every worker runs under `timeout`; details under $OUT; a short table last.
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
WORK=$(mktemp -d /tmp/fgpu-tk.XXXX)
SOCK=$WORK/run/fgpu.sock
ADMIN=$WORK/admin/fgpu.sock
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
HOSTILE=${HOSTILE:-$HERE/hostile}
T=${T:-120}
mkdir -p "$OUT"
declare -a ROWS
row() { ROWS+=("$*"); echo "$*"; }
agent_pid=""
NAMES=(fgpu-tk-block fgpu-tk-ptr fgpu-tk-pitch fgpu-tk-bound fgpu-tk-churn)
UNLIMITED=(fgpu-tk-spread fgpu-tk-unl fgpu-tk-nbr)
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  rm -rf /sys/fs/bpf/fgpu-tk
  for n in "${NAMES[@]}" "${UNLIMITED[@]}"; do
    [ -d "$CG/$n" ] || continue
    find "$CG/$n" -mindepth 1 -depth -type d -exec sh -c 'echo 1 > "$1/cgroup.kill"' _ {} \; 2>/dev/null
    echo 1 > "$CG/$n/cgroup.kill"; sleep 0.3
    find "$CG/$n" -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null
    rmdir "$CG/$n" 2>/dev/null
  done
}
trap cleanup EXIT
if [ ! -x "$HOSTILE" ]; then
  cc -O1 -o "$WORK/hostile" "$HERE/hostile.c" -ldl -lpthread 2>"$OUT/cc.log" && HOSTILE=$WORK/hostile
fi
[ -x "$HOSTILE" ] || { echo "no hostile binary ($HOSTILE) and no cc"; exit 1; }

"$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" ${FGPU_AGENT_ARGS:---libcuda $LIBCUDA} \
  --bpf-dir /sys/fs/bpf/fgpu-tk --state-dir "$WORK/state" --log info > "$OUT/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 100); do [ -S "$ADMIN" ] && break; sleep 0.1; done
[ -S "$ADMIN" ] || { echo "agent did not start"; cat "$OUT/agent.log"; exit 1; }
fgpu() { "$FGPU" "$@" --socket "$ADMIN"; }
for n in "${NAMES[@]}"; do mkdir -p "$CG/$n"; fgpu limit set "/$n" --memory 1GiB > /dev/null; done
fgpu limit set /fgpu-tk-block --memory 4GiB > /dev/null
for n in "${UNLIMITED[@]}"; do mkdir -p "$CG/$n"; done

hostile() { # CGROUP LOG ARGS...: the attacker in CGROUP, own PID namespace; prints exit=
  local n=$1 log=$2; shift 2
  timeout -k 5 "$T" sh -c "echo \$\$ > $CG/$n/cgroup.procs; exec unshare --pid --fork --mount-proc --kill-child sh -c '\"\$0\" \"\$@\"; echo exit=\$?' \"\$@\"" sh "$HOSTILE" "$@" > "$log" 2>&1
}
oks() { grep -c "^$2 [0-9]* ok$" "$1"; }
rc_of() { sed -n 's/^exit=//p' "$1" | tail -1; }
verdict() { [ "$1" = "$2" ] && echo PASS || echo FAIL; }
counter() { fgpu status --json --detail | python3 -c "import json,sys; print(json.load(sys.stdin)['counters'].get('$1', 0))"; }

# 64 x 1 MiB freed on 64 threads behind a 5 s kernel while 256 MiB allocations go on: with the
# 64 MiB still charged (frees blocked) the 16th crosses 4 GiB (15 done); 16 done if the frees
# had returned first.
hostile fgpu-tk-block "$OUT/block_free.log" block-free 64 5000 268435456 24
n=$(grep -c "^alloc [0-9]* done" "$OUT/block_free.log"); rc=$(rc_of "$OUT/block_free.log")
frees=$(grep "^free " "$OUT/block_free.log" | sed 's/.*took_ms=//' | sort -n | awk '{a[NR]=$1} END {if (NR) print "min " a[1] " median " a[int((NR+1)/2)] " max " a[NR] " ms"; else print "none returned before the kill"}')
last=$(grep "^alloc " "$OUT/block_free.log" | tail -1)
row "block-free | killed at the crossing (15 or 16 done) | exit=$rc done=$n; last: $last; frees: $frees | $( [ "$rc" = 137 ] && { [ "$n" = 15 ] || [ "$n" = 16 ]; } && echo PASS || echo FAIL)"
hostile fgpu-tk-ptr "$OUT/race_ptr.log" race-ptr 67108864 40
n=$(oks "$OUT/race_ptr.log" alloc); rc=$(rc_of "$OUT/race_ptr.log")
row "race-ptr   | killed at the 17th, 16 held | exit=$rc held=$n | $(verdict "$rc/$n" 137/16)"
hostile fgpu-tk-pitch "$OUT/race_pitch.log" race-pitch 65536 1024 40
n=$(oks "$OUT/race_pitch.log" alloc); rc=$(rc_of "$OUT/race_pitch.log")
row "race-pitch | killed at the 17th, 16 held | exit=$rc held=$n | $(verdict "$rc/$n" 137/16)"
row "untrusted addresses charged under keys of their own: $(counter addr_untrusted)"

t0=$(date +%s.%N)
hostile fgpu-tk-bound "$OUT/cg_bound.log" churn "$CG/fgpu-tk-bound" 1100 1048576 keep
n=$(oks "$OUT/cg_bound.log" cgroup); rc=$(rc_of "$OUT/cg_bound.log")
row "cg-bound   | killed at the 1025th cgroup | exit=$rc cgroups=$n ($(python3 -c "print(round($(date +%s.%N)-$t0,1))") s) | $(verdict "$rc/$n" 137/1024)"

hostile fgpu-tk-churn "$OUT/cg_churn.log" churn "$CG/fgpu-tk-churn" 5000 1048576 hold-every 10 &
churn_pid=$!
worst=0
while kill -0 $churn_pid 2>/dev/null; do
  a=$(date +%s%N); "$FGPU" status --socket "$ADMIN" > /dev/null; b=$(date +%s%N)
  ms=$(( (b - a) / 1000000 )); [ "$ms" -gt "$worst" ] && worst=$ms
  sleep 0.2
done
wait $churn_pid
pruned=$(counter cgroups_pruned)
last=$(tail -2 "$OUT/cg_churn.log" | head -1)
used=$(fgpu status --json | python3 -c "import json,sys; print(sum(e.get('memory_used_bytes',0) for e in json.load(sys.stdin) if e['cgroup']=='/fgpu-tk-churn'))")
row "cg-churn   | churned 5000, pruned >= 5000, 0 B left, status < 100 ms | $last, pruned=$pruned, used=$used B, worst status ${worst} ms | $( [ "$last" = "churned 5000" ] && [ "$pruned" -ge 5000 ] && [ "$used" = 0 ] && [ "$worst" -lt 100 ] && echo PASS || echo FAIL)"

# Tenants without a limit: their child cgroups count against them, and no pool is shared.
echo go | hostile fgpu-tk-spread "$OUT/spread.log" spread "$CG/fgpu-tk-spread" 16 1024 4096
n=$(oks "$OUT/spread.log" alloc); rc=$(rc_of "$OUT/spread.log")
row "spread     | no limit: killed at its first allocation in a 17th cgroup, 16384 held | exit=$rc held=$n | $(verdict "$rc/$n" 137/16384)"
hostile fgpu-tk-unl "$OUT/unl_bound.log" churn "$CG/fgpu-tk-unl" 1100 1048576 keep
n=$(oks "$OUT/unl_bound.log" cgroup); rc=$(rc_of "$OUT/unl_bound.log")
hostile fgpu-tk-nbr "$OUT/neighbour.log" churn "$CG/fgpu-tk-nbr" 1 268435456
nrc=$(rc_of "$OUT/neighbour.log")
row "unl-bound  | no limit: killed at the 1025th cgroup; a neighbour's 256 MiB in a new cgroup lives | exit=$rc cgroups=$n neighbour exit=$nrc | $(verdict "$rc/$n/$nrc" 137/1024/0)"
fgpu status --detail > "$OUT/status.txt" 2>&1
echo
echo "scenario   | expected | measured | verdict"
printf '%s\n' "${ROWS[@]}"
