"""One "container" of tests/gpu/agent_limits.sh.

shim mode:   report mem_get_info and nvidia-smi's view, allocate 1 GiB tensors until
             torch.OutOfMemoryError, report, then hold until $FGPU_WORK/<name>.go exists.
bypass mode: allocate 1 GiB tensors (no shim: LD_PRELOAD unset) up to a count; the agent's
             kernel backstop should kill the process once its cgroup is over the limit.
"""
import json
import os
import subprocess
import sys
import time

import torch

mode, name = sys.argv[1], sys.argv[2]
work = os.environ["FGPU_WORK"]
out = {"name": name, "mode": mode, "pid_in_namespace": os.getpid()}


def report():
    tmp = os.path.join(work, name + ".json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.rename(tmp, os.path.join(work, name + ".json"))


if mode == "shim":
    free, total = torch.cuda.mem_get_info()
    out["mem_get_info_total"] = total
    out["mem_get_info_free"] = free
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30,
    )
    out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()[-200:]
    tensors = []
    try:
        while len(tensors) < 200:
            tensors.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
        out["error"] = None
    except torch.OutOfMemoryError as e:
        out["error"] = "OutOfMemoryError: " + str(e)[:160]
    out["tensors"] = len(tensors)
    out["reserved"] = torch.cuda.memory_reserved()
    report()
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(work, name + ".go")) and time.time() < deadline:
        time.sleep(0.05)
else:
    count = int(sys.argv[3])
    tensors = []
    for i in range(count):
        tensors.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        out["tensors"] = len(tensors)
        report()
        time.sleep(0.2)  # the backstop acts on the kernel's event; give it time each step
    out["survived"] = True
    report()
