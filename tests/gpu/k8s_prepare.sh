#!/usr/bin/env bash
# H200 check of the DRA driver's prepare path (issue 13). From the bundle's parent folder:
#   OUT=/some/dir bash bundle/tests/gpu/k8s_prepare.sh
# The real agent on the GPU; `fgpu kubelet-plugin` against a stand-in API server
# (k8s_apiserver.py serving two recorded ResourceClaims: 8Gi/30% for pod A, 4Gi/70% for pod B,
# both on gpu-0); fgpu-test-kubelet does the kubelet's registration and NodePrepareResources
# over the real gRPC APIs. Two "pods" = kubelet-named cgroups (systemd layout for A, cgroupfs
# for B) with a container cgroup each, PyTorch under the shim in its own PID namespace. Then
# NodeUnprepareResources and the limits are gone. Table last; details under $OUT.
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
KUBELET=$B/bin/fgpu-test-kubelet
WORK=$(mktemp -d /tmp/fgpu-k8s.XXXX)
CG=$(awk '$9=="cgroup2"{print $5; exit}' /proc/self/mountinfo)
BASE=fgpu-k8s-$$
POD_A=0c3d6f1e-2b4a-4c8e-9f00-00000000000a
POD_B=0c3d6f1e-2b4a-4c8e-9f00-00000000000b
POD_C=0c3d6f1e-2b4a-4c8e-9f00-00000000000c
CLAIM_A=7d1e0c2a-1111-4c8e-9f00-00000000000a
CLAIM_B=7d1e0c2a-2222-4c8e-9f00-00000000000b
A_POD=$BASE/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${POD_A//-/_}.slice
B_POD=$BASE/kubepods/besteffort/pod$POD_B
A_CTR=$A_POD/cri-containerd-$(printf 'a%.0s' $(seq 64)).scope
B_CTR=$B_POD/$(printf 'b%.0s' $(seq 64))
export PATH=/usr/local/nvidia/bin:$PATH
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
declare -a ROWS
row() { ROWS+=("$*"); echo "$*"; }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf /sys/fs/bpf/fgpu-k8s
  for d in "$A_CTR" "$A_POD" "$BASE/kubepods.slice/kubepods-burstable.slice" "$BASE/kubepods.slice" \
           "$B_CTR" "$B_POD" "$BASE/kubepods/besteffort" "$BASE/kubepods" "$BASE"; do
    [ -d "$CG/$d" ] || continue
    [ -f "$CG/$d/cgroup.kill" ] && echo 1 > "$CG/$d/cgroup.kill"
    for _ in $(seq 20); do rmdir "$CG/$d" 2>/dev/null && break; sleep 0.1; done
  done
}
trap cleanup EXIT

ADMIN=$WORK/admin/fgpu.sock
SOCK=$WORK/run/fgpu.sock
timeout 170 "$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" \
  --bpf-dir /sys/fs/bpf/fgpu-k8s --state-dir "$WORK/state" --log info > "$OUT/agent.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$ADMIN" ] && break; sleep 0.1; done
[ -S "$ADMIN" ] || { echo "agent did not start"; tail -20 "$OUT/agent.log"; exit 1; }

# The recorded API objects.
API=$WORK/api
mkdir -p "$API/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims" "$API/api/v1/nodes"
claim() { # UID NAME MEMORY COMPUTE POD
  cat > "$API/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/$2.json" <<JSON
{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
 "metadata":{"name":"$2","namespace":"team-a","uid":"$1"},
 "spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"fgpu.io","capacity":{"requests":{"memory":"$3","compute":"$4"}}}}]}},
 "status":{"allocation":{"devices":{"results":[{"request":"gpu","driver":"fgpu.io","pool":"node-1","device":"gpu-0","shareID":"$1","consumedCapacity":{"memory":"$3","compute":"$4"}}]}},
  "reservedFor":[{"resource":"pods","name":"pod-$2","uid":"$5"}]}}
JSON
}
claim "$CLAIM_A" a 8Gi 30 "$POD_A"
claim "$CLAIM_B" b 4Gi 70 "$POD_B"
echo '{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","uid":"11111111-2222-3333-4444-555555555555"}}' > "$API/api/v1/nodes/node-1.json"
timeout 170 "$PY" "$B/tests/gpu/k8s_apiserver.py" "$API" "$WORK/port" 2> "$OUT/apiserver.log" &
pids+=($!)
for _ in $(seq 50); do [ -s "$WORK/port" ] && break; sleep 0.1; done
PORT=$(cat "$WORK/port")

for d in "$A_CTR" "$B_CTR"; do mkdir -p "$CG/$d"; done
plugin() {
  timeout 150 "$FGPU" kubelet-plugin --node-name node-1 --api-server "http://127.0.0.1:$PORT" \
    --registry-dir "$WORK/plugins_registry" --plugins-dir "$WORK/plugins" --cdi-dir "$WORK/cdi" \
    --state-dir "$WORK/state" --admin-socket "$ADMIN" --socket "$SOCK" --shim "$SHIM" \
    --cgroup-parent "/$BASE" >> "$OUT/plugin.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$WORK/plugins/fgpu.io/dra.sock" ] && [ -S "$WORK/plugins_registry/fgpu.io-reg.sock" ] && break; sleep 0.1; done
}
plugin
timeout 10 "$KUBELET" register "$WORK/plugins_registry/fgpu.io-reg.sock" | tee "$OUT/register.json"
row "registration: $(cat "$OUT/register.json")"
row "slice: $("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]))["spec"]["devices"][0]; print(d["name"], d["attributes"]["productName"]["string"], "memory", d["capacity"]["memory"]["value"], "compute", d["capacity"]["compute"]["value"], "multi", d["allowMultipleAllocations"])' "$API/patched/node-1-fgpu.io.json" 2>&1)"
# The pods start as a kubelet starts them (its DRA manager: one prepare per pod whose claims
# are not prepared on the node yet; STATE is its claim cache between the commands).
DRA=$WORK/plugins/fgpu.io/dra.sock
STATE=$WORK/dra-manager.json
for p in "$POD_A team-a/a/$CLAIM_A" "$POD_B team-a/b/$CLAIM_B" "$POD_C team-a/a/$CLAIM_A"; do
  # shellcheck disable=SC2086
  timeout 20 "$KUBELET" start-pod "$STATE" "$DRA" $p | tee -a "$OUT/start-pods.json"
done
row "pods started: $("$PY" -c 'import json,sys; print("; ".join("%s %s prepare calls %d" % (d["pod"][-1], "started" if d.get("started") else "NOT started: " + d.get("error", "?"), d["calls"]["prepare_calls"]) for d in map(json.loads, open(sys.argv[1]))))' "$OUT/start-pods.json" 2>&1) (want a 1, b 1, c 0: claim a is prepared already)"
timeout 20 "$KUBELET" prepare "$DRA" "team-a/a/$CLAIM_A" "team-a/b/$CLAIM_B" > "$OUT/prepare.json"
"$FGPU" limit ls --socket "$ADMIN" | tee "$OUT/limits-prepared.txt"
while read -r cg mem cpu _; do row "limit: ${cg##*/} memory $mem compute $cpu"; done < <(grep kubepods "$OUT/limits-prepared.txt")

in_cgroup() { # CGROUP CMD...
  local c=$1; shift
  sh -c "echo \$\$ > $CG/$c/cgroup.procs; exec unshare --pid --fork --mount-proc \"\$@\"" sh "$@"
}
wl=()
for p in a b; do
  ctr=$A_CTR; [ $p = b ] && ctr=$B_CTR
  LD_PRELOAD=$SHIM FGPU_SOCKET=$SOCK \
    in_cgroup "$ctr" timeout 120 "$PY" "$B/tests/gpu/k8s_prepare_workload.py" "$p" > "$OUT/workload-$p.json" 2> "$OUT/workload-$p.log" &
  wl+=($!)
done
wait "${wl[@]}"
for p in a b; do
  r=$("$PY" -c 'import json,sys; d=json.loads(open(sys.argv[1]).read()); print("mem_get_info total=%.2f GiB, OOM after %.1f GiB (%d x 512 MiB) [%s]" % (d["total"]/2**30, d["allocated"]/2**30, d["blocks_512mib"], d["error"][:60]))' "$OUT/workload-$p.json" 2>/dev/null) \
    || r="no result: $(tail -1 "$OUT/workload-$p.log")"
  row "pod $p: $r"
done

# A plugin restart answers prepare from its checkpoint (the claims gone from the API).
kill "${pids[-1]}" 2>/dev/null; sleep 0.5
rm -f "$API"/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/*.json
plugin
timeout 20 "$KUBELET" prepare "$WORK/plugins/fgpu.io/dra.sock" "team-a/a/$CLAIM_A" "team-a/b/$CLAIM_B" > "$OUT/prepare-again.json"
if diff <(sort "$OUT/prepare.json") <(sort "$OUT/prepare-again.json") >/dev/null; then row "restart: prepare again = same answer"; else row "restart: DIFFERENT answer (see prepare-again.json)"; fi
"$FGPU" limit ls --socket "$ADMIN" > "$OUT/limits-restarted.txt"
if diff -q "$OUT/limits-prepared.txt" "$OUT/limits-restarted.txt" >/dev/null; then row "restart: limits unchanged"; else row "restart: limits CHANGED"; fi
for p in "$POD_C" "$POD_A" "$POD_B"; do
  timeout 20 "$KUBELET" stop-pod "$STATE" "$DRA" "$p" | tee -a "$OUT/stop-pods.json"
done
row "pods stopped: $("$PY" -c 'import json,sys; print("; ".join("%s unprepare calls %d" % (d["pod"][-1], d["calls"]["unprepare_calls"]) for d in map(json.loads, open(sys.argv[1]))))' "$OUT/stop-pods.json" 2>&1) (want c 0, a 1, b 1)"
"$FGPU" limit ls --socket "$ADMIN" > "$OUT/limits-unprepared.txt"
if grep -q "pod$POD_B\|${POD_A//-/_}" "$OUT/limits-unprepared.txt"; then row "unprepare: limits STILL THERE"; else row "unprepare: pod limits removed"; fi

echo
echo "== k8s_prepare (expected: pod a 8 GiB total, OOM at the first 512 MiB block past 8 GiB less its context (~0.5 GiB): 14 blocks; pod b 4 GiB, 6 blocks) =="
printf '%s\n' "${ROWS[@]}"
