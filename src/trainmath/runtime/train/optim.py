"""SGD, momentum, Adam and AdamW written from their update rules, and the torch.optim equivalents.

Notation: θ parameters, g = ∇θ L the gradient, η the learning rate, λ weight decay, t the step (from 1).

- SGD:       θ ← θ − η·g
- momentum:  b ← μ·b + g (b₁ = g₁), θ ← θ − η·b                     (torch's form; Sutskever et al. 2013)
- Adam:      m ← β₁m + (1−β₁)g,  v ← β₂v + (1−β₂)g²,
             θ ← θ − η/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε)             (Kingma & Ba 2015, Alg. 1; ε after the
                                                                      bias correction of v, as torch does)
- AdamW:     θ ← θ(1 − ηλ) first, then the Adam update               (Loshchilov & Hutter 2019, Alg. 2)

Each line is the same sequence of floating-point operations as torch's single-tensor path (``lerp_`` for m,
``mul_().addcmul_()`` for v), so on CPU the results are bitwise equal to torch.optim (a test checks it). State
keys and dtypes are torch's (``step`` a 0-dim fp32 tensor, ``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``), so
checkpoints and ``ZeroRedundancyOptimizer`` treat both alike.
"""

from __future__ import annotations

import torch

HYPER = {
    "sgd": {"momentum": 0.0, "weight_decay": 0.0},
    "momentum": {"momentum": 0.9, "weight_decay": 0.0},
    "adam": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "adamw": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
}
"""Hyper-parameters of each ``--optimizer`` (torch's defaults; momentum μ = 0.9)."""


class SGD(torch.optim.Optimizer):
    """θ ← θ − η·g; with momentum μ: b ← μ·b + g (b₁ = g₁), θ ← θ − η·b."""

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad if wd == 0 else p.grad.add(p, alpha=wd)  # L2 term λθ in the gradient
                if mu != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = g.detach().clone()  # b₁ = g₁
                    else:
                        state["momentum_buffer"].mul_(mu).add_(g)  # b ← μ·b + g
                    g = state["momentum_buffer"]
                p.add_(g, alpha=-lr)  # θ ← θ − η·g


class Adam(torch.optim.Optimizer):
    """Adam (``decoupled=False``) and AdamW (``decoupled=True``); see the module docstring for the formulas."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 decoupled: bool = False):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "decoupled": decoupled})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    init_param_state(state, p, "adam")
                state["step"] += 1
                t = state["step"].item()
                g = p.grad
                if wd != 0 and group["decoupled"]:
                    p.mul_(1 - lr * wd)  # θ ← θ(1 − ηλ)   (AdamW)
                elif wd != 0:
                    g = g.add(p, alpha=wd)  # g ← g + λθ     (Adam's L2)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(g, 1 - b1)  # m ← β₁m + (1−β₁)g
                v.mul_(b2).addcmul_(g, g, value=1 - b2)  # v ← β₂v + (1−β₂)g²
                denom = (v.sqrt() / (1 - b2 ** t) ** 0.5).add_(eps)  # √v̂ + ε with v̂ = v/(1−β₂ᵗ)
                # θ ← θ − η·m̂/(√v̂ + ε) with m̂ = m/(1−β₁ᵗ)
                p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


def init_param_state(state: dict, p: torch.Tensor, optimizer: str) -> None:
    """Create ``p``'s state as torch does on its first step (zeros and ``step`` = 0), so a checkpoint can be loaded
    into it before any step has run. For momentum the zero buffer gives b₁ = μ·0 + g₁ = g₁ exactly."""
    if optimizer in ("adam", "adamw"):
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    elif optimizer == "momentum":
        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def init_state(opt: torch.optim.Optimizer, optimizer: str) -> None:
    for group in opt.param_groups:
        for p in group["params"]:
            if not opt.state[p]:
                init_param_state(opt.state[p], p, optimizer)


def optimizer_class(name: str, impl: str) -> tuple[type, dict]:
    """(class, keyword arguments) of ``--optimizer name --optimizer-impl impl``; ``lr`` is added by the caller.
    torch's are forced onto the single-tensor path (``foreach=False``), torch's CPU default, on every device."""
    h = dict(HYPER[name])
    if impl == "trainmath":
        if name in ("sgd", "momentum"):
            return SGD, h
        return Adam, {**h, "decoupled": name == "adamw"}
    if name in ("sgd", "momentum"):
        return torch.optim.SGD, {**h, "foreach": False}
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return cls, {**h, "foreach": False}


def make_optimizer(params, name: str, impl: str, lr: float) -> torch.optim.Optimizer:
    cls, kwargs = optimizer_class(name, impl)
    return cls(params, lr=lr, **kwargs)
