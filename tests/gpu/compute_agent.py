#!/usr/bin/env python3
"""Compute shares under the agent (issue 6): workers and analysis for compute_agent.sh.

Worker mode (run by compute_agent.sh inside a cgroup and PID namespace, one process each):
    compute_agent.py --worker matmul|graph --seconds S --warmup W --ready FILE --go FILE
  The loops are compute_share.py's (`worker`): "matmul" = one 8192x8192 bf16 matmul per step,
  "graph" = replays of a captured CUDA graph of 10 x (4096x4096 bf16 matmul + add_). Around
  them this wrapper adds a start barrier (write FILE --ready once set up, then wait for --go,
  which holds the shared start time) and a warm-up of W s run at full speed right before
  the S measured seconds, so that tenants started together warm up together and the agent's
  controller is settled when the measurement begins. Prints one RESULT json line.

Analysis mode (after all phases):
    compute_agent.py --analyze --runs RUNS.jsonl --out DIR
  RUNS.jsonl: one line per worker written by the driver (phase, tenant, role, mode, setting,
  log, rc). Reads each log (worker stdout and stderr: the RESULT line and the shim's
  `compute gate: launches=...` exit line), checks the criteria, prints PASS/FAIL lines and
  a table last, writes DIR/compute_agent.json. Exit status 1 if any criterion failed.

Phases (names as in RUNS.jsonl; tenant a = matmul loop, tenant b = graph loop):
  ref        each alone, no fgpu: the reference iterations/s (ref_a, ref_b)
  slice      both at once, no fgpu: the driver's own time-slicing, for comparison
  s30        agent, a --compute 30, b --compute 70, both at once: share = iter/s / ref x 100
  s50        agent, 50 / 50
  cap30      agent, a alone with --compute-cap 30 on an idle GPU
  bareN/fullN  a alone without fgpu (no agent, no shim) / under the agent and the shim with
             --compute 100, interleaved, N = 1..3: medians compared
"""

import argparse
import json
import math
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

TENANTS = {"a": "matmul", "b": "graph"}
GATED_PHASES = ("s30", "s50", "cap30")
GATE_RE = re.compile(r"compute gate: (launches=\d+.*)$")


# ---- worker ----------------------------------------------------------------------------------


def run_worker(args):
    sys.path.insert(0, HERE)
    import compute_share as cs  # the loops; torch is imported inside its functions
    from workloads import barrier  # the start barrier the other GPU scripts' workers use

    orig_loop, orig_emit = cs.throttled_loop, cs.emit
    info = {"warmup_s": args.warmup}

    def loop(step, seconds, start_at, **kw):
        # cs.worker calls this once its step is built and warmed (20 steps / 5 replays).
        start_at = barrier(args.ready, args.go) if args.go else time.time()
        info["late_s"] = round(time.time() - start_at, 3)  # > 0: started after the others
        if args.warmup > 0:
            orig_loop(step, args.warmup, start_at, **kw)
            start_at = 0.0
        return orig_loop(step, seconds, start_at, **kw)

    def emit(**kw):
        t_end = time.time()
        orig_emit(**kw, **info, t_start=t_end - kw["seconds"], t_end=t_end)

    cs.throttled_loop, cs.emit = loop, emit
    cs.worker(args.worker, args.seconds, 0.0)


# ---- analysis --------------------------------------------------------------------------------


def parse_log(path):
    """(RESULT dict or None, gate stats dict or None, gate line, text)."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        return None, None, None, f"(no log: {e})"
    result, gate, gate_line = None, None, None
    for line in text.splitlines():
        if line.startswith("RESULT "):
            try:
                result = json.loads(line[7:])
            except ValueError:
                pass
        m = GATE_RE.search(line)
        if m:
            gate_line = line.strip()
            gate = {}
            for kv in m.group(1).split():
                k, _, v = kv.partition("=")
                try:
                    gate[k] = int(v)
                except ValueError:
                    gate[k] = v
    return result, gate, gate_line, text


def rate(run):
    res = run and run.get("result")
    return res["per_s"] if res else math.nan


def fmt(x, spec=".1f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def no_nan(obj):
    """NaN (a missing measurement) as null: strict JSON readers (jq) refuse NaN."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: no_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [no_nan(v) for v in obj]
    return obj


def agent_view(status):
    """Best effort: every field whose name mentions compute, per fgpu-cmp cgroup."""
    if not isinstance(status, dict):
        return {}
    found = {}

    def walk(obj, prefix, into):
        if isinstance(obj, dict):
            for k, v in obj.items():
                p = f"{prefix}.{k}" if prefix else k
                if "compute" in k.lower() or "share" in k.lower() or "util" in k.lower():
                    into[p] = v
                else:
                    walk(v, p, into)
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{prefix}[{i}]", into)

    for c in status.get("cgroups", []):
        name = c.get("cgroup", "")
        if "fgpu-cmp" in name:
            walk(c, "", found.setdefault(name, {}))
    return found


def status_of(out, phase):
    """The `fgpu status --json --detail` saved during a phase ({} if none)."""
    try:
        with open(os.path.join(out, f"status-{phase}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def analyze(runs_path, out):
    runs = []
    with open(runs_path) as f:
        for line in f:
            if line.strip():
                runs.append(json.loads(line))
    for r in runs:
        r["result"], r["gate"], r["gate_line"], text = parse_log(r["log"])
        r["launches"] = r["gate"].get("launches") if r["gate"] else None
        if r["result"] is None:
            r["log_tail"] = text[-1500:]

    def pick(phase, tenant):
        return next((r for r in runs if r["phase"] == phase and r["tenant"] == tenant), None)

    ref = {t: rate(pick("ref", t)) for t in TENANTS}
    for r in runs:
        r["share"] = 100 * rate(r) / ref.get(r["tenant"], math.nan)

    checks, fails = [], 0
    ran = {r["phase"] for r in runs}  # ONLY=... runs a subset

    def check(name, ok, figure, target, verdict=None):
        nonlocal fails
        verdict = verdict or ("PASS" if ok else "FAIL")
        fails += verdict == "FAIL"
        print(f"{verdict}: {name}: {figure} (target {target})", flush=True)
        checks.append({"check": name, "figure": figure, "target": target, "verdict": verdict})

    def share(r):
        return r["share"] if r else math.nan

    ok = all(v > 0 for v in ref.values())  # False for nan
    check("references: each loop alone, no fgpu", ok,
          f"matmul {fmt(ref['a'])} it/s, graph {fmt(ref['b'])} replays/s", "both measured")

    a, b = pick("slice", "a"), pick("slice", "b")
    check("driver time-slicing, no fgpu (comparison)", True,
          f"matmul {fmt(share(a))}% + graph {fmt(share(b))}% = {fmt(share(a) + share(b))}%",
          "none", verdict="INFO")

    for phase, sa, sb in (("s30", 30, 70), ("s50", 50, 50)):
        if phase not in ran:
            continue
        a, b = pick(phase, "a"), pick(phase, "b")
        for r, want, what in ((a, sa, "matmul (a)"), (b, sb, "graph (b)")):
            check(f"{phase}: {what} at --compute {want}", abs(share(r) - want) <= 5,
                  f"{fmt(share(r))}%", f"{want} +- 5")
        total = share(a) + share(b)
        check(f"{phase}: total throughput", total >= 90, f"{fmt(total)}% of one tenant alone",
              ">= 90%")
        if a and b and a["result"] and b["result"]:
            ra, rb = a["result"], b["result"]
            both = min(ra["t_end"], rb["t_end"]) - max(ra["t_start"], rb["t_start"])
            overlap = both / max(ra["seconds"], rb["seconds"])
            if overlap < 0.95:
                print(f"WARN: {phase}: the tenants' measured windows overlap only "
                      f"{100 * overlap:.0f}% (late_s {ra.get('late_s')}, {rb.get('late_s')})")

    gated = [r for r in runs if r["phase"] in GATED_PHASES]
    seen = [r for r in gated if r["result"] and r["launches"] is not None
            and r["launches"] >= r["result"]["iterations"]]
    check("the gate saw the loops' launches (launches >= measured iterations)",
          bool(gated) and len(seen) == len(gated),
          ", ".join(f"{r['phase']}/{r['tenant']} {fmt(r['launches'], 'd')} vs "
                    f"{fmt(r['result']['iterations'] if r['result'] else None, 'd')}"
                    for r in gated) or "no gated runs",
          "every gated worker")

    bare = [rate(r) for r in runs if re.fullmatch(r"bare\d+", r["phase"])]
    full = [rate(r) for r in runs if re.fullmatch(r"full\d+", r["phase"])]
    mb = statistics.median(bare) if bare else math.nan
    mf = statistics.median(full) if full else math.nan
    if bare or full:
        check("--compute 100 under agent + shim vs no fgpu (medians)", mf >= 0.99 * mb,
              f"{fmt(100 * mf / mb if mb else math.nan, '.2f')}% ({fmt(mf)} vs {fmt(mb)} it/s; "
              f"runs {' '.join(fmt(x) for x in full)} vs {' '.join(fmt(x) for x in bare)})",
              ">= 99%")

    if bare:
        print(f"INFO: drift: matmul alone without fgpu {fmt(ref['a'])} it/s at the start (ref), "
              f"{fmt(mb)} it/s later (median of the bare runs): "
              f"{fmt(100 * (mb / ref['a'] - 1), '+.1f')}%")

    # A cap is on GPU time (what the agent measures), not on work: a GPU busy a third of the
    # time runs the same kernel faster than a saturated, power-capped one (duty_cycle.py),
    # so the throughput share is shown beside it.
    r = pick("cap30", "a")
    cap_view = agent_view(status_of(out, "cap30")).get("/fgpu-cmp-a", {})
    used = cap_view.get("compute_used_pct")
    if "cap30" in ran:
        check("cap30: matmul alone at --compute-cap 30 on an idle GPU, GPU time (agent)",
              used is not None and used <= 33,
              f"{fmt(used if used is not None else math.nan)}% of wall time; throughput "
              f"{fmt(share(r))}% of alone", "<= 33")

    status = {}
    for r in runs:
        p = os.path.join(out, f"status-{r['phase']}.json")
        if r["phase"] not in status and os.path.exists(p):
            try:
                with open(p) as f:
                    status[r["phase"]] = json.load(f)
            except ValueError as e:
                status[r["phase"]] = {"unreadable": str(e)}
    views = {p: agent_view(s) for p, s in status.items()}
    for p, v in views.items():
        if v:
            print(f"INFO: agent's view during {p}: {json.dumps(v, sort_keys=True)}")

    missing = [f"{r['phase']}/{r['tenant']} (rc {r.get('rc')})" for r in runs if not r["result"]]
    if missing:
        print("WARN: no result from " + ", ".join(missing) + " (see the logs)")

    with open(os.path.join(out, "compute_agent.json"), "w") as f:
        json.dump(no_nan({"references": ref, "checks": checks, "runs": runs, "status": status,
                          "agent_view": views}), f, indent=1)

    print("\n| phase | tenant | loop | fgpu | setting | iter/s | share % | gate launches |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['phase']} | {r['tenant']} | {r['role']} | {r['mode']} | {r['setting']} "
              f"| {fmt(rate(r))} | {fmt(r['share'])} | {fmt(r['launches'], 'd')} |")
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=sorted(set(TENANTS.values())))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--ready")
    ap.add_argument("--go")
    ap.add_argument("--analyze", action="store_true")
    ap.add_argument("--runs")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        if bool(args.ready) != bool(args.go):
            ap.error("--ready and --go go together")
        run_worker(args)
        return 0
    if args.analyze and args.runs and args.out:
        return analyze(args.runs, args.out)
    ap.error("give --worker ROLE or --analyze --runs FILE --out DIR")


if __name__ == "__main__":
    sys.exit(main())
