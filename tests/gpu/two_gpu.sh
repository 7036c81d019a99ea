#!/usr/bin/env bash
# Issue 17: per-GPU limits and shares on 2 × H200 (the nvidia-h200-x2 kind). From the
# bundle's parent folder:
#   OUT=/some/dir bash bundle/tests/gpu/two_gpu.sh
# "Containers" = cgroup v2 + own PID namespace with its own /proc; workloads from
# two_gpu_workload.py. Steps (each worker under its own timeout):
#   pergpu   A: 8 GiB on GPU 0 and 4 GiB on GPU 1; B: 16 GiB on GPU 1 only. PyTorch in each
#            reports mem_get_info and nvidia-smi per GPU, fills each GPU with 1 GiB tensors
#            until OutOfMemoryError; `fgpu status --json` per-GPU usage against NVML's
#            per-process figures (nvidia-smi on the host, no shim).
#   visible  C (1 GiB on GPU 1): CUDA_VISIBLE_DEVICES=1 and =<UUID of GPU 1>: the container's
#            device 0 is physical GPU 1 (same UUID), 1 GiB total, its usage charged there.
#   ddp      D (--compute 50 on both GPUs): a 2-rank DDP job (NCCL), next to E (--compute 50,
#            CUDA_VISIBLE_DEVICES=1) running a matmul loop on GPU 1: both finish, no hang;
#            shares on GPU 1 against each alone (the job's steps/s, E's iterations/s).
#   bypass   a process without the shim in A allocating on GPU 1 past its 4 GiB (under A's
#            12 GiB total): killed (exit 137) by the agent's per-GPU reconcile.
# PASS/FAIL lines and a table last ($OUT/two_gpu.txt); details in $OUT.
set -u
. "$(dirname "$0")/env.sh"  # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
WORK=$(mktemp -d /tmp/fgpu-2gpu.XXXX)
SOCK=$WORK/run/fgpu.sock
ADMIN=$WORK/admin/fgpu.sock
BPF=/sys/fs/bpf/fgpu-2gpu
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
# NVLink multicast stays off in every process on these machines (the device tool's notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/nvidia/bin:$PATH FGPU_WORK=$WORK
unset LD_PRELOAD FGPU_SOCKET FGPU_LOG CUDA_VISIBLE_DEVICES
mkdir -p "$OUT" "$(dirname "$SOCK")" "$(dirname "$ADMIN")"
fails=0
declare -a ROWS
check() { # NAME OK FIGURE TARGET
  local v=FAIL
  [ "$2" = 1 ] && v=PASS
  [ "$v" = FAIL ] && fails=$((fails + 1))
  echo "$v: $1: $3 (target $4)"
  ROWS+=("| $1 | $3 | $4 | $v |")
}
agent=""
cleanup() {
  local n
  for n in a b c d e; do
    [ -d "$CG/fgpu-2gpu-$n" ] || continue
    echo 1 > "$CG/fgpu-2gpu-$n/cgroup.kill" 2>/dev/null
    for _ in $(seq 30); do [ -n "$(cat "$CG/fgpu-2gpu-$n/cgroup.procs" 2>/dev/null)" ] || break; sleep 0.1; done
    rmdir "$CG/fgpu-2gpu-$n" 2>/dev/null
  done
  [ -n "$agent" ] && kill "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
  rm -rf "$BPF" "$WORK"
}
trap cleanup EXIT
( sleep "${DEADLINE:-540}"; echo "FAIL: two_gpu.sh ran past ${DEADLINE:-540} s, stopping" >&2; kill -TERM $$ ) &
wd=$!

gpus=$(nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader)
echo "$gpus" | tee "$OUT/gpus.txt"
[ "$(echo "$gpus" | grep -c .)" -ge 2 ] || { echo "FAIL: this check needs 2 GPUs (nvidia-h200-x2)"; exit 2; }
UUID1=$(echo "$gpus" | awk -F', ' 'NR==2 {print $2}')
{ date -u +%FT%TZ; uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  [ -f "$B/MANIFEST" ] && cat "$B/MANIFEST"; } > "$OUT/environment.txt"

"$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" --bpf-dir "$BPF" \
  --state-dir "$WORK/state" --log info > "$OUT/agent.log" 2>&1 &
agent=$!
for _ in $(seq 150); do [ -S "$ADMIN" ] && break; sleep 0.1; done
[ -S "$ADMIN" ] || { echo "FAIL: agent did not start"; tail -20 "$OUT/agent.log"; exit 1; }
fgpu() { "$FGPU" "$@" --socket "$ADMIN"; }
for n in a b c d e; do mkdir -p "$CG/fgpu-2gpu-$n"; done
set_limit() { fgpu limit set "$@" >> "$OUT/limits.log" 2>&1 || { echo "FAIL: fgpu limit set $*"; tail -3 "$OUT/limits.log"; exit 1; }; }
in_container() { # NAME CMD...
  local n=$1; shift
  sh -c "echo \$\$ > $CG/fgpu-2gpu-$n/cgroup.procs; exec unshare --pid --fork --mount-proc --kill-child \"\$@\"" sh "$@"
}
wait_json() { # NAME SECONDS
  for _ in $(seq $(($2 * 10))); do [ -f "$WORK/$1.json" ] && return 0; sleep 0.1; done
  return 1
}
field() { "$PY" -c "import json,sys; d=json.load(open('$WORK/$1.json')); print(eval(sys.argv[1]))" "$2" 2>/dev/null; }

# ---- pergpu -----------------------------------------------------------------------------------
set_limit /fgpu-2gpu-a --memory 8GiB --gpu 0
set_limit /fgpu-2gpu-a --memory 4GiB --gpu 1
set_limit /fgpu-2gpu-b --memory 16GiB --gpu 1
fgpu limit ls > "$OUT/limits-ls.txt" 2>&1
in_container a timeout -k 5 240 env LD_PRELOAD="$SHIM" FGPU_SOCKET="$SOCK" \
  "$PY" "$HERE/two_gpu_workload.py" pergpu a > "$OUT/pergpu-a.log" 2>&1 &
in_container b timeout -k 5 240 env CUDA_VISIBLE_DEVICES=1 LD_PRELOAD="$SHIM" FGPU_SOCKET="$SOCK" \
  "$PY" "$HERE/two_gpu_workload.py" pergpu b > "$OUT/pergpu-b.log" 2>&1 &
wait_json a 200 || { echo "FAIL: pergpu a did not report"; tail -5 "$OUT/pergpu-a.log"; }
wait_json b 200 || { echo "FAIL: pergpu b did not report"; tail -5 "$OUT/pergpu-b.log"; }
fgpu status --json --detail > "$OUT/status-pergpu.json" 2>&1
fgpu status > "$OUT/status-pergpu.txt" 2>&1
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits > "$OUT/nvml-apps.txt" 2>&1
cp "$WORK"/a.json "$WORK"/b.json "$OUT/" 2>/dev/null
gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }
a0=$(field a 'd["devices"][0]["mem_get_info_total"]'); a1=$(field a 'd["devices"][1]["mem_get_info_total"]')
n0=$(field a 'd["devices"][0]["tensors"]'); n1=$(field a 'd["devices"][1]["tensors"]')
check "A on GPU 0 (8 GiB): mem_get_info total, 1 GiB tensors before OOM" \
  "$([ "${a0:-0}" = 8589934592 ] && [ "${n0:-0}" -ge 6 ] && [ "${n0:-0}" -le 7 ] && echo 1)" \
  "$(gib "${a0:-0}") GiB, $n0 tensors" "8.00 GiB, 6-7 (context charged)"
check "A on GPU 1 (4 GiB)" \
  "$([ "${a1:-0}" = 4294967296 ] && [ "${n1:-0}" -ge 2 ] && [ "${n1:-0}" -le 3 ] && echo 1)" \
  "$(gib "${a1:-0}") GiB, $n1 tensors" "4.00 GiB, 2-3"
b0=$(field b 'd["devices"][0]["mem_get_info_total"]'); nb=$(field b 'd["devices"][0]["tensors"]')
check "B on GPU 1 only (16 GiB, CUDA_VISIBLE_DEVICES=1)" \
  "$([ "${b0:-0}" = 17179869184 ] && [ "${nb:-0}" -ge 14 ] && [ "${nb:-0}" -le 15 ] && echo 1)" \
  "$(gib "${b0:-0}") GiB, $nb tensors" "16.00 GiB, 14-15"
smi_a=$(field a '" / ".join(d["nvidia_smi"])')
check "A's nvidia-smi (the shim's NVML) per GPU" \
  "$(echo "$smi_a" | grep -q "8192 MiB" && echo "$smi_a" | grep -q "4096 MiB" && echo 1)" "$smi_a" "8192 MiB / 4096 MiB"
# fgpu status per-GPU usage against NVML's per-process figures of the same processes.
cmp=$("$PY" - "$OUT/status-pergpu.json" "$OUT/nvml-apps.txt" "$OUT/gpus.txt" <<'PYEOF'
import json, sys
st = json.load(open(sys.argv[1]))
rows = st if isinstance(st, list) else st.get("cgroups", [])
uuids = [l.split(", ")[1] for l in open(sys.argv[3]) if l.strip()]
apps = [l.split(", ") for l in open(sys.argv[2]) if l.count(",") == 2]
worst, parts = 0.0, []
for r in rows:
    cg = r.get("cgroup", "")
    if "fgpu-2gpu-" not in cg:
        continue
    pids = set(str(p) for p in r.get("pids", []))
    for dev in r.get("devices", []):
        u = dev.get("uuid")
        used = dev.get("memory_used_bytes", 0) / 2**20
        nv = sum(float(a[2]) for a in apps if a[1] == u and (not pids or a[0] in pids))
        worst = max(worst, abs(used - nv))
        parts.append(f"{cg.rsplit('-', 1)[-1]}@GPU{uuids.index(u) if u in uuids else '?'} {used:.0f}/{nv:.0f} MiB")
print(f"{worst:.0f}|{'; '.join(parts)}")
PYEOF
)
check "fgpu status per-GPU usage vs NVML (fgpu/NVML)" "$([ "${cmp%%|*}" -le 1024 ] 2>/dev/null && echo 1)" \
  "${cmp#*|} (worst ${cmp%%|*} MiB)" "within the context overhead (<= 1024 MiB)"
touch "$WORK/a.go" "$WORK/b.go"
sleep 2

# ---- visible ----------------------------------------------------------------------------------
set_limit /fgpu-2gpu-c --memory 1GiB --gpu 1
for how in 1 "$UUID1"; do
  rm -f "$WORK/c.json"
  in_container c timeout -k 5 120 env CUDA_VISIBLE_DEVICES="$how" LD_PRELOAD="$SHIM" FGPU_SOCKET="$SOCK" \
    "$PY" "$HERE/two_gpu_workload.py" visible c > "$OUT/visible-${how:0:8}.log" 2>&1 &
  wait_json c 100 || { echo "FAIL: visible ($how) did not report"; tail -5 "$OUT/visible-${how:0:8}.log"; }
  fgpu status --json --detail > "$OUT/status-visible-${how:0:8}.json" 2>&1
  tot=$(field c 'd["mem_get_info_total"]'); u0=$(field c 'd["uuid0"]'); cnt=$(field c 'd["count"]')
  on1=$("$PY" - "$OUT/status-visible-${how:0:8}.json" "$UUID1" <<'PYEOF'
import json, sys
st = json.load(open(sys.argv[1]))
rows = st if isinstance(st, list) else st.get("cgroups", [])
for r in rows:
    if r.get("cgroup", "").endswith("fgpu-2gpu-c"):
        print(" ".join(f"{d.get('uuid')}={d.get('memory_used_bytes', 0) >> 20}MiB" for d in r.get("devices", [])))
PYEOF
)
  check "CUDA_VISIBLE_DEVICES=$how: device 0 is GPU 1, 1 GiB, charged on GPU 1" \
    "$([ "${cnt:-0}" = 1 ] && [ "${tot:-0}" = 1073741824 ] && [[ "${UUID1,,}" == *"${u0,,}"* ]] && [[ "$on1" == *"$UUID1="* ]] && echo 1)" \
    "count $cnt, total $(gib "${tot:-0}") GiB, uuid $u0; status: $on1" "1, 1.00 GiB, $UUID1, usage on it"
  touch "$WORK/c.go"; sleep 1; rm -f "$WORK/c.go"
done

# ---- ddp --------------------------------------------------------------------------------------
STEPS=${DDP_STEPS:-300}
run_ddp() { # TAG: the job in D, results in ddp-TAG.json
  in_container d timeout -k 5 300 env LD_PRELOAD="$SHIM" FGPU_SOCKET="$SOCK" \
    "$PY" "$HERE/two_gpu_workload.py" ddp "ddp-$1" "$STEPS" > "$OUT/ddp-$1.log" 2>&1
}
run_loop() { # TAG SECS: E's loop on GPU 1
  in_container e timeout -k 5 200 env CUDA_VISIBLE_DEVICES=1 LD_PRELOAD="$SHIM" FGPU_SOCKET="$SOCK" \
    "$PY" "$HERE/two_gpu_workload.py" loop "loop-$1" "$2" > "$OUT/loop-$1.log" 2>&1
}
run_ddp alone; rc_alone=$?
run_loop alone 8
set_limit /fgpu-2gpu-d --compute 50
set_limit /fgpu-2gpu-e --compute 50
run_loop mix 30 &
lp=$!
sleep 3
t0=$(date +%s)
run_ddp mix; rc_mix=$?
t1=$(date +%s)
fgpu status --json > "$OUT/status-ddp.json" 2>&1
kill $lp 2>/dev/null; wait $lp 2>/dev/null
cp "$WORK"/ddp-*.json "$WORK"/loop-*.json "$OUT/" 2>/dev/null
res=$("$PY" - "$WORK" "$t0" "$t1" <<'PYEOF'
import json, os, sys
w, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
ld = lambda n: json.load(open(os.path.join(w, n + ".json")))
try:
    da, dm = ld("ddp-alone"), ld("ddp-mix")
    la = ld("loop-alone")
except (OSError, ValueError) as e:
    print(f"nan nan 0 (missing: {e})"); sys.exit()
job = 100 * min(r["per_s"] for r in dm["ranks"]) / min(r["per_s"] for r in da["ranks"])
ok = all(r["allreduce_ok"] for r in dm["ranks"]) and dm["exit_codes"] == [0, 0]
try:
    lm = ld("loop-mix")
    pts = [p for p in lm["progress"] if t0 + 2 <= p[0] <= t1]
    loop = 100 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) / la["per_s"]
except Exception:
    loop = float("nan")
print(f"{job:.1f} {loop:.1f} {int(ok)}")
PYEOF
)
read -r job loopshare ddp_ok <<< "$res"
check "DDP job (NCCL, both GPUs, --compute 50) completes" "$([ "$rc_alone" = 0 ] && [ "$rc_mix" = 0 ] && [ "$ddp_ok" = 1 ] && echo 1)" \
  "exit $rc_alone / $rc_mix, all-reduce sums right: $ddp_ok, $((t1 - t0)) s" "0 / 0, yes, no hang"
within5() { awk -v x="$1" 'BEGIN { exit !(x >= 45 && x <= 55) }'; }
check "DDP job's share on GPU 1 (its steps/s ÷ alone)" "$(within5 "$job" && echo 1)" "$job%" "50 +- 5"
check "E's share on GPU 1 next to it (iterations/s ÷ alone)" "$(within5 "$loopshare" && echo 1)" "$loopshare%" "50 +- 5"

# ---- bypass -----------------------------------------------------------------------------------
rm -f "$WORK/bypass.json"
in_container a timeout -k 5 120 "$PY" "$HERE/two_gpu_workload.py" bypass bypass 1 6 > "$OUT/bypass.log" 2>&1
rc=$?
got=$(field bypass 'd["tensors"]')
check "a process without the shim in A past its 4 GiB on GPU 1 (under A's 12 GiB)" \
  "$([ "$rc" = 137 ] && [ "${got:-9}" -le 5 ] && echo 1)" "exit $rc after $got x 1 GiB; agent: $(grep -c -i 'kill' "$OUT/agent.log") kill line(s)" "137 (SIGKILL) before 6"

kill "$wd" 2>/dev/null
{
  echo
  echo "================ per-GPU limits and shares on $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs) ================"
  echo "| check | figure | target | verdict |"
  echo "|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
} | tee "$OUT/two_gpu.txt"
[ "$fails" = 0 ]
