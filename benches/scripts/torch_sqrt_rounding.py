"""Shows that PyTorch's vectorised float32 sqrt is not correctly rounded on this CPU (the reason some
AdamW parameters differ from torch.optim.AdamW by an ulp of the step; see offload/tests/adamw.rs).
Prints, per length, how many elements of torch.sqrt differ from the correctly rounded result."""
import numpy as np
import torch

torch.manual_seed(0)
for n in [7, 64, 1000, 100000]:
    v = torch.rand(n) * 1e-4
    got = v.sqrt().numpy()
    exact = np.sqrt(v.numpy().astype(np.float64)).astype(np.float32)
    ulps = np.abs(got.view(np.int32) - exact.view(np.int32))
    print(f"n={n}: {int((ulps != 0).sum())} of {n} not correctly rounded (max {int(ulps.max())} ulp)")
