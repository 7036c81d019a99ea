#!/usr/bin/env python3
"""The probes of compute_real.sh: compute_probe.py --out DIR

- toggle-ROLE phases (toggles.txt): a process alone whose container flips between
  --compute 50 and no setting every second. Per pair of windows (the first 0.2 s after each
  flip left out), the gated window's rate ÷ the mean of the ungated windows beside it: the
  gate's own cost on one process, free of drift between runs.
- NVML samples (nvml.jsonl, NVML=1): per phase and cgroup, the mean smUtil and how far apart
  NVML's samples are.
Prints a table; writes DIR/compute_probe.json.
"""

import argparse
import json
import math
import os
import statistics


def rate_between(progress, t0, t1):
    pts = [p for p in progress if t0 <= p[0] <= t1]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return math.nan
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def result(log):
    try:
        for line in open(log, errors="replace"):
            if line.startswith("RESULT "):
                return json.loads(line[7:])
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    runs = [json.loads(l) for l in open(os.path.join(out, "runs.jsonl")) if l.strip()]
    summary = {"toggle": {}, "nvml": {}}
    flips = {}
    path = os.path.join(out, "toggles.txt")
    for line in open(path) if os.path.exists(path) else []:
        ph, what, t = line.split()
        flips.setdefault(ph, []).append((what, float(t)))
    for ph, fl in flips.items():
        r = next((r for r in runs if r["phase"] == ph), None)
        res = result(r["log"]) if r else None
        if not res:
            print(f"{ph}: no result")
            continue
        prog = res["progress"]
        wins = []
        for i, (what, t0) in enumerate(fl):
            t1 = fl[i + 1][1] if i + 1 < len(fl) else res["t_end"]
            wins.append((what, rate_between(prog, t0 + 0.2, t1)))
        ratios = []
        for i, (what, v) in enumerate(wins):
            if what != "on":
                continue
            nb = [w for j, (wt, w) in enumerate(wins) if wt == "off" and abs(j - i) == 1 and w == w]
            if nb and v == v:
                ratios.append(v / statistics.mean(nb))
        on = [v for w, v in wins if w == "on" and v == v]
        off = [v for w, v in wins if w == "off" and v == v]
        s = {"gated_per_s": on, "ungated_per_s": off, "ratios": ratios,
             "median_ratio": statistics.median(ratios) if ratios else math.nan}
        summary["toggle"][ph] = s
        print(f"{ph}: gated/ungated per window pair: "
              + " ".join(f"{x:.3f}" for x in ratios)
              + f"; median {s['median_ratio']:.3f}; gated mean {statistics.mean(on) if on else math.nan:.1f}/s,"
              f" ungated {statistics.mean(off) if off else math.nan:.1f}/s")
    phases = {}
    path = os.path.join(out, "phases.txt")
    for line in open(path) if os.path.exists(path) else []:
        name, what, t = line.split()
        phases.setdefault(name, {})[what] = float(t)
    path = os.path.join(out, "nvml.jsonl")
    samples = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    for name, p in phases.items():
        if "start" not in p or "end" not in p:
            continue
        # Skip the warm-up: the measured part starts a couple of seconds in.
        t0, t1 = p["start"] + 2.5, p["end"]
        per = {}
        for s in samples:
            if t0 <= s["ts"] <= t1:
                per.setdefault(s["cg"], []).append(s)
        if not per:
            continue
        row = {}
        for cg, ss in per.items():
            ts = sorted({s["ts"] for s in ss})
            gaps = [b - a for a, b in zip(ts, ts[1:])]
            by_ts = {}
            for s in ss:  # several processes of one cgroup: sum per sample time
                by_ts[s["ts"]] = by_ts.get(s["ts"], 0) + s["sm"]
            row[cg] = {"sm_mean": statistics.mean(by_ts.values()), "samples": len(ts),
                       "gap_ms_median": 1000 * statistics.median(gaps) if gaps else math.nan}
        summary["nvml"][name] = row
        print(f"nvml {name}: " + "; ".join(
            f"{cg.rsplit('/', 1)[-1] or cg} sm {v['sm_mean']:.1f}% ({v['samples']} samples, "
            f"every {v['gap_ms_median']:.0f} ms)" for cg, v in sorted(row.items())))
    json.dump(summary, open(os.path.join(out, "compute_probe.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
