#!/usr/bin/env bash
# How even the GPU machine's CPUs are (Python-bound GPU loops are only as steady as the core
# they run on): topology, then a pure-Python loop pinned to each CPU in turn, twice.
#   OUT=/some/dir bash bundle/tests/gpu/cpu_probe.sh
set -u
PY=${PY:-/opt/torch/.venv/bin/python3}
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|MHz" 
cat /sys/fs/cgroup/cpuset.cpus.effective 2>/dev/null
for pass in 1 2; do
  line="pass $pass:"
  for c in $(seq 0 $(( $(nproc) - 1 ))); do
    r=$(taskset -c "$c" "$PY" -c '
import time
t=time.perf_counter(); n=0
while time.perf_counter()-t < 0.4:
    for i in range(10000): n += i
print(round(n/1e9/(time.perf_counter()-t),2))')
    line="$line $c:$r"
  done
  echo "$line"
done
