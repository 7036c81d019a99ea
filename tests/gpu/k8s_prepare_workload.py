"""One "pod" container of tests/gpu/k8s_prepare.sh: what PyTorch sees (mem_get_info) and how
many 512 MiB blocks it gets before the limit refuses one. Prints one JSON line."""
import json
import sys

import torch

name = sys.argv[1]
free, total = torch.cuda.mem_get_info()
blocks = []
err = ""
try:
    for _ in range(400):
        blocks.append(torch.empty(512 << 20, dtype=torch.uint8, device="cuda"))
except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
    err = str(e).splitlines()[0][:160]
print(json.dumps({"pod": name, "total": total, "free": free, "blocks_512mib": len(blocks),
                  "allocated": len(blocks) * (512 << 20), "error": err}), flush=True)
