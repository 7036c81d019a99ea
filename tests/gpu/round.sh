#!/usr/bin/env bash
# One GPU round: runs the named tests/gpu scripts one after the other, each under its own
# timeout, and packs everything into few files (the device tool returns at most 8).
#   OUT=/some/dir bash bundle/tests/gpu/round.sh k8s_prepare shim_limits compute_real ...
# A script's output goes to $OUT/NAME.txt, its details ($OUT for it) into $OUT/details.tgz.
# Timeouts: TIMEOUT_NAME=SECONDS (default 300; the script's DEADLINE 10 s less, or
# DEADLINE_NAME). Other variables (ONLY, VARIANTS, SECS, ...)
# pass through to the scripts; SHIM_LIMITS_ONLY="torch default;two processes" picks
# shim_limits.sh's steps. Each script's last 30 lines are printed at the end.
set -u
. "$(dirname "$0")/env.sh" # HERE, B, FGPU, SHIM, PY, LIBCUDA, OUT
mkdir -p "$OUT/details"
declare -A rc=() took=()
for name in "$@"; do
  script=$HERE/$name.sh
  [ -f "$script" ] || { echo "round.sh: no $script" >&2; rc[$name]=127; continue; }
  var=TIMEOUT_$name
  limit=${!var:-300}
  mkdir -p "$OUT/details/$name"
  t0=$(date +%s)
  args=()
  # shim_limits takes the bundle and `--only STEP`s: SHIM_LIMITS_ONLY="torch default;jax"
  if [ "$name" = shim_limits ]; then
    args=("$B")
    IFS=';' read -ra only <<< "${SHIM_LIMITS_ONLY:-}"
    for o in "${only[@]}"; do args+=(--only "$o"); done
  fi
  # DEADLINE_NAME=SECONDS: that script's own stop (compute_real.sh, compute_agent.sh), which
  # still prints its report; default 10 s under its timeout.
  dvar=DEADLINE_$name
  # ONLY_NAME / SECS_NAME: that script's ONLY / SECS (scripts share the names).
  ovar=ONLY_$name svar=SECS_$name
  OUT=$OUT/details/$name DEADLINE=${!dvar:-$((limit - 10))} ONLY=${!ovar:-${ONLY:-}} SECS=${!svar:-${SECS:-}} timeout -k 10 "$limit" bash "$script" "${args[@]}" > "$OUT/$name.txt" 2>&1
  rc[$name]=$?
  took[$name]=$(( $(date +%s) - t0 ))
done
tar -C "$OUT" -czf "$OUT/details.tgz" details && rm -rf "$OUT/details"
for name in "$@"; do
  echo "================ $name (rc ${rc[$name]}, ${took[$name]:-0} s) ================"
  tail -30 "$OUT/$name.txt" 2>/dev/null
done
