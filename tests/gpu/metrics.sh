#!/usr/bin/env bash
# H200 check of the agent's metrics (issue 15). From the bundle's parent folder:
#   OUT=/some/dir bash bundle/tests/gpu/metrics.sh
# The agent with --metrics on a free port; /readyz asked while it starts; two "containers"
# (cgroup v2 + own PID namespace with its own /proc) with limits of 8 GiB and 16 GiB, PyTorch
# under the shim in each allocating 1 GiB tensors until refused (tests/gpu/agent_limits_workload.py);
# a scrape compared with `fgpu status --json`, `fgpu top --once`, then the containers end and
# their series must be gone. Scrapes, status and logs under $OUT; a table last. About 1 min.
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
WORK=$(mktemp -d /tmp/fgpu-met.XXXX)
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
  rm -rf /sys/fs/bpf/fgpu-met
  for n in a b; do
    [ -d "$CG/fgpu-met-$n" ] && { echo 1 > "$CG/fgpu-met-$n/cgroup.kill"; sleep 0.3; rmdir "$CG/fgpu-met-$n"; }
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# GET PATH from the metrics listener: the whole response (status line, headers, body).
# shellcheck disable=SC2016  # $0..$2 expand in the inner bash
http_get() {
  timeout 10 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "GET %s HTTP/1.1\r\nHost: fgpu\r\nConnection: close\r\n\r\n" "$2" >&3
    cat <&3' "${ADDR%:*}" "${ADDR##*:}" "$1"
}
code_of() { head -1 | awk '{print $2}'; }

"$FGPU" agent --socket "$SOCK" --admin-socket "$ADMIN" --libcuda "$LIBCUDA" \
  --bpf-dir /sys/fs/bpf/fgpu-met --state-dir "$WORK/state" --log info \
  --metrics 127.0.0.1:0 > "$OUT/agent.log" 2>&1 &
agent_pid=$!
ADDR=""
for _ in $(seq 2000); do
  ADDR=$(grep -o 'readyz on http://[0-9.:]*' "$OUT/agent.log" 2>/dev/null | head -1 | sed 's|.*http://||')
  [ -n "$ADDR" ] && break
  sleep 0.005
done
[ -n "$ADDR" ] || { echo "no metrics address in the agent's log"; cat "$OUT/agent.log"; exit 1; }
first_ready=$(http_get /readyz | tee "$OUT/readyz-first.txt" | code_of)
attached_before=$(grep -c 'attached library' "$OUT/agent.log")
for _ in $(seq 200); do [ -S "$ADMIN" ] && [ "$(http_get /readyz | code_of)" = 200 ] && break; sleep 0.1; done
row "readyz while starting: HTTP $first_ready (probes attached then: $attached_before); once serving: HTTP $(http_get /readyz | code_of); healthz: HTTP $(http_get /healthz | code_of)"

mkdir -p "$CG/fgpu-met-a" "$CG/fgpu-met-b"
"$FGPU" limit set /fgpu-met-a --memory 8GiB --compute 30 --socket "$ADMIN" > /dev/null
"$FGPU" limit set /fgpu-met-b --memory 16GiB --socket "$ADMIN" > /dev/null

in_container() { # NAME CMD...: run CMD in cgroup fgpu-met-NAME and a new PID namespace
  local n=$1; shift
  sh -c "echo \$\$ > $CG/fgpu-met-$n/cgroup.procs; exec unshare --pid --fork --mount-proc \"\$@\"" sh "$@"
}
for n in a b; do
  FGPU_WORK=$WORK LD_PRELOAD=$SHIM FGPU_SOCKET=$SOCK in_container "$n" \
    timeout 150 "$PY" "$B/tests/gpu/agent_limits_workload.py" shim "$n" > "$OUT/workload-$n.log" 2>&1 &
done
for n in a b; do
  for _ in $(seq 900); do [ -f "$WORK/$n.json" ] && break; sleep 0.1; done
  [ -f "$WORK/$n.json" ] || { echo "workload $n did not report"; tail -20 "$OUT/workload-$n.log"; }
  cp "$WORK/$n.json" "$OUT/workload-$n.json" 2>/dev/null
done
sleep 1.2   # one publish interval: the scrape's sample is taken after the allocations
http_get /metrics > "$OUT/metrics-response.txt"
sed '1,/^\r$/d' "$OUT/metrics-response.txt" > "$OUT/metrics.txt"
"$FGPU" status --json --detail --socket "$ADMIN" > "$OUT/status.json"
"$FGPU" top --once --socket "$ADMIN" > "$OUT/top.txt" 2>&1
if command -v promtool > /dev/null; then
  # A plain GET (no Accept header) gets the classic text format 0.0.4, which promtool 2.x
  # reads as it is (docs/observability.md, "Formats: what a scraper gets").
  if promtool check metrics < "$OUT/metrics.txt" > "$OUT/promtool.txt" 2>&1; then
    lint="promtool check metrics: passed"
  else
    lint="promtool check metrics: FAILED ($(head -2 "$OUT/promtool.txt" | tr '\n' ' '))"
  fi
else
  lint="promtool: not installed here (CI runs it)"
fi
row "scrape: $(grep -c -v '^#' "$OUT/metrics.txt") series, $(grep -c '^# TYPE' "$OUT/metrics.txt") families, $(wc -c < "$OUT/metrics.txt") bytes; $lint"

compare() { # the scrape against the status, one row per fgpu-met cgroup
  "$PY" - "$OUT/metrics.txt" "$OUT/status.json" <<'PYEOF'
import json, re, sys
series = []
for line in open(sys.argv[1]):
    m = re.match(r'^(\w+)\{(.*)\} (\S+)$', line.strip())
    if m:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        series.append((m.group(1), labels, float(m.group(3))))
def get(name, cg):
    return sum(v for n, l, v in series if n == name and l.get("cgroup") == cg)
status = json.load(open(sys.argv[2]))
for r in status["cgroups"]:
    cg = r["cgroup"]
    if not cg.startswith("/fgpu-met-"):
        continue
    used, limit = get("fgpu_cgroup_memory_used_bytes", cg), get("fgpu_cgroup_memory_limit_bytes", cg)
    denied = get("fgpu_cgroup_alloc_denied_total", cg)
    ok = (used == r["memory_used_bytes"] and limit == (r["memory_limit_bytes"] or 0)
          and denied == r["alloc_denied"])
    uuid = next((l.get("UUID") for n, l, v in series
                 if n == "fgpu_cgroup_memory_used_bytes" and l.get("cgroup") == cg), "-")
    print("%-12s metrics used %6.2f GiB / limit %5.2f GiB, denied %d | status used %6.2f GiB, denied %d | %s | gpu UUID %s"
          % (cg, used / 2**30, limit / 2**30, denied, r["memory_used_bytes"] / 2**30,
             r["alloc_denied"], "MATCH" if ok else "DIFFER", uuid))
node = {n: v for n, l, v in series if not l.get("cgroup") and n in (
    "fgpu_ledgers", "fgpu_shims_connected", "fgpu_probed_libraries", "fgpu_events_dropped_total")}
print("node: " + ", ".join("%s=%g" % kv for kv in sorted(node.items())))
PYEOF
}
while IFS= read -r l; do row "$l"; done < <(compare)
for n in a b; do
  d=$(grep -c "event=\"alloc_denied\".*fgpu-met-$n\|alloc_denied.*cgroup=/fgpu-met-$n" "$OUT/agent.log")
  row "log: fgpu-met-$n: $d alloc_denied event line(s); workload: $("$PY" -c "import json; d=json.load(open('$WORK/$n.json')); print('%d x 1 GiB, then %s' % (d['tensors'], (d['error'] or 'no OOM')[:50]))" 2>/dev/null)"
done

# The containers end and their cgroups go: their series must leave the next sample.
for n in a b; do touch "$WORK/$n.go"; done
for _ in $(seq 300); do
  pgrep -f agent_limits_workload.py > /dev/null || break
  sleep 0.1
done
for n in a b; do rmdir "$CG/fgpu-met-$n" 2>/dev/null; done
sleep 1.5
http_get /metrics | sed '1,/^\r$/d' > "$OUT/metrics-after.txt"
left=$(grep -c 'fgpu-met-' "$OUT/metrics-after.txt")
row "after the containers ended and their cgroups went (+1.5 s): $left series still name fgpu-met-* (want 0)"

echo
echo "================ fgpu metrics on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null) ================"
printf '%s\n' "${ROWS[@]}" | tee "$OUT/summary.txt"
echo "--- fgpu top --once during the run:"
cat "$OUT/top.txt"
echo "--- key lines of the scrape:"
grep -E '^fgpu_(cgroup_memory_used_bytes|cgroup_memory_limit_bytes|cgroup_alloc_denied_total|cgroup_compute_share_ratio|ledgers|shims_connected|gpu_info)' "$OUT/metrics.txt" | cut -c1-220
