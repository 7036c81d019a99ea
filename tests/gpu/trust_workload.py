"""One "container" of tests/gpu/trust.sh (issue 11: kernel backstop, hierarchical limits).

shim NAME GIB:     under the shim: allocate 256 MiB tensors until GIB or
                   torch.OutOfMemoryError; report bytes held, the error and mem_get_info,
                   then hold until $FGPU_WORK/NAME.go exists (so that siblings overlap).
bypass NAME COUNT: without the shim: allocate up to COUNT 256 MiB tensors as fast as it
                   can, recording after each one how many it holds; the kernel backstop
                   should SIGKILL it at the allocation that crosses its cgroup's limit.
Reports go to $FGPU_WORK/NAME.json (bypass: rewritten after every tensor).
"""
import json
import os
import sys
import time

import torch

CHUNK = 256 << 20
mode, name = sys.argv[1], sys.argv[2]
work = os.environ["FGPU_WORK"]
out = {"name": name, "mode": mode, "chunk": CHUNK, "tensors": 0, "error": None}


def report():
    tmp = os.path.join(work, name + ".json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.rename(tmp, os.path.join(work, name + ".json"))


torch.cuda.init()
free, total = torch.cuda.mem_get_info()
out["mem_get_info_total"] = total
out["mem_get_info_free"] = free
report()
tensors = []
if mode == "shim":
    want = int(float(sys.argv[3]) * (1 << 30)) // CHUNK
    try:
        while len(tensors) < want:
            tensors.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as e:
        out["error"] = "OutOfMemoryError: " + str(e)[:200]
    out["tensors"] = len(tensors)
    out["bytes"] = len(tensors) * CHUNK
    out["reserved"] = torch.cuda.memory_reserved()
    report()
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(work, name + ".go")) and time.time() < deadline:
        time.sleep(0.05)
else:
    count = int(sys.argv[3])
    for i in range(count):
        tensors.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
        out["tensors"] = len(tensors)
        out["bytes"] = len(tensors) * CHUNK
        report()
    torch.cuda.synchronize()
    out["survived"] = True
    report()
