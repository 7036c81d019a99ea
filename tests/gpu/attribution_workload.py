"""One "container" of the H200 attribution check (tests/gpu/attribution.sh).

Allocates 8 x 256 MiB tensors and runs a matmul under the allocator named by
PYTORCH_CUDA_ALLOC_CONF, writes what PyTorch says it got from the driver to
$FGPU_WORK/<name>.json, then holds the memory until $FGPU_WORK/<name>.go appears.
"""
import json
import os
import sys
import time

import torch

name = sys.argv[1]
work = os.environ["FGPU_WORK"]
t0 = time.time()
x = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
a = torch.randn(2048, 2048, device="cuda")
b = a @ a
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
free, total = torch.cuda.mem_get_info()
report = {
    "name": name,
    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    "pid_in_namespace": os.getpid(),
    "torch_reserved_bytes": torch.cuda.memory_reserved(),
    "torch_allocated_bytes": torch.cuda.memory_allocated(),
    "segments": stats.get("segment.all.current", None),
    "mem_get_info_used_bytes": total - free,
    "seconds": round(time.time() - t0, 3),
}
with open(os.path.join(work, name + ".json.tmp"), "w") as f:
    json.dump(report, f)
os.rename(os.path.join(work, name + ".json.tmp"), os.path.join(work, name + ".json"))
deadline = time.time() + 120
while not os.path.exists(os.path.join(work, name + ".go")) and time.time() < deadline:
    time.sleep(0.05)
del x, a, b
