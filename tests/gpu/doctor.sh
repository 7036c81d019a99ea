#!/usr/bin/env bash
# `fgpu doctor` on a real NVIDIA node (issue 28, item 4): what it says with no agent running,
# then with an agent on the real driver, and that each line the node can answer is right:
# the driver library found with its probe symbols, NVML and the GPU, the sockets, the agent.
#   OUT=/some/dir bash bundle/tests/gpu/doctor.sh
# Writes $OUT/doctor-{down,up}.{txt,json} and $OUT/doctor-agent.log; a short table last.
set -u
. "$(dirname "$0")/env.sh"  # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
SOCK=/tmp/fgpu-doc/fgpu.sock
ADMIN=/tmp/fgpu-doc-admin/fgpu.sock
BPF=/sys/fs/bpf/fgpu-doc
WORK=$(mktemp -d /tmp/fgpu-doc.XXXX)
mkdir -p "$OUT" "$(dirname "$SOCK")"
agent=""
cleanup() {
  [ -n "$agent" ] && kill "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
  rm -rf "$BPF" "$WORK"
}
trap cleanup EXIT
rows=()
row() { rows+=("$1|$2|$3"); }
doctor() { # NAME: both outputs, the exit code in $OUT/doctor-NAME.rc
  local common=(--socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" --bpf-dir "$BPF")
  timeout 30 "$FGPU" doctor "${common[@]}" > "$OUT/doctor-$1.txt" 2>&1; echo $? > "$OUT/doctor-$1.rc"
  timeout 30 "$FGPU" doctor "${common[@]}" --json > "$OUT/doctor-$1.json" 2> "$OUT/doctor-$1.json.err"
}
status_of() { # NAME CHECK: the status of the first line of that check
  "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(next((c["status"] for c in d if c["name"]==sys.argv[2]), "missing"))' \
    "$OUT/doctor-$1.json" "$2" 2>/dev/null || echo unreadable
}
detail_of() {
  "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(next((c["detail"] for c in d if c["name"]==sys.argv[2]), "")[:110])' \
    "$OUT/doctor-$1.json" "$2" 2>/dev/null
}
expect() { # NAME CHECK WANT
  local got; got=$(status_of "$1" "$2")
  if [ "$got" = "$3" ]; then row "PASS" "$1: $2 is $3" "$(detail_of "$1" "$2")"
  else row "FAIL" "$1: $2 is $got (want $3)" "$(detail_of "$1" "$2")"; fi
}

doctor down
expect down driver-library ok
expect down nvml ok
expect down agent fail
rc=$(cat "$OUT/doctor-down.rc")
[ "$rc" = 1 ] && row PASS "down: exit code 1" "" || row FAIL "down: exit code $rc (want 1)" ""

"$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" --bpf-dir "$BPF" \
  --state-dir "$WORK/state" --log info > "$OUT/doctor-agent.log" 2>&1 &
agent=$!
for _ in $(seq 150); do [ -S "$ADMIN" ] && break; sleep 0.1; done
if [ -S "$ADMIN" ]; then
  doctor up
  for c in kernel btf uprobes cgroup driver-library nvml containers-socket admin-socket agent; do
    expect up "$c" ok
  done
  rc=$(cat "$OUT/doctor-up.rc")
  fails=$("$PY" -c 'import json,sys; print(" ".join(c["name"] for c in json.load(open(sys.argv[1])) if c["status"]=="fail"))' "$OUT/doctor-up.json" 2>/dev/null)
  [ "$rc" = 0 ] && row PASS "up: exit code 0" "" || row INFO "up: exit code $rc" "failing: ${fails:-?} (a node without a CDI spec or kubelet may fail those)"
else
  row FAIL "agent did not start" "$(tail -3 "$OUT/doctor-agent.log" | tr '\n' ' ')"
fi

echo
echo "== fgpu doctor with the agent up:"
cat "$OUT/doctor-up.txt" 2>/dev/null
echo
printf '%s\n' "${rows[@]}" | awk -F'|' '{ printf "%-5s %-40s %s\n", $1, $2, $3 }'
