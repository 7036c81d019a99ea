"""A small PyTorch training loop; prints the mean step time in ms (after warm-up).

Used to measure what the agent (or the shim) costs a real workload: run it with and
without, same GPU, same everything else.
"""
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 1024),
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(256, 4096, device="cuda")
y = torch.randn(256, 1024, device="cuda")


def step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()


for _ in range(30):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
print(f"{(time.perf_counter() - t0) * 1000 / steps:.4f}")
