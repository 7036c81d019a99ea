"""One "container" of tests/gpu/containers.sh: reports torch.cuda.mem_get_info() and
nvidia-smi's view, allocates 256 MiB tensors until torch.OutOfMemoryError, reports, and holds
until $FGPU_WORK/<name>.go exists. `bypass N`: 1 GiB tensors without the shim, up to N."""
import json
import os
import subprocess
import sys
import time

import torch

mode, name = sys.argv[1], sys.argv[2]
work = os.environ["FGPU_WORK"]
out = {"name": name, "mode": mode, "pid_in_namespace": os.getpid(),
       "env_limit": os.environ.get("FGPU_MEMORY_LIMIT")}


def report():
    tmp = os.path.join(work, name + ".json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.rename(tmp, os.path.join(work, name + ".json"))


if mode == "shim":
    free, total = torch.cuda.mem_get_info()
    out["mem_get_info_total"], out["mem_get_info_free"] = total, free
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30,
    )
    out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()[-200:]
    tensors = []
    try:
        while len(tensors) < 400:
            tensors.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        out["error"] = None
    except torch.OutOfMemoryError as e:
        out["error"] = "OutOfMemoryError: " + str(e)[:160]
    out["tensors_256mib"] = len(tensors)
    out["reserved"] = torch.cuda.memory_reserved()
    report()
    deadline = time.time() + 90
    while not os.path.exists(os.path.join(work, name + ".go")) and time.time() < deadline:
        time.sleep(0.05)
else:
    tensors = []
    for i in range(int(sys.argv[3])):
        tensors.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        out["tensors_1gib"] = len(tensors)
        report()
        time.sleep(0.2)
    out["survived"] = True
    report()
