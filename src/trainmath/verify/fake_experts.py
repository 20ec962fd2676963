"""Routed experts on fake tensors: what ``memory.simulate`` adds to ``FakeTensorMode`` so that transformers' own
expert code runs, and what it assumes.

**The eager loop asks the routing for values.** transformers 5.24's eager experts (the original forward of every
``@use_experts_implementation`` class, e.g. ``Qwen3MoeExperts.forward``) do ``expert_hit = (one_hot(top_k_index)
.sum(...) > 0).nonzero()``, loop over it in Python, branch on ``expert_idx == num_experts`` and take each expert's
rows with ``torch.where(expert_mask[expert_idx])``. A fake tensor has no values, so FakeTensorMode stops at the
first ``nonzero`` (``DynamicOutputShapeException``). A ``ShapeEnv`` with unbacked symints gets one line further:
``nonzero`` returns (u0, 1), and the Python loop over it stops (``GuardOnDataDependentSymNode: Could not guard on
data-dependent expression Eq(u0, 0)``, tried on transformers 5.24 / torch 2.13); the branch needs the hit experts'
ids, which no symbolic size answers, and MemTracker needs sizes in bytes. So the simulation **states a routing**
(``routing_standin``): token t's slot j goes to expert (t·k + j) mod n — a token's k experts are distinct, every
expert is hit once T·k ≥ n, and each receives T·k/n rows (±1). Σ n_e = T·k as for any routing, which is the
calculator's own assumption (``ops.kernels.experts``: one T·k-row tensor stands for the per-expert ones; with
``experts_hit`` unset, every expert is hit). The indices handed to the experts module are a fake tensor carrying
these values as its constant (``FakeTensor.constant``): FakeTensorMode evaluates an op whose fake inputs are all
constants on the real values (its constant propagation), so ``one_hot``, ``nonzero``, ``where``, the loop and its
branch run on real integers, while every gathered row, matmul, activation, routing product and ``index_add_`` runs
on fake tensors through transformers' code, and MemTracker counts all of them (the routing masks too, as a real step
allocates them). FakeTensorMode keeps an output constant only up to ``CONSTANT_NUMEL_LIMIT`` (1) elements, and a
factory op (``one_hot``'s ``arange``) never; inside an experts forward, integer and bool outputs stay constant at
any size and integer factories are constants (the masks and indices), floating ones never. The router still runs and
allocates its own top-k indices as in a real step; the stand-in is made outside dispatch, so MemTracker does not
count it twice. Under a real routing the rows per expert differ (not the sum), which moves the transients of one
expert's ops in flight, and an expert it misses saves no autocast weight copy (``experts_hit``). Time: the loop runs
some 20 ops per expert and MemTracker's per-op peak update walks every live tensor, so an eager case costs minutes
where the grouped one costs seconds (Qwen3-Next, 512 experts × 2 MoE layers, b·s = 512: 504 s on two shared cores).

**grouped_mm in fp32 (amp-bf16).** ``_grouped_mm`` is not autocast-listed (no AutocastCUDA or AutocastCPU kernel:
``torch._C._dispatch_has_kernel_for_dispatch_key``), and transformers' ``integrations.moe._grouped_mm`` casts the
input to the weight's dtype, so with fp32 weights under autocast it runs in fp32. CUDA and CPU accept that:
``_grouped_mm_validate_inputs`` (aten/src/ATen/native/GroupedMMUtils.h) takes fp32, bf16 or fp16 and the output
in ``mat_a``'s dtype (``_grouped_mm_cuda``, GroupedBlas.cpp: the CUTLASS kernel for bf16 on sm90/sm100,
anything else ``_grouped_mm_fallback``'s per-group ``mm_out`` into the same output tensor; not checked on a GPU
here). Only the meta kernel (``torch/_meta_registrations.py``,
``_meta_grouped_mm_common``) demands bf16. ``grouped_mm_rule`` gives FakeTensorMode the real kernels' rule for
non-bf16 inputs: the output of ``create_grouped_gemm_output_tensor`` (the last dimension's stride padded to 16
bytes), in ``mat_a``'s dtype; bf16 goes to the meta kernel as before.

torch is imported inside the functions: the calculator never needs it.
"""

from __future__ import annotations

import contextlib

ROUTING_ARGS = ("top_k_index", "router_indices")
"""The name of the routing indices in the experts' forward (gpt-oss: ``router_indices``); positionally second."""


def standin_text(k: int, n: int, tokens: int) -> str:
    """The routing the simulation assumed, in words (``Simulation.routing``)."""
    rows, extra = divmod(tokens * k, n)
    share = f"{rows} rows each" if not extra else f"{rows}-{rows + 1} rows each"
    hit = n if tokens * k >= n else tokens * k
    return (f"eager experts: stand-in routing, token t's slot j → expert (t·k + j) mod n (k = {k}, n = {n}, "
            f"T = {tokens}): {hit} of {n} experts hit, {share}; the sum T·k is any routing's")


def is_eager_experts(module) -> bool:
    """A transformers experts module (``@use_experts_implementation``) that runs its eager loop."""
    config = getattr(module, "config", None)
    return hasattr(module, "is_concatenated") and getattr(config, "_experts_implementation", None) == "eager"


@contextlib.contextmanager
def routing_standin(mode, model, texts: list):
    """For the duration: each eager experts module of ``model`` gets the stand-in routing (module docstring) in
    place of its routing indices, and ``mode`` keeps integer outputs constant inside it; appends the routing
    stated (``standin_text``) to ``texts``, once per distinct (k, n, T)."""
    import torch
    from torch._subclasses.fake_impls import _is_tensor_constructor, op_implementations_checks
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._mode_utils import no_dispatch

    inside = [0]
    plain = mode.may_turn_const

    def integer_constructor(func) -> bool:
        return inside[0] > 0 and _is_tensor_constructor(func)

    def constant_constructor(fake_mode, func, *args, **kwargs):
        """``arange`` inside ``one_hot`` and the like: a constant when integer (module docstring)."""
        dtype = kwargs.get("dtype")
        ints = func.overloadpacket is torch.ops.aten.arange and all(isinstance(a, int) for a in args)
        if (dtype is None and not ints) or (dtype is not None and (dtype.is_floating_point or dtype.is_complex)):
            return NotImplemented
        with no_dispatch():
            real = func(*args, **kwargs)
        return fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, real, make_constant=True)

    def may_turn_const(t) -> bool:
        if plain(t):
            return True
        return (inside[0] > 0 and not t.is_floating_point() and not t.is_complex() and t.layout == torch.strided
                and t.device.type != "meta" and not isinstance(t, FakeTensor))

    def pre(module, args, kwargs):
        inside[0] += 1
        name = next((a for a in ROUTING_ARGS if a in kwargs), None)
        idx = kwargs[name] if name else args[1]
        tokens, k = idx.shape
        n = module.num_experts
        with no_dispatch():
            real = (torch.arange(tokens * k) % n).view(tokens, k).to(idx.dtype)
        standin = mode.fake_tensor_converter.from_real_tensor(mode, real, make_constant=True)
        text = standin_text(k, n, tokens)
        if text not in texts:
            texts.append(text)
        if name:
            return args, {**kwargs, name: standin}
        return (args[0], standin, *args[2:]), kwargs

    def post(module, args, output):
        inside[0] -= 1

    hooks = []
    mode.may_turn_const = may_turn_const
    check = (integer_constructor, constant_constructor)
    op_implementations_checks.insert(0, check)
    try:
        for m in model.modules():
            if is_eager_experts(m):
                hooks.append(m.register_forward_pre_hook(pre, with_kwargs=True))
                hooks.append(m.register_forward_hook(post))
        yield
    finally:
        for h in hooks:
            h.remove()
        op_implementations_checks.remove(check)
        del mode.may_turn_const


def grouped_mm_output(mat_a, mat_b, offs, dtype):
    """``(sizes, strides)`` of ``create_grouped_gemm_output_tensor`` (GroupedMMUtils.h, non-ROCm): the last
    dimension's stride padded to 16 bytes."""
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if a2 and b2:
        size = [offs.size(0), mat_a.size(0), mat_b.size(1)]
    elif a2:
        size = [mat_a.size(0), mat_b.size(-1)]
    elif b2:
        size = [mat_a.size(1), mat_b.size(1)]
    else:
        size = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    align = 16 // dtype.itemsize
    padded = -(-size[-1] // align) * align
    stride = [padded, 1] if a2 != b2 else [size[1] * padded, padded, 1]
    return size, stride


@contextlib.contextmanager
def grouped_mm_rule():
    """For the duration, FakeTensorMode runs ``aten._grouped_mm`` of fp32 / fp16 inputs as CUDA and CPU do
    (module docstring); bf16 keeps the meta kernel."""
    import torch
    from torch._subclasses.fake_impls import op_implementations_dict
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager

    op = torch.ops.aten._grouped_mm.default
    allowed = (torch.float32, torch.bfloat16, torch.float16)

    def fake_grouped_mm(mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        if mat_a.dtype == mat_b.dtype == torch.bfloat16 and out_dtype in (None, torch.bfloat16):
            return NotImplemented  # the meta kernel's own case
        torch._check(mat_a.dtype in allowed and mat_b.dtype in allowed,
                     lambda: f"Expected mat_a and mat_b to be Float32, BFloat16 or Float16, got {mat_a.dtype}, "
                             f"{mat_b.dtype}")
        torch._check(mat_a.dtype == mat_b.dtype, lambda: f"mm of {mat_a.dtype} and {mat_b.dtype}")
        torch._check(out_dtype in (None, mat_a.dtype), lambda: "Grouped gemm output dtype must match `mat_a` dtype")
        torch._check(bias is None, lambda: "Bias not supported yet")
        size, stride = grouped_mm_output(mat_a, mat_b, offs, mat_a.dtype)
        with in_kernel_invocation_manager(mode):
            out = torch.empty_strided(size, stride, dtype=mat_a.dtype, device="meta")
        return FakeTensor(mode, out, mat_a.device)

    if op in op_implementations_dict:  # torch grew its own rule: keep it
        yield
        return
    op_implementations_dict[op] = fake_grouped_mm
    try:
        yield
    finally:
        op_implementations_dict.pop(op, None)
        FakeTensorMode.cache_clear()  # its dispatch cache (shared by every mode) would keep answering fp32 calls
