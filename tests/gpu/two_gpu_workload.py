#!/usr/bin/env python3
"""One "container" of tests/gpu/two_gpu.sh (issue 17): PyTorch on a 2-GPU node.

    two_gpu_workload.py MODE NAME [ARGS]     (results in $FGPU_WORK/NAME.json)

  pergpu NAME            per visible device: mem_get_info, nvidia-smi's memory.total (the
                         shim answers NVML for the container), then 1 GiB tensors until
                         torch.OutOfMemoryError (at most 40 a device); holds until NAME.go
  visible NAME           the visible devices (count, device 0's UUID and total), 512 MiB on
                         device 0; holds until NAME.go (the caller sets CUDA_VISIBLE_DEVICES)
  loop NAME SECS         8192^2 bf16 matmuls on device 0 for SECS s: iterations/s
  ddp NAME STEPS         a 2-rank DistributedDataParallel training job (NCCL, one process a
                         GPU) for STEPS steps: steps/s, and an all-reduce checked for its sum
  bypass NAME GPU COUNT  (run without the shim) 1 GiB tensors on device GPU, COUNT of them,
                         0.2 s apart: the agent's per-GPU reconcile should kill it first

Keep NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 in the
environment (two_gpu.sh exports them): NVLink multicast is off on these machines.
"""

import json
import os
import subprocess
import sys
import time

WORK = os.environ.get("FGPU_WORK", "/tmp")


def write(name, out):
    tmp = os.path.join(WORK, name + ".json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.rename(tmp, os.path.join(WORK, name + ".json"))


def hold(name, seconds=180):
    deadline = time.time() + seconds
    while not os.path.exists(os.path.join(WORK, name + ".go")) and time.time() < deadline:
        time.sleep(0.05)


def smi_totals():
    r = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.strip().splitlines() or [r.stderr.strip()[-200:]]


def pergpu(name):
    import torch

    out = {"name": name, "devices": []}
    for d in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(d)
        out["devices"].append({"index": d, "uuid": str(torch.cuda.get_device_properties(d).uuid),
                               "mem_get_info_total": total, "mem_get_info_free": free})
    out["nvidia_smi"] = smi_totals()
    keep = []
    for dev in out["devices"]:
        n, err = 0, None
        try:
            while n < 40:
                keep.append(torch.empty(1 << 30, dtype=torch.uint8, device=f"cuda:{dev['index']}"))
                n += 1
        except torch.OutOfMemoryError as e:
            err = "OutOfMemoryError: " + str(e)[:120]
        dev["tensors"], dev["error"] = n, err
        dev["reserved"] = torch.cuda.memory_reserved(dev["index"])
    write(name, out)
    hold(name)


def visible(name):
    import torch

    free, total = torch.cuda.mem_get_info(0)
    x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    write(name, {"name": name, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                 "count": torch.cuda.device_count(),
                 "uuid0": str(torch.cuda.get_device_properties(0).uuid),
                 "mem_get_info_total": total, "mem_get_info_free": free, "held": x.numel(),
                 "nvidia_smi": smi_totals()})
    hold(name)


def loop(name, secs):
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    c = torch.empty_like(a)
    for _ in range(5):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    n, t0, progress = 0, time.time(), []
    events = []
    while time.time() - t0 < secs:
        torch.matmul(a, b, out=c)
        e = torch.cuda.Event()
        e.record()
        events.append(e)
        if len(events) > 8:
            events.pop(0).synchronize()
        n += 1
        if not progress or time.time() - progress[-1][0] >= 0.1:
            progress.append([round(time.time(), 3), n])
    torch.cuda.synchronize()
    el = time.time() - t0
    write(name, {"name": name, "iterations": n, "seconds": el, "per_s": n / el,
                 "progress": progress})


def ddp_rank(rank, world, steps, init, result):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    ones = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(ones)
    ok = bool((ones == world).all().item())
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(6)]).cuda()
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 4096, device="cuda")
    for _ in range(5):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.time()
    progress = []
    for i in range(steps):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if i % 10 == 0:
            loss.item()
            progress.append([round(time.time(), 3), i])
    torch.cuda.synchronize()
    el = time.time() - t0
    dist.barrier()
    result.put({"rank": rank, "steps": steps, "seconds": el, "per_s": steps / el,
                "allreduce_ok": ok, "progress": progress})
    dist.destroy_process_group()


def ddp(name, steps):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    init = "file://" + os.path.join(WORK, name + ".rendezvous")
    try:
        os.unlink(init[len("file://"):])
    except OSError:
        pass
    procs = [ctx.Process(target=ddp_rank, args=(r, 2, steps, init, result)) for r in range(2)]
    t0 = time.time()
    for p in procs:
        p.start()
    ranks = []
    for _ in procs:
        ranks.append(result.get(timeout=300))
    for p in procs:
        p.join(timeout=30)
    write(name, {"name": name, "ranks": sorted(ranks, key=lambda r: r["rank"]),
                 "exit_codes": [p.exitcode for p in procs], "wall_s": time.time() - t0})


def bypass(name, gpu, count):
    import torch

    out = {"name": name, "gpu": gpu, "tensors": 0}
    keep = []
    for _ in range(count):
        keep.append(torch.empty(1 << 30, dtype=torch.uint8, device=f"cuda:{gpu}"))
        torch.cuda.synchronize()
        out["tensors"] = len(keep)
        write(name, out)
        time.sleep(0.2)
    out["survived"] = True
    write(name, out)


def main():
    mode, name = sys.argv[1], sys.argv[2]
    if mode == "pergpu":
        pergpu(name)
    elif mode == "visible":
        visible(name)
    elif mode == "loop":
        loop(name, float(sys.argv[3]))
    elif mode == "ddp":
        ddp(name, int(sys.argv[3]))
    elif mode == "bypass":
        bypass(name, int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
