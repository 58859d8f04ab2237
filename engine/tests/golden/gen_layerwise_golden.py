"""Golden data for standalone LAMB and LARS steps, from layerwise_torch.py (float32).

For each length n in SIZES: p0 and grads g[0..S) (an (S, n) tensor); for each rule (lamb, lars) and each
group kind (decay: weight decay and the trust ratio; nodecay: neither), after S steps: p and the state
(lamb: m, v; lars: the momentum buffer as m). Hyper-parameters are in the file's metadata."""
import argparse, torch
from safetensors.torch import save_file
from layerwise_torch import Lamb, Lars

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--seed", type=int, default=11)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--lamb-lr", type=float, default=1e-2)
ap.add_argument("--beta1", type=float, default=0.9)
ap.add_argument("--beta2", type=float, default=0.999)
ap.add_argument("--eps", type=float, default=1e-6)
ap.add_argument("--lars-lr", type=float, default=0.5)
ap.add_argument("--momentum", type=float, default=0.9)
ap.add_argument("--trust-coefficient", type=float, default=0.02)
ap.add_argument("--wd", type=float, default=0.05)
ap.add_argument("--sizes", default="1,7,17,1000,16385,20000")
a = ap.parse_args()
torch.manual_seed(a.seed)
out = {}
for n in [int(s) for s in a.sizes.split(",")]:
    p0 = torch.randn(n) * 0.5
    g = torch.randn(a.steps, n) * torch.logspace(-3, 1, a.steps).unsqueeze(1)
    out[f"n{n}.p0"], out[f"n{n}.grads"] = p0.clone(), g.clone()
    for kind, wd in [("decay", a.wd), ("nodecay", 0.0)]:
        for rule in ["lamb", "lars"]:
            p = torch.nn.Parameter(p0.clone())
            if rule == "lamb":
                opt = Lamb([p], lr=a.lamb_lr, betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=wd)
            else:
                opt = Lars([p], lr=a.lars_lr, momentum=a.momentum, weight_decay=wd, trust_coefficient=a.trust_coefficient)
            for s in range(a.steps):
                p.grad = g[s].clone()
                opt.step()
            st, key = opt.state[p], f"n{n}.{rule}.{kind}"
            out[f"{key}.p"] = p.detach().clone()
            if rule == "lamb":
                out[f"{key}.m"], out[f"{key}.v"] = st["exp_avg"].clone(), st["exp_avg_sq"].clone()
            else:
                out[f"{key}.m"] = st["momentum_buffer"].clone()
meta = {k: str(v) for k, v in vars(a).items() if k != "out"}
meta.update({"format": "layerwise-golden-v1", "torch": torch.__version__})
save_file(out, a.out, metadata=meta)
print("wrote", a.out, len(out), "tensors")
