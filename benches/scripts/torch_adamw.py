"""PyTorch's CPU AdamW on one shard, for the side-by-side in benches/results (not run by CI).

Two jobs, timed best-of-reps over N parameters with T threads:
  fp32:  torch.optim.AdamW(fused=True).step() with fp32 gradients;
  mixed: the mixed-precision job zerostream does in one pass — upcast a bf16 gradient into a
         preallocated fp32 .grad, the fused step, downcast the parameter to a bf16 copy.
Prints one JSON object. Usage: python torch_adamw.py [N] [T] [REPS]
"""
import json
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
torch.set_num_threads(threads)

p = torch.nn.Parameter(torch.randn(n) * 0.02)
p.grad = torch.randn(n) * 1e-3
grad_bf16 = (torch.randn(n) * 1e-3).to(torch.bfloat16)
copy_bf16 = torch.empty(n, dtype=torch.bfloat16)
opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)


def best(job):
    job()  # warm-up: allocates the moments
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        job()
        times.append(time.perf_counter() - t)
    return min(times)


fp32 = best(lambda: opt.step())


def mixed():
    p.grad.copy_(grad_bf16)
    opt.step()
    copy_bf16.copy_(p.detach())


mixed_s = best(mixed)
print(json.dumps({
    "torch": torch.__version__, "params": n, "threads": threads,
    "fp32_fused_gparams_per_s": n / fp32 / 1e9,
    "mixed_bf16_gparams_per_s": n / mixed_s / 1e9,
}))
