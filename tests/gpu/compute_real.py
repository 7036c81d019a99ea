#!/usr/bin/env python3
"""Criteria and table for compute_real.sh (issue 10): compute_real.py --runs RUNS.jsonl --out DIR

A share is throughput: iterations/s of a worker ÷ the same workload alone without fgpu (its
ref-ROLE phase; for the two-process container, both processes ÷ the two alone, ref2p).
Prints PASS/FAIL/INFO lines and a table last; writes DIR/compute_real.json. Exit 1 on a FAIL.
"""

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys

GATE_RE = re.compile(r"compute gate: (launches=\d+.*)$")


def load(path):
    res, gate = None, None
    try:
        text = open(path, errors="replace").read()
    except OSError as e:
        return None, None, f"(no log: {e})"
    for line in text.splitlines():
        if line.startswith("RESULT "):
            try:
                res = json.loads(line[7:])
            except ValueError:
                pass
        m = GATE_RE.search(line)
        if m:
            gate = m.group(1)
    return res, gate, text


def fmt(x, spec=".1f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def rate_between(progress, t0, t1):
    """Iterations/s between wall times t0 and t1 from [time, n] samples (nan if none)."""
    pts = [p for p in progress if t0 <= p[0] <= t1]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return math.nan
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


# The interleaved mixes (compute_real.sh ILV=...): name -> (tenant, label, setting) per tenant.
ILV_MIXES = {
    "dec": [("a", "decoder", 50), ("b", "cnn", 50)],
    "mp": [("a", "2-process cnn container", 50), ("b", "1-process cnn container", 50)],
    "s25": [("a", "cnn", 25), ("b", "attn", 75)],
    "s3": [("a", "cnn", 20), ("b", "attn", 30), ("c", "graph", 50)],
}


def ilv(runs, out, check):
    """Shares from the interleaved phases: each tenant's rate in every mix (and slice) window
    against the mean of its alone windows nearest before and after it (a container's
    processes added up); the share is the mean over the mix windows."""
    settle = float(os.environ.get("ILV_SETTLE", "0.3"))
    windows = {}
    try:
        for line in open(os.path.join(out, "ilv.txt")):
            phase, kind, t0, t1 = line.split()
            windows.setdefault(phase, []).append((kind, float(t0) + settle, float(t1)))
    except OSError:
        return
    for phase, wins in windows.items():
        mix = phase[len("ilv-"):].split("@")[0]
        procs = [r for r in runs if r["phase"] == phase and r.get("result")]
        tenants = ILV_MIXES.get(mix, [])
        shares = {}
        for t, label, want in tenants:
            prog = [r["result"]["progress"] for r in procs if r["tenant"] == t]
            if not prog:
                check(f"{phase}: {label}", False, "no result", "a rate per window")
                continue
            rate = [sum(rate_between(p, a, b) for p in prog) for _, a, b in wins]
            alone = [i for i, w in enumerate(wins) if w[0] == f"alone-{t}"]

            def against_alone(i):
                near = ([j for j in alone if j < i][-1:] + [j for j in alone if j > i][:1])
                ref = [rate[j] for j in near if rate[j] > 0]
                return 100 * rate[i] / statistics.mean(ref) if ref else math.nan

            got = {k: [against_alone(i) for i, w in enumerate(wins) if w[0] == k]
                   for k in ("mix", "slice")}
            m = statistics.mean(got["mix"]) if got["mix"] else math.nan
            sl = statistics.mean(got["slice"]) if got["slice"] else math.nan
            shares[t] = (m, sl, want)
            alone_rates = " / ".join(fmt(rate[j]) for j in alone)
            check(f"{phase}: {label} alone, ungated (its reference, per window)", True,
                  f"{alone_rates} it/s", "info", verdict="INFO")
            check(f"{phase}: {label}, driver time-slicing (comparison)", True,
                  f"{fmt(sl)}% ({' / '.join(fmt(x) for x in got['slice'])})", "none",
                  verdict="INFO")
            windows_txt = " / ".join(fmt(x) for x in got["mix"])
            if mix == "dec" and t == "a":
                check(f"{phase}: {label} at --compute {want}, of its rate alone", m >= 50
                      and (math.isnan(sl) or m >= sl), f"{fmt(m)}% ({windows_txt})",
                      f">= 50 and >= time-slicing's {fmt(sl)}")
            elif mix == "dec":
                check(f"{phase}: {label} next to it at --compute {want}", m >= 50,
                      f"{fmt(m)}% ({windows_txt})", ">= 50")
            else:
                check(f"{phase}: {label} at --compute {want}", abs(m - want) <= 5,
                      f"{fmt(m)}% ({windows_txt})", f"{want} +- 5")
        if mix in ("s25", "s3") and len(shares) == len(tenants):
            total = sum(v[0] for v in shares.values())
            check(f"{phase}: total", total >= 90, f"{fmt(total)}%", ">= 90%")


def join_turn_series(log, cgroup, t0, t_end, join="join"):
    """(time, turn_pct_1s) of CGROUP's once-a-second controller lines in the phase JOIN of
    agent.log whose second lies within [t0, t_end] (the line's time ends its second)."""
    out, phase = [], None
    try:
        for line in open(log, errors="replace"):
            if line.startswith("PHASE-START "):
                phase = line.split()[1]
            elif line.startswith("PHASE-END "):
                phase = None
            elif phase == join and "compute tenant" in line and cgroup in line:
                m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z", line.strip())
                v = re.search(r'turn_pct_1s="?([0-9.]+)', line)
                if not (m and v):
                    continue
                t = datetime.datetime.fromisoformat(m.group(1)).replace(
                    tzinfo=datetime.timezone.utc).timestamp()
                if t0 + 1 <= t <= t_end:
                    # A second in which the open probe ran the device open has no turns to
                    # share (its work share is in the work checks): NaN, shown as "open".
                    is_open = "device_open=true" in line
                    out.append((t, math.nan if is_open else float(v.group(1))))
    except OSError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = [json.loads(l) for l in open(args.runs) if l.strip()]
    for r in runs:
        r["result"], r["gate"], text = load(r["log"])
        if r["result"] is None:
            r["log_tail"] = text[-1200:]

    def get(phase, tenant, n=1):
        return next((r for r in runs if r["phase"] == phase and r["tenant"] == tenant
                     and r["n"] == n), None)

    def per_s(r):
        return r["result"]["per_s"] if r and r.get("result") else math.nan

    # The references: the mean of each workload's runs alone (ref-ROLE first, ref2-ROLE
    # last), the spread shown.
    alone = {}
    for r in runs:
        if r["phase"].startswith(("ref-", "ref2-")) and per_s(r) > 0:
            alone.setdefault(r["role"], []).append(per_s(r))
    ref = {k: statistics.mean(v) for k, v in alone.items()}
    ref2p = per_s(get("ref2p", "a", 1)) + per_s(get("ref2p", "a", 2))
    # The two-process reference drifts like the one-process ones: scale it by their ratio.
    first = alone.get("cnn", [math.nan])[0]
    if "cnn" in ref and first > 0:
        ref2p *= ref["cnn"] / first
    for r in runs:
        # An interleaved phase's rate over the whole run mixes its windows: see ilv().
        r["share"] = (math.nan if r["phase"].startswith("ilv-")
                      else 100 * per_s(r) / ref.get(r["role"], math.nan))
    # With bracketing runs alone (BRACKET=1: refb* phases), each share is taken against the
    # mean of the nearest run alone of its workload before it and after it instead.
    is_ref = lambda r: r["phase"].startswith(("ref-", "ref2-", "refb")) and per_s(r) > 0
    if any(r["phase"].startswith("refb") for r in runs):
        for i, r in enumerate(runs):
            if is_ref(r) or r["phase"].startswith(("ab", "slice", "ref2p", "ilv-")):
                continue
            before = [x for x in runs[:i] if is_ref(x) and x["role"] == r["role"]]
            after = [x for x in runs[i + 1:] if is_ref(x) and x["role"] == r["role"]]
            near = [per_s(x) for x in (before[-1:] + after[:1])]
            if near:
                r["ref_local"] = statistics.mean(near)
                r["share"] = 100 * per_s(r) / r["ref_local"]

    checks, fails = [], 0

    def check(name, ok, figure, target, verdict=None):
        nonlocal fails
        verdict = verdict or ("PASS" if ok else "FAIL")
        fails += verdict == "FAIL"
        print(f"{verdict}: {name}: {figure} (target {target})", flush=True)
        checks.append({"check": name, "figure": figure, "target": target, "verdict": verdict})

    def sh(phase, tenant, n=1):
        r = get(phase, tenant, n)
        return r["share"] if r else math.nan

    ran = {r["phase"] for r in runs}

    def two_alone_near(phase):
        """Both processes' rates of the two-process runs alone (ref2p, ref2pbN) nearest
        before and after PHASE (only those that ran whole); none without a run after it."""
        order = list(dict.fromkeys(r["phase"] for r in runs))
        if phase not in order:
            return []
        i = order.index(phase)
        twos = [p for p in order if p.startswith("ref2p")]
        sums = {p: per_s(get(p, "a" if p == "ref2p" else "c", 1))
                + per_s(get(p, "a" if p == "ref2p" else "c", 2)) for p in twos}
        before = [p for p in twos if order.index(p) < i and sums[p] > 0]
        after = [p for p in twos if order.index(p) > i and sums[p] > 0]
        return [sums[p] for p in before[-1:] + after[:1]] if after else []
    if alone or not any(r["phase"].startswith("ilv-") for r in runs):
        check("references alone, no fgpu (mean of the runs)", all(v > 0 for v in ref.values())
              and bool(ref), ", ".join(f"{k} {fmt(v)}/s ({' / '.join(fmt(x) for x in alone[k])})"
                                       for k, v in ref.items()), "measured")

    def shares(phase, wants, names):
        if phase not in ran:
            return
        got = [sh(phase, t) for t in "abc"[: len(wants)]]
        sl = "slice" + phase[1:] if not phase.startswith("s3") else "slice3"
        if sl in ran:
            check(f"{sl}: driver time-slicing (comparison)", True,
                  " / ".join(f"{n} {fmt(sh(sl, t))}%" for n, t in zip(names, "abc")), "none",
                  verdict="INFO")
        for g, w, n in zip(got, wants, names):
            check(f"{phase}: {n} at --compute {w}", abs(g - w) <= 5, f"{fmt(g)}%", f"{w} +- 5")
        check(f"{phase}: total", sum(got) >= 90, f"{fmt(sum(got))}%", ">= 90%")

    variants = [""] + sorted({"@" + p.split("@", 1)[1] for p in ran if "@" in p})
    for v in variants:
        shares("s25" + v, [25, 75], ["cnn", "attn"])
        shares("s3" + v, [20, 30, 50], ["cnn", "attn", "graph"])
        shares("s30" + v, [30, 70], ["matmul", "graph"])
        shares("s50" + v, [50, 50], ["matmul", "graph"])

        if "mp" + v in ran:
            mp = "mp" + v
            # The two-process reference: the mean of the two-process runs alone nearest
            # before and after the mix (BRACKET=1: ref2pbN), else ref2p moved with the
            # one-process cnn's local reference.
            near = two_alone_near(mp)
            local = (get(mp, "a", 1) or {}).get("ref_local")
            if near:
                r2p = statistics.mean(near)
            else:
                r2p = ref2p * local / ref["cnn"] if local and "cnn" in ref else ref2p
            two = 100 * (per_s(get(mp, "a", 1)) + per_s(get(mp, "a", 2))) / r2p
            one = sh(mp, "b")
            check(f"{mp}: 2-process container at --compute 50 (both ÷ both alone)",
                  abs(two - 50) <= 5,
                  f"{fmt(two)}% ({fmt(sh(mp, 'a', 1))} + {fmt(sh(mp, 'a', 2))} of one alone)",
                  "50 +- 5")
            check(f"{mp}: 1-process container at --compute 50", abs(one - 50) <= 5,
                  f"{fmt(one)}%", "50 +- 5")

        for dec in ("dec" + v, "dech" + v):
            if dec not in ran:
                continue
            d, t = sh(dec, "a"), sh(dec, "b")
            ds, ts = sh("slicedec", "a"), sh("slicedec", "b")
            if not v and dec == "dec":
                check("slicedec: driver time-slicing, decoder / cnn (comparison)", True,
                      f"{fmt(ds)}% / {fmt(ts)}%", "none", verdict="INFO")
            check(f"{dec}: decoder at --compute 50, of its solo token rate",
                  d >= 50 and (math.isnan(ds) or d >= ds), f"{fmt(d)}%",
                  f">= 50 and >= time-slicing's {fmt(ds)}")
            check(f"{dec}: cnn training next to it at --compute 50",
                  t >= 50 and (math.isnan(ts) or t >= ts), f"{fmt(t)}%",
                  f">= 50 and >= time-slicing's {fmt(ts)}")

    if "kill" in ran:
        try:
            t_kill = json.load(open(os.path.join(args.out, "kill-time.json")))["t_kill"]
        except (OSError, ValueError, KeyError):
            t_kill = math.nan
        b = get("kill", "b")
        a2 = get("kill", "a", 2)
        prog = (b or {}).get("result", {}) or {}
        prog = prog.get("progress", [])
        ra = (b or {}).get("ref_local") or ref.get("attn", math.nan)
        after = 100 * rate_between(prog, t_kill + 0.2, t_kill + 1.2) / ra
        before = 100 * rate_between(prog, t_kill - 2.0, t_kill) / ra
        check("kill: attn before its neighbour's container is killed (50/50)", True,
              f"{fmt(before)}%", "info", verdict="INFO")
        check("kill: attn from 200 ms after the kill, alone", after >= 90, f"{fmt(after)}%",
              ">= 90% of alone")
        if a2 and a2.get("result"):
            r2 = a2["result"]
            both = 100 * rate_between(prog, r2["t_start"] + 0.5, r2["t_end"]) / ra
            check("kill: a new cnn process in the killed container", abs(a2["share"] - 50) <= 5,
                  f"{fmt(a2['share'])}%", "50 +- 5")
            check("kill: attn next to the new process", abs(both - 50) <= 5, f"{fmt(both)}%",
                  "50 +- 5")
        else:
            check("kill: a new cnn process in the killed container", False, "no result", "50 +- 5")

    for v in variants:
        jp = "join" + v
        if jp not in ran:
            continue
        a, b = get(jp, "a"), get(jp, "b")
        if a and b and a.get("result") and b.get("result"):
            pa, pb = a["result"]["progress"], b["result"]["progress"]
            ra, rb = ref.get("attn", math.nan), ref.get("cnn", math.nan)
            t0 = b["result"]["t_start"]
            try:
                t_b = json.load(open(os.path.join(args.out, f"{jp}-time.json")))["t_start_b"]
            except (OSError, ValueError, KeyError):
                t_b = t0
            # Only the seconds both ran in full: the joiner alone after the incumbent ended
            # is not a share (a run with SECS=12 counted 101.8 / 98.1 / ... there).
            a_end = a["result"].get("t_end", math.inf)
            both = [i for i in range(9) if t0 + i + 1 <= a_end]
            inc = [100 * rate_between(pa, t0 + i, t0 + i + 1) / ra for i in both]
            new = [100 * rate_between(pb, t0 + i, t0 + i + 1) / rb for i in both]
            warm = [100 * rate_between(pa, t_b + i, t_b + i + 1) / ra
                    for i in range(int(max(t0 - t_b, 0)))]
            check(f"{jp}: attn (incumbent) per second while the cnn process starts and warms up",
                  all(x >= 40 for x in warm if not math.isnan(x)),
                  " / ".join(fmt(x) for x in warm) + f" ({fmt(t0 - t_b)} s)", ">= 40 each")
            check(f"{jp}: cnn (joiner) per second from its first measured step", all(
                40 <= x <= 60 for x in new if not math.isnan(x)) and bool(new),
                " / ".join(fmt(x) for x in new), "40-60 each")
            check(f"{jp}: attn (incumbent) per second meanwhile",
                  all(x >= 40 for x in inc if not math.isnan(x)) and bool(inc),
                  " / ".join(fmt(x) for x in inc), ">= 40 each")
            late = [x for x in new[2:] if not math.isnan(x)]
            check(f"{jp}: cnn's work settled from its 3rd second", all(abs(x - 50) <= 5 for x in late)
                  and bool(late), " / ".join(fmt(x) for x in late), "50 +- 5")
            # Issue 25 item 2 in its own terms: the joiner's share of the device's time (the
            # controller's once-a-second `turn_pct_1s`, each line the second before it) in every
            # second both ran, settled from its 3rd second.
            turn = join_turn_series(os.path.join(args.out, "agent.log"), "fgpu-real-b", t0, a_end,
                                    jp)
            def shown(xs):
                return " / ".join("open" if math.isnan(x) else fmt(x) for x in xs)

            in_turns = [x for _, x in turn if not math.isnan(x)]
            check(f"{jp}: cnn's turn share per second while both run (seconds in turns)", all(
                40 <= x <= 60 for x in in_turns) and bool(in_turns),
                shown(x for _, x in turn), "40-60 each")
            settled = [x for t, x in turn if t >= t0 + 3]
            check(f"{jp}: cnn's turn share settled from its 3rd second (seconds in turns)",
                  all(abs(x - 50) <= 5 for x in settled if not math.isnan(x))
                  and any(not math.isnan(x) for x in settled),
                  shown(settled), "50 +- 5")
        else:
            check(f"{jp}: both workers", False, "no result", "results")
    for v in variants:
        if "cap30" + v in ran:
            r = get("cap30" + v, "a")
            prog = (r or {}).get("result", {}) or {}
            prog = prog.get("progress", [])
            t0 = prog[0][0] if prog else 0
            ra = ref.get("attn", math.nan)
            wins = [100 * rate_between(prog, t0 + 2 * i, t0 + 2 * i + 2) / ra
                    for i in range(max(int((prog[-1][0] - t0) // 2), 0))] if prog else []
            check(f"cap30{v}: attn alone at --compute-cap 30 (its rate ÷ alone)",
                  25 <= sh("cap30" + v, "a") <= 32, f"{fmt(sh('cap30' + v, 'a'))}%", "25-32")
            check(f"cap30{v}: per 2 s window", all(x <= 32 for x in wins) and bool(wins),
                  " / ".join(fmt(x) for x in wins), "<= 32 each")

    ilv(runs, args.out, check)

    for role in ("decoder", "cnn"):
        if f"alone50-{role}" in ran:
            g = sh(f"alone50-{role}", "a")
            check(f"alone50: {role} alone at --compute 50 (the gated path's own cost)", True,
                  f"{fmt(g)}% of its rate without fgpu", "info", verdict="INFO")

    bare = [per_s(r) for r in runs if re.fullmatch(r"bare\d+", r["phase"])]
    full = [per_s(r) for r in runs if re.fullmatch(r"full\d+", r["phase"])]
    if bare and full:
        mb, mf = statistics.median(bare), statistics.median(full)
        check("--compute 100 under agent + shim vs no fgpu (matmul, medians)", mf >= 0.99 * mb,
              f"{fmt(100 * mf / mb, '.2f')}% ({fmt(mf)} vs {fmt(mb)} it/s)", ">= 99%")

    status = {}
    for p in sorted(ran):
        try:
            status[p] = json.load(open(os.path.join(args.out, f"status-{p}.json")))
        except (OSError, ValueError):
            pass
    for p, rows in status.items():
        if isinstance(rows, list):
            view = {r.get("cgroup"): {k: r.get(k) for k in ("compute_share_pct", "compute_turn_pct",
                    "compute_used_pct", "compute_corun", "compute_nvml_pct")}
                    for r in rows if "fgpu-real" in str(r.get("cgroup"))}
            print(f"INFO: agent's view during {p}: {json.dumps(view, sort_keys=True)}")
    # How the turns went, per gated phase and tenant (the controller's once-a-second debug
    # lines between the script's PHASE-START/END markers in agent.log), averaged per turn.
    turn_stats = {}
    try:
        phase_now = None
        for line in open(os.path.join(args.out, "agent.log"), errors="replace"):
            if line.startswith("PHASE-START "):
                phase_now = line.split()[1]
            elif line.startswith("PHASE-END "):
                phase_now = None
            elif phase_now and "compute tenant" in line and "fgpu-real-" in line:
                kv = dict(re.findall(r'(\w+)="?([^" ]+)"?', line))
                key = (phase_now, kv.get("cgroup", "?").rsplit("-", 1)[-1])
                acc = turn_stats.setdefault(key, {"lines": 0, "turns": 0, "w": {}})
                acc["lines"] += 1
                n = int(kv.get("turns", 0))
                acc["turns"] += n
                for f in ("ended_idle", "ended_cap", "drain_deadline"):
                    acc[f] = acc.get(f, 0) + int(kv.get(f, 0))
                for f in ("turn_ms", "first_launch_ms", "drain_ms", "switch_wait_ms"):
                    acc["w"][f] = acc["w"].get(f, 0.0) + n * float(kv.get(f, 0))
                acc["duty"] = kv.get("duty")
                acc["mode"] = kv.get("mode")
    except OSError:
        pass
    for (p, t), acc in sorted(turn_stats.items()):
        n = max(acc["turns"], 1)
        per = " ".join(f"{f}={acc['w'][f] / n:.2f}" for f in acc["w"])
        print(f"INFO: turns in {p} for {t}: {acc['turns']} in {acc['lines']} s, {per}, "
              f"ended_idle={acc.get('ended_idle', 0)} drain_deadline={acc.get('drain_deadline', 0)} "
              f"duty={acc['duty']} mode={acc['mode']}")
    missing = [f"{r['phase']}/{r['tenant']}-{r['n']} (rc {r['rc']})" for r in runs
               if not r["result"] and not (r["phase"] == "kill" and r["n"] == 1 and r["tenant"] == "a")]
    if missing:
        print("WARN: no result from " + ", ".join(missing))
    for r in runs:
        if r["phase"] not in ("kill", "join") and r.get("result"):
            r["result"].pop("progress", None)
    json.dump({"references": ref, "ref2p": ref2p, "checks": checks, "runs": runs,
               "status": status}, open(os.path.join(args.out, "compute_real.json"), "w"),
              indent=1, default=str)
    # The GPU's SM clock and power per phase (nvidia-smi samples every 200 ms).
    clocks = {}
    try:
        spans = {}
        for line in open(os.path.join(args.out, "phases.txt")):
            name, what, at = line.split()
            spans.setdefault(name, {})[what] = float(at)
        samples = []
        for line in open(os.path.join(args.out, "smi.csv")):
            f = [x.strip() for x in line.split(",")]
            try:
                at = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                samples.append((at, float(f[1]), float(f[3]), float(f[4])))
            except (ValueError, IndexError):
                continue
        for name, sp in spans.items():
            if "start" in sp and "end" in sp:
                v = [x for x in samples if sp["start"] + 1 <= x[0] <= sp["end"]]
                if v:
                    clocks[name] = (statistics.median(x[1] for x in v),
                                    statistics.median(x[2] for x in v),
                                    statistics.median(x[3] for x in v))
    except OSError:
        pass

    def clock(r):
        c = clocks.get(r["phase"])
        return f"{c[0]:.0f} / {c[1]:.0f} / {c[2]:.0f}" if c else "-"

    def step_us(r):
        """Median time between steps from the worker's trace (TRACE=1), µs."""
        path = r["log"][: -len(".log")] + ".trace.json"
        try:
            t = json.load(open(path))
        except (OSError, ValueError):
            return "-"
        gaps = [b - a for a, b in zip(t, t[1:])]
        return f"{1e6 * statistics.median(gaps):.0f}" if gaps else "-"

    for role in ("decoder", "cnn", "tiny", "launches"):
        bare = [per_s(r) for r in runs if re.fullmatch(rf"ab\d+-bare-{role}", r["phase"])]
        gated = [per_s(r) for r in runs if re.fullmatch(rf"ab\d+-gated-{role}", r["phase"])]
        old = [per_s(r) for r in runs if re.fullmatch(rf"ab\d+-old-{role}", r["phase"])]
        local = [per_s(r) for r in runs if re.fullmatch(rf"ab\d+-local-{role}", r["phase"])]
        if bare and local:
            check(f"ab: {role} under the standalone gate (FGPU_COMPUTE_SHARE=99) vs no fgpu", True,
                  f"{fmt(100 * statistics.mean(local) / statistics.mean(bare))}% "
                  f"({' / '.join(fmt(x) for x in local)} it/s)", "info", verdict="INFO")
        if bare and old:
            check(f"ab: {role} alone at --compute 50 with SHIM_OLD vs no fgpu, interleaved", True,
                  f"{fmt(100 * statistics.mean(old) / statistics.mean(bare))}% "
                  f"({' / '.join(fmt(x) for x in old)} it/s)", "info", verdict="INFO")
        if bare and gated:
            check(f"ab: {role} alone at --compute 50 vs no fgpu, interleaved", True,
                  f"{fmt(100 * statistics.mean(gated) / statistics.mean(bare))}% "
                  f"({' / '.join(fmt(x) for x in gated)} vs {' / '.join(fmt(x) for x in bare)} it/s)",
                  "info", verdict="INFO")

    def cpu(r):
        res = r.get("result") or {}
        if "cpu_s" not in res:
            return "-"
        return f"{100 * res['cpu_s'] / max(res['seconds'], 1e-9):.0f} ({res['nvcsw']}/{res['nivcsw']})"

    print("\n| phase | tenant | loop | fgpu | iter/s | share % | median step µs | cpu % (vol/invol switches) | SM MHz / W / util % | gate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['phase']} | {r['tenant']}{'' if r['n'] == 1 else r['n']} | {r['role']} "
              f"| {r['mode']} | {fmt(per_s(r))} | {fmt(r['share'])} | {step_us(r)} | {cpu(r)} "
              f"| {clock(r)} | {r['gate'] or '-'} |")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
