"""LAMB and LARS as torch.optim optimizers, written for zerostream's goldens (no library ships both with
these exact conventions). The formulas, with their sources, are in offload/src/layerwise.rs; in short:

LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76 Minutes",
Algorithm 2, bias-corrected, phi = identity):
    m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g^2
    u = (m / (1 - beta1^t)) / (sqrt(v) / sqrt(1 - beta2^t) + eps) + wd p
    p = p - lr * (|p| / |u|) * u            (ratio 1 if either norm is 0)

LARS (You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks", Algorithm 1's local
learning rate; momentum as torch.optim.SGD, lr outside the buffer):
    trust = eta |p| / (|g| + wd |p|)         (1 if |p| or |g| is 0)
    buf = momentum buf + (g + wd p) trust;  p = p - lr buf

A parameter group with weight_decay 0 (biases, norms' gains) is also excluded from the adaptation:
trust ratio 1, as in the authors' BERT code."""
import math
import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            wd, adapt = group["weight_decay"], group["weight_decay"] != 0
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t, m, v, g = st["step"], st["exp_avg"], st["exp_avg_sq"], p.grad
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                u = (m / (1 - beta1 ** t)) / (v.sqrt() / math.sqrt(1 - beta2 ** t) + group["eps"]) + wd * p
                trust = 1.0
                if adapt:
                    pn, un = p.norm().item(), u.norm().item()
                    if pn > 0 and un > 0:
                        trust = pn / un
                p.add_(u, alpha=-group["lr"] * trust)


class Lars(torch.optim.Optimizer):
    def __init__(self, params, lr=0.1, momentum=0.9, weight_decay=0.0, trust_coefficient=0.001):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, trust_coefficient=trust_coefficient))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            wd = group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                d = g
                if wd != 0:
                    pn, gn = p.norm().item(), g.norm().item()
                    trust = group["trust_coefficient"] * pn / (gn + wd * pn) if pn > 0 and gn > 0 else 1.0
                    d = (g + wd * p) * trust
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = torch.zeros_like(p)
                buf = st["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(d)
                p.add_(buf, alpha=-group["lr"])
