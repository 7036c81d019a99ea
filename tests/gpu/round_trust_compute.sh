#!/usr/bin/env bash
# One H200 round for issues 10 and 11: tests/gpu/trust.sh (pod-level limit with two PyTorch
# containers, a bypassing process killed at the crossing allocation), then
# tests/gpu/compute_real.sh (compute shares for everyday workloads; ONLY= as there, default
# "s25 s3 mp dec kill"). From the bundle's parent folder: OUT=/some/dir bash
# bundle/tests/gpu/round_trust_compute.sh. Both tables last; every detail in
# $OUT/details.tgz, the agents' logs beside it.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/fgpu-out}
mkdir -p "$OUT/trust" "$OUT/compute"
OUT=$OUT/trust timeout -k 5 170 bash "$HERE/trust.sh" > "$OUT/trust.txt" 2>&1
trust_rc=$?
ONLY=${ONLY:-s25 s3 mp dec kill} OUT=$OUT/compute DEADLINE=${DEADLINE:-400} \
  bash "$HERE/compute_real.sh" > "$OUT/compute.txt" 2>&1
compute_rc=$?
cp "$OUT/compute/agent.log" "$OUT/compute-agent.log" 2>/dev/null
cp "$OUT/trust/agent.log" "$OUT/trust-agent.log" 2>/dev/null
tar -C "$OUT" -czf "$OUT/details.tgz" trust compute && rm -rf "$OUT/trust" "$OUT/compute"
echo "================ trust.sh (rc $trust_rc) ================"
tail -25 "$OUT/trust.txt"
echo "================ compute_real.sh (rc $compute_rc) ================"
sed -n '/^================ compute shares/,$p' "$OUT/compute.txt"
