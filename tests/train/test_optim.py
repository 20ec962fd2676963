"""Our SGD, momentum, Adam and AdamW against torch.optim: bitwise (the same operations in the same order, on the
single-tensor path torch uses on CPU), over several steps, with and without weight decay; and the same optimizer
on one flat tensor equals it per parameter (what our ZeRO relies on: every rule is elementwise)."""

import pytest
import torch

from trainmath.runtime.train.optim import SGD, Adam, init_state, make_optimizer

SHAPES = [(7, 5), (5,), (3, 2, 4)]


def _params(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in SHAPES]


def _run(opt_factory, steps: int = 5) -> list[torch.Tensor]:
    params = _params(0)
    opt = opt_factory(params)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_ours_bitwise_equal_torch(name):
    ours = _run(lambda ps: make_optimizer(ps, name, "trainmath", 1e-2))
    theirs = _run(lambda ps: make_optimizer(ps, name, "torch", 1e-2))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert not torch.equal(ours[0], _params(0)[0].detach())  # it moved


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adam_l2_and_sgd_weight_decay_bitwise(wd):
    pairs = [(lambda ps: Adam(ps, lr=1e-2, weight_decay=wd), lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=wd,
                                                                                         foreach=False)),
             (lambda ps: Adam(ps, lr=1e-2, weight_decay=wd, decoupled=True),
              lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=wd, foreach=False)),
             (lambda ps: SGD(ps, lr=1e-2, momentum=0.9, weight_decay=wd),
              lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=wd, foreach=False))]
    for ours, theirs in pairs:
        assert all(torch.equal(a, b) for a, b in zip(_run(ours), _run(theirs)))


def test_adam_first_step_by_hand():
    """One AdamW step from the formulas: m = (1−β₁)g, v = (1−β₂)g², m̂ = g, v̂ = g²,
    θ ← θ(1−ηλ) − η·g/(|g| + ε)."""
    p = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)
    p.grad = torch.tensor([0.5, -4.0], dtype=torch.float64)
    Adam([p], lr=0.1, weight_decay=0.01, decoupled=True).step()
    expected = torch.tensor([1.0, -2.0], dtype=torch.float64) * (1 - 0.1 * 0.01) - 0.1 * torch.tensor(
        [0.5, -4.0], dtype=torch.float64) / (torch.tensor([0.5, 4.0], dtype=torch.float64) + 1e-8)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["momentum", "adam", "adamw"])
@pytest.mark.parametrize("impl", ["torch", "trainmath"])
def test_flat_equals_per_parameter(name, impl):
    per = _run(lambda ps: make_optimizer(ps, name, impl, 1e-2))
    params = _params(0)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    opt = make_optimizer([flat], name, impl, 1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        flat.grad = torch.cat([torch.randn(p.shape, generator=g).reshape(-1) for p in params])
        opt.step()
    assert torch.equal(flat, torch.cat([p.reshape(-1) for p in per]))


@pytest.mark.parametrize("name", ["momentum", "adam"])
def test_pre_created_state_changes_nothing(name):
    """``init_state`` (so a checkpoint can be loaded before any step) gives the same steps as torch's lazy init."""
    def eager(ps):
        opt = make_optimizer(ps, name, "torch", 1e-2)
        init_state(opt, name)
        return opt
    assert all(torch.equal(a, b) for a, b in zip(_run(eager), _run(lambda ps: make_optimizer(ps, name, "torch", 1e-2))))
