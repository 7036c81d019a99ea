"""Drives the parking check (tests/gpu/park.sh, issue 29): the PCIe link measured with plain
pinned copies; each server's answers alone without fgpu (the reference); then three servers
whose memory together is more than the GPU's, each in a "container" (a cgroup and a PID
namespace with its own /proc) under the shim and the agent, parkable, answering requests
round-robin. Writes $OUT/park.json and prints a table last.
"""

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print(*a, flush=True)


def pcie(py):
    """Pinned host <-> device copy rates, GB/s (best of 3 copies of 8 GiB each way)."""
    code = r"""
import json, time, torch
n = 8 << 30
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
d = torch.empty(n, dtype=torch.uint8, device="cuda")
h2d, d2h = [], []
for _ in range(3):
    torch.cuda.synchronize(); t = time.perf_counter(); d.copy_(h, non_blocking=True); torch.cuda.synchronize()
    h2d.append(n / (time.perf_counter() - t) / 1e9)
    t = time.perf_counter(); h.copy_(d, non_blocking=True); torch.cuda.synchronize()
    d2h.append(n / (time.perf_counter() - t) / 1e9)
print(json.dumps({"h2d_gbs": max(h2d), "d2h_gbs": max(d2h)}))
"""
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


class Server:
    def __init__(self, a, name, seed, weights_gib=None):
        self.name, self.seed = name, seed
        self.cg = f"{a.cg_root}/fgpu-park-{name}"
        self.err = open(os.path.join(a.out, f"server-{name}.log"), "w")
        env = dict(os.environ, LD_PRELOAD=a.shim, FGPU_SOCKET=a.sock, FGPU_LOG="info")
        cmd = ["sh", "-c", f'echo $$ > {self.cg}/cgroup.procs; exec unshare --pid --fork '
               f'--mount-proc "$@"', "sh", a.py, os.path.join(HERE, "park_server.py"),
               "--seed", str(seed), "--weights-gib", str(weights_gib or a.weights_gib)]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True, env=env)
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            try:
                self.q.put(json.loads(line))
            except ValueError:
                pass
        self.q.put(None)

    def wait(self, timeout):
        try:
            m = self.q.get(timeout=timeout)
        except queue.Empty:
            return {"error": f"no answer within {timeout} s"}
        return m if m is not None else {"error": "the server ended"}

    def ask(self, n, timeout):
        self.p.stdin.write(f"req {n}\n")
        self.p.stdin.flush()
        return self.wait(timeout)

    def stop(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.err.close()


class Resident(threading.Thread):
    """The tenant that is not parkable: asked a request every PERIOD for the whole run, each
    request's start (perf_counter, s) and latency kept, to compare its latency while others
    park and unpark with its latency alone."""

    PERIOD = 0.05

    def __init__(self, server):
        super().__init__(daemon=True)
        self.s, self.rows, self.n = server, [], 0
        self.stop_at = threading.Event()

    def run(self):
        while not self.stop_at.is_set():
            t = time.perf_counter()
            m = self.s.ask(self.n, 60)
            if "error" in m:
                self.rows.append({"t": t, "n": self.n, "error": m["error"]})
                return
            self.rows.append({"t": t, "n": self.n, "first_ms": m["first_ms"],
                              "total_ms": m["total_ms"], "out": m["out"],
                              "wall_ms": (time.perf_counter() - t) * 1000})
            self.n += 1
            self.stop_at.wait(self.PERIOD)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def resident_report(rows, windows):
    """The resident's requests by what the others were doing when each was in flight:
    'park/unpark' (overlaps a window in which another server was parked or brought back),
    'others load' (another's weights being made; the third load parks the first),
    'others compute' (overlaps another's answer, no park or unpark), 'quiet' (none)."""
    def overlaps(r, kind):
        a, b = r["t"], r["t"] + r["wall_ms"] / 1000
        return any(k == kind and s < b and a < e for k, s, e in windows)
    out = {}
    for r in rows:
        if "error" in r:
            continue
        kind = ("park/unpark" if overlaps(r, "park") else
                "others load" if overlaps(r, "load") else
                "others compute" if overlaps(r, "compute") else "quiet")
        out.setdefault(kind, []).append(r)
    return {k: {"n": len(v), "total_p50": pct([r["total_ms"] for r in v], 0.5),
                "total_p99": pct([r["total_ms"] for r in v], 0.99),
                "total_max": max(r["total_ms"] for r in v),
                "first_p50": pct([r["first_ms"] for r in v], 0.5),
                "first_max": max(r["first_ms"] for r in v)}
            for k, v in out.items()}


def memory_current(cg):
    try:
        return int(open(os.path.join(cg, "memory.current")).read())
    except (OSError, ValueError):
        return None


def status(a):
    out = subprocess.run([a.fgpu, "status", "--json", "--socket", a.admin], capture_output=True,
                         text=True, timeout=30)
    try:
        return {r["cgroup"]: r for r in json.loads(out.stdout)}
    except ValueError:
        return {}


SHIM_LINE = re.compile(
    r"fgpu: (unparked|parked) (\S+) \((\d+) bytes\) (?:in host memory )?in (\d+) ms"
    r"(?: \(([^)]*)\))?")


def shim_events(path):
    """(kind, size text, bytes, ms, phases) of every park and unpark a server's shim logged, in order."""
    try:
        return [m.groups() for m in map(SHIM_LINE.search, open(path)) if m]
    except OSError:
        return []


def main():
    ap = argparse.ArgumentParser()
    for k in ["fgpu", "admin", "sock", "shim", "cg-root", "py", "out"]:
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--weights-gib", type=float, default=47)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--gap", type=float, default=1.5)
    ap.add_argument("--resident-gib", type=float, default=4,
                    help="weights of the fourth server, not parkable, asked every 50 ms (0: none)")
    a = ap.parse_args()
    res = {"weights_gib": a.weights_gib, "requests": a.requests}
    names = [("a", 11), ("b", 22), ("c", 33)]

    log("== the PCIe link: plain pinned copies of 8 GiB")
    res["pcie"] = pcie(a.py)
    log(res["pcie"])

    log("== each server alone, without fgpu (the reference)")
    ref = {}
    for name, seed in names:
        out = subprocess.run([a.py, os.path.join(HERE, "park_server.py"), "--seed", str(seed),
                              "--weights-gib", str(a.weights_gib), "--reference",
                              str(a.requests + 1)], capture_output=True, text=True, timeout=240)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ref[name] = r
        log(name, "load_ms", r["load_ms"], [x["out"] for x in r["answers"]],
            "first_ms", [x["first_ms"] for x in r["answers"]])
    res["reference"] = ref
    if a.resident_gib:
        out = subprocess.run([a.py, os.path.join(HERE, "park_server.py"), "--seed", "44",
                              "--weights-gib", str(a.resident_gib), "--reference", "3000"],
                             capture_output=True, text=True, timeout=240)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ref["r"] = r
        # Its latency alone, without fgpu, asked as the run asks it (every 50 ms): a GPU
        # idle between requests answers slower than one asked back to back.
        out = subprocess.run([a.py, os.path.join(HERE, "park_server.py"), "--seed", "44",
                              "--weights-gib", str(a.resident_gib), "--reference", "300",
                              "--pace-ms", str(Resident.PERIOD * 1000)],
                             capture_output=True, text=True, timeout=240)
        ref["r_paced"] = json.loads(out.stdout.strip().splitlines()[-1])
        for k in ["r", "r_paced"]:
            log(f"{k} (resident) alone without fgpu: total_ms p50",
                pct([x["total_ms"] for x in ref[k]["answers"]], 0.5), "p99",
                pct([x["total_ms"] for x in ref[k]["answers"]], 0.99))

    log("== three servers under fgpu, parkable")
    servers = {}
    res["loads"] = {}
    windows = []  # (kind, start, end) in perf_counter seconds: what the parkable ones did
    resident = None
    try:
        if a.resident_gib:
            s = Server(a, "r", 44, a.resident_gib)
            servers["r"] = s
            m = s.wait(300)
            log("r (resident, not parkable) ready", m)
            if "error" in m:
                raise SystemExit(f"the resident server did not load: {m}")
            resident = Resident(s)
            resident.start()
            time.sleep(3)  # its quiet figures under fgpu before the others come
        for name, seed in names:
            s = Server(a, name, seed)
            servers[name] = s
            t = time.perf_counter()
            m = s.wait(300)
            windows.append(("load", t, time.perf_counter()))  # the third load parks another
            res["loads"][name] = m
            log(name, "ready", m)
            if "error" in m:
                raise SystemExit(f"server {name} did not load: {m}")
            time.sleep(a.gap)
        st = status(a)
        res["status_after_loads"] = {n: {k: st.get(s.cg.replace(a.cg_root, ""), {}).get(k)
                                         for k in ["memory_used_bytes", "parked_bytes", "parks",
                                                   "park_pinned"]}
                                     for n, s in servers.items()}
        log("after loads:", res["status_after_loads"])
        rows = []
        for n in range(a.requests):
            for name, _ in names:
                s = servers[name]
                time.sleep(a.gap)
                before = status(a).get(s.cg.replace(a.cg_root, ""), {})
                mem_cg = memory_current(s.cg)
                t = time.perf_counter()
                m = s.ask(n, 180)
                wall = (time.perf_counter() - t) * 1000
                if m.get("first_ms") is not None:
                    windows.append(("park", t, t + m["first_ms"] / 1000))
                    windows.append(("compute", t + m["first_ms"] / 1000, t + wall / 1000))
                want = ref[name]["answers"][n]
                row = {"server": name, "req": n, "parked_before": before.get("parked_bytes", 0),
                       "first_ms": m.get("first_ms"), "total_ms": m.get("total_ms"),
                       "wall_ms": round(wall, 1), "out": m.get("out"), "ref": want["out"],
                       "ref_first_ms": want["first_ms"], "equal": m.get("out") == want["out"],
                       "error": m.get("error"), "memory_current_before": mem_cg}
                rows.append(row)
                log(row)
        res["rows"] = rows
        # An unpark with room to spare (no other container to park first): the last
        # server asked ends, and the one parked for it is asked again; a resident one too.
        last = names[-1][0]
        servers[last].stop()
        time.sleep(a.gap + 1)
        st = status(a)
        parked = [n for n, _ in names[:-1]
                  if st.get(servers[n].cg.replace(a.cg_root, ""), {}).get("parked_bytes")]
        not_parked = [n for n, _ in names[:-1] if n not in parked]
        res["free_unpark"] = []
        for name in parked + not_parked:
            s = servers[name]
            n = a.requests
            t = time.perf_counter()
            m = s.ask(n, 180)
            if m.get("first_ms") is not None:
                windows.append(("park" if name in parked else "compute", t,
                                t + m["first_ms"] / 1000))
                windows.append(("compute", t + m["first_ms"] / 1000, time.perf_counter()))
            res["free_unpark"].append({"server": name, "parked_before": name in parked,
                                       "first_ms": m.get("first_ms"), "out": m.get("out"),
                                       "equal": m.get("out") == ref[name]["answers"][n]["out"],
                                       "wall_ms": round((time.perf_counter() - t) * 1000, 1)})
            log("after", last, "ended:", res["free_unpark"][-1])
        res["status_end"] = status(a)
    finally:
        if resident:
            resident.stop_at.set()
            resident.join(70)
        for s in servers.values():
            s.stop()
    if resident:
        rref = ref["r"]["answers"]
        res["resident"] = {
            "requests": len(resident.rows),
            "errors": [r for r in resident.rows if "error" in r][:3],
            "checked": sum(1 for r in resident.rows if r.get("n", 1e9) < len(rref)),
            "equal": all(r.get("out") == rref[r["n"]]["out"] for r in resident.rows
                         if "error" not in r and r["n"] < len(rref)),
            "alone_without_fgpu": {"total_p50": pct([x["total_ms"] for x in rref], 0.5),
                                   "total_p99": pct([x["total_ms"] for x in rref], 0.99),
                                   "total_max": max(x["total_ms"] for x in rref)},
            "alone_without_fgpu_paced": {
                "n": len(ref["r_paced"]["answers"]),
                "total_p50": pct([x["total_ms"] for x in ref["r_paced"]["answers"]], 0.5),
                "total_p99": pct([x["total_ms"] for x in ref["r_paced"]["answers"]], 0.99),
                "total_max": max(x["total_ms"] for x in ref["r_paced"]["answers"])},
            "by_window": resident_report(resident.rows, windows)}
        json.dump({"rows": resident.rows, "windows": windows},
                  open(os.path.join(a.out, "resident.json"), "w"))
    res["shim"] = {name: shim_events(os.path.join(a.out, f"server-{name}.log"))
                   for name, _ in names}
    res["shim"]["r"] = shim_events(os.path.join(a.out, "server-r.log")) if resident else []
    json.dump(res, open(os.path.join(a.out, "park.json"), "w"), indent=1)

    # The table.
    h2d = res["pcie"]["h2d_gbs"]
    log()
    log(f"PCIe, pinned 8 GiB copies: host->device {h2d:.1f} GB/s, "
        f"device->host {res['pcie']['d2h_gbs']:.1f} GB/s")
    log(f"{'server':6} {'req':>3} {'parked before':>13} {'first token ms':>14} "
        f"{'alone ms':>8} {'answer':>6}")
    for r in res["rows"]:
        log(f"{r['server']:6} {r['req']:>3} {r['parked_before'] / 2**30:>11.1f}Gi "
            f"{r['first_ms'] if r['first_ms'] is not None else '-':>14} {r['ref_first_ms']:>8} "
            f"{'equal' if r['equal'] else 'DIFF':>6}")
    for name, ev in res["shim"].items():
        for kind, size, nbytes, ms, phases in ev:
            extra = f" [{phases}]" if phases else ""
            if kind == "unparked":
                ideal = int(nbytes) / (h2d * 1e9) * 1000
                extra += f" (the link's copy time {ideal:.0f} ms: {int(ms) / ideal:.2f}x)"
            elif kind == "parked":
                extra += f" ({int(nbytes) / (int(ms) / 1000) / 1e9:.1f} GB/s)" if int(ms) else ""
            log(f"{name}: {kind} {size} in {ms} ms{extra}")
    for f in res.get("free_unpark", []):
        log(f"{f['server']} asked with room to spare, {'parked' if f['parked_before'] else 'resident'}"
            f" before: first token {f['first_ms']} ms, answer {'equal' if f['equal'] else 'DIFF'}")
    for r in res["rows"]:
        if r["parked_before"] and r["memory_current_before"] is not None:
            log(f"{r['server']} req {r['req']}: parked {r['parked_before'] / 2**30:.1f} GiB, its "
                f"cgroup's memory.current {r['memory_current_before'] / 2**30:.1f} GiB")
            break
    ok = (all(r["equal"] for r in res["rows"] + res.get("free_unpark", []))
          and len(res["rows"]) == 3 * a.requests)
    if resident:
        rr = res["resident"]
        log(f"resident r ({a.resident_gib:g} GiB, not parkable, a request every 50 ms): "
            f"{rr['requests']} requests, {rr['checked']} checked against the reference: "
            f"{'equal' if rr['equal'] else 'DIFF'}; parked or unparked itself: "
            f"{len(res['shim']['r'])} times")
        log(f"  {'r asked while':16} {'n':>5} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}")
        al = rr["alone_without_fgpu"]
        log(f"  {'alone, no fgpu':16} {len(rref):>5} {al['total_p50']:>7} {al['total_p99']:>7}"
            f" {al['total_max']:>7}  (back to back)")
        ap_ = rr["alone_without_fgpu_paced"]
        log(f"  {'alone, no fgpu':16} {ap_['n']:>5} {ap_['total_p50']:>7} {ap_['total_p99']:>7}"
            f" {ap_['total_max']:>7}  (every 50 ms, as in the run)")
        for k in ["quiet", "others load", "others compute", "park/unpark"]:
            v = rr["by_window"].get(k)
            if v:
                log(f"  {k:16} {v['n']:>5} {v['total_p50']:>7.1f} {v['total_p99']:>7.1f}"
                    f" {v['total_max']:>7.1f}")
        ok = ok and rr["equal"] and not rr["errors"] and not res["shim"]["r"]
    log("ALL ANSWERS EQUAL TO THE REFERENCE" if ok else "SOME ANSWERS DIFFER OR ARE MISSING")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
