"""One "container" of tests/gpu/unseen.sh: device memory that no allocation call shows.

honest:  PyTorch under the shim trains a small CNN with growing batches until the shim says
         OutOfMemoryError, then keeps training at the last batch that fitted (new kernels load
         lazily) until $FGPU_WORK/<name>.go exists or 60 s pass; reports its steps.
lmem:    the driver API through ctypes, no shim: a PTX kernel with 64 KiB of local memory per
         thread, launched over the whole GPU; the driver grows the context's local memory to
         64 KiB x the threads that can be resident (about 17 GiB on an H200) inside the launch.
arrays:  the driver API through ctypes, no shim: CUDA arrays of 1 GiB (cuArrayCreate_v2, which
         fgpu's probes do not see) up to a count, one every 0.2 s, then hold.
Each step is reported in $FGPU_WORK/<name>.json as it happens (a killed process's last word).
"""
import ctypes
import json
import os
import sys
import time

mode, name = sys.argv[1], sys.argv[2]
work = os.environ["FGPU_WORK"]
out = {"name": name, "mode": mode}


def report():
    tmp = os.path.join(work, name + ".json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.rename(tmp, os.path.join(work, name + ".json"))


def go():
    return os.path.exists(os.path.join(work, name + ".go"))


def hold():
    """Holds what was taken until told to go (or 30 s), then says it survived."""
    deadline = time.time() + 30
    while not go() and time.time() < deadline:
        time.sleep(0.05)
    out["survived"] = True
    report()


def driver():
    cu = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    dev = ctypes.c_int()
    for call, args in (
        ("cuInit", (0,)),
        ("cuDeviceGet", (ctypes.byref(dev), 0)),
        ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), 0)),
    ):
        rc = getattr(cu, call)(*args)
        if rc != 0:
            raise SystemExit(f"{call}: CUresult {rc}")
    if cu.cuCtxSetCurrent(ctx) != 0:
        raise SystemExit("cuCtxSetCurrent failed")
    return cu


LMEM_PTX = rb"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry lmem(.param .u64 out, .param .u32 n)
{
    .local .align 4 .b8 buf[65536];
    .reg .b32 %r<5>;
    .reg .b64 %rd<6>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    mov.u64 %rd2, buf;
    mov.u32 %r2, 0;
LOOP:
    mul.wide.u32 %rd3, %r2, 4;
    add.u64 %rd4, %rd2, %rd3;
    st.local.u32 [%rd4], %r2;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 bra LOOP;
    ld.local.u32 %r3, [%rd2+4];
    cvta.to.global.u64 %rd5, %rd1;
    st.global.u32 [%rd5], %r3;
    ret;
}
"""


def lmem():
    cu = driver()
    mod, fn, dout = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
    rc = cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(LMEM_PTX + b"\0"))
    if rc != 0:
        raise SystemExit(f"cuModuleLoadData: CUresult {rc}")
    cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"lmem")
    cu.cuMemAlloc_v2(ctypes.byref(dout), ctypes.c_size_t(4))
    n = ctypes.c_uint32(16384)  # 64 KiB of the local array, every word written
    params = (ctypes.c_void_p * 2)(
        ctypes.cast(ctypes.byref(dout), ctypes.c_void_p), ctypes.cast(ctypes.byref(n), ctypes.c_void_p)
    )
    free0, total = ctypes.c_size_t(), ctypes.c_size_t()
    cu.cuMemGetInfo_v2(ctypes.byref(free0), ctypes.byref(total))
    out["free_before"] = free0.value
    report()
    rc = cu.cuLaunchKernel(fn, 132 * 16, 1, 1, 128, 1, 1, 0, None, params, None)
    out["launch_rc"] = rc
    out["sync_rc"] = cu.cuCtxSynchronize()
    free1 = ctypes.c_size_t()
    cu.cuMemGetInfo_v2(ctypes.byref(free1), ctypes.byref(total))
    out["grown_bytes"] = free0.value - free1.value
    out["held_at"] = time.time()
    report()
    hold()


class ArrayDesc(ctypes.Structure):
    _fields_ = [
        ("Width", ctypes.c_size_t),
        ("Height", ctypes.c_size_t),
        ("Format", ctypes.c_uint),
        ("NumChannels", ctypes.c_uint),
    ]


def arrays(count):
    cu = driver()
    held = []
    for _ in range(count):
        desc = ArrayDesc(16384, 16384, 0x20, 1)  # float, 16384 x 16384 x 4 B = 1 GiB
        h = ctypes.c_void_p()
        rc = cu.cuArrayCreate_v2(ctypes.byref(h), ctypes.byref(desc))
        if rc != 0:
            out["error"] = f"cuArrayCreate_v2: CUresult {rc}"
            break
        held.append(h)
        out["arrays"] = len(held)
        report()
        time.sleep(0.2)
    out["held_at"] = time.time()
    report()
    hold()


def honest():
    import torch

    torch.backends.cudnn.benchmark = True
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(128, 10),
    ).cuda()
    opt = torch.optim.AdamW(model.parameters())
    batch, fitted, steps = 64, None, 0

    def step(b):
        x = torch.randn(b, 3, 128, 128, device="cuda")
        y = torch.randint(0, 10, (b,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()

    while fitted is None:
        try:
            step(batch)
            steps += 1
            batch *= 2
        except torch.OutOfMemoryError:
            fitted = batch // 2
            torch.cuda.empty_cache()
    out["batch"] = fitted
    out["reserved_at_oom"] = torch.cuda.memory_reserved()
    report()
    deadline = time.time() + 60
    while not go() and time.time() < deadline:
        try:
            step(fitted)
            steps += 1
        except torch.OutOfMemoryError:
            out["ooms_after"] = out.get("ooms_after", 0) + 1
            torch.cuda.empty_cache()
        out["steps"] = steps
        if steps % 20 == 0:
            report()
    out["survived"] = True
    report()


if mode == "honest":
    honest()
elif mode == "lmem":
    lmem()
else:
    arrays(int(sys.argv[3]))
