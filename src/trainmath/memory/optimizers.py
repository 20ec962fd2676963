"""Optimizer state and step temporaries, tensor by tensor, as the real implementations allocate them.

State is computed per parameter tensor from its shape (on the rank, after sharding), because two optimizers
depend on more than the element count: Adafactor factors ≥ 2-D tensors into row and column statistics, and
bitsandbytes keeps one fp32 absmax per block and falls back to 32-bit state for small tensors.

Sources (read from the code, torch 2.13):
- ``torch.optim.SGD``: ``momentum_buffer`` (``grad.clone()`` on the first step) only when momentum ≠ 0.
- ``torch.optim.Adam``/``AdamW``: ``exp_avg`` and ``exp_avg_sq`` (``zeros_like`` the parameter), plus
  ``max_exp_avg_sq`` with ``amsgrad``, plus a scalar ``step`` tensor per parameter (``torch.tensor(0.0,
  dtype=_get_scalar_dtype())`` → fp32, 4 bytes). The step tensor lives on the **CPU** unless ``capturable`` or
  ``fused`` (then it is on the device, fp32).
- ``torch.optim.Adafactor`` (torch ≥ 2.5): ``step`` (fp32, CPU) and, for a tensor of ≥ 2 dims,
  ``row_var`` of shape (..., rows, 1) and ``col_var`` of shape (..., 1, cols) (``grad.new_zeros``); for a vector,
  ``variance`` of its size.
- bitsandbytes ``Adam8bit``/``AdamW8bit`` (``bitsandbytes/optim/optimizer.py``, ``Optimizer2State.init_state``,
  block-wise default): tensors with ≥ ``min_8bit_size`` = 4096 elements get ``state1``/``state2`` as uint8
  (1 byte each) plus ``absmax1``/``absmax2`` fp32 of ``ceil(n / 256)`` blocks each (bitsandbytes ≤ 0.41 used
  2048-element blocks: pass ``block_size=2048``); smaller tensors get fp32 ``state1``/``state2``. ``step`` is a
  Python int (0 bytes). The quantization maps ``qmap1``/``qmap2`` (256 fp32 each) are shared by all tensors.
  Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", §2.
- Lion (Chen et al. 2023, Alg. 1; ``lion-pytorch``'s ``Lion``): one ``exp_avg`` ``zeros_like`` the parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainmath.arith import ceil_div, numel
from trainmath.errors import TrainmathError
from trainmath.vocabulary import OPTIMIZER_IMPLS, OPTIMIZERS

IMPLS = OPTIMIZER_IMPLS
BNB_MIN_8BIT_SIZE = 4096
BNB_QMAP_BYTES = 2 * 256 * 4
"""The two shared quantization maps of an 8-bit Adam (``dynamic`` and ``udynamic``, 256 fp32 values each)."""


@dataclass(frozen=True, kw_only=True)
class StateTensor:
    """One optimizer state tensor of one parameter."""

    name: str
    numel: int
    elem_bytes: int
    on_device: bool = True
    """False for the CPU-resident ``step`` scalar of non-fused torch optimizers."""

    @property
    def nbytes(self) -> int:
        return self.numel * self.elem_bytes


def check_optimizer(name: str, impl: str = "foreach") -> None:
    if name not in OPTIMIZERS:
        raise TrainmathError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if impl not in IMPLS:
        raise TrainmathError(f"unknown optimizer implementation {impl!r}; choose one of {', '.join(IMPLS)}")
    if impl == "fused" and name not in ("adam", "adamw", "adam-amsgrad", "sgd", "sgd-momentum"):
        raise TrainmathError(f"torch has no fused {name}; use --optimizer-impl foreach")


def state_tensors(name: str, shape: tuple[int, ...], *, state_bytes: int, impl: str = "foreach",
                  block_size: int = 256) -> list[StateTensor]:
    """The state tensors ``name`` allocates for one parameter of ``shape`` whose full-precision states take
    ``state_bytes`` per element (the dtype of the tensor the optimizer updates)."""
    n = numel(shape)
    if name == "sgd":
        return []
    if name == "sgd-momentum":
        return [StateTensor(name="momentum_buffer", numel=n, elem_bytes=state_bytes)]
    if name in ("adam", "adamw", "adam-amsgrad"):
        out = [StateTensor(name="step", numel=1, elem_bytes=4, on_device=impl == "fused"),
               StateTensor(name="exp_avg", numel=n, elem_bytes=state_bytes),
               StateTensor(name="exp_avg_sq", numel=n, elem_bytes=state_bytes)]
        if name == "adam-amsgrad":
            out.append(StateTensor(name="max_exp_avg_sq", numel=n, elem_bytes=state_bytes))
        return out
    if name == "adafactor":
        step = StateTensor(name="step", numel=1, elem_bytes=4, on_device=False)
        if len(shape) >= 2:
            rows = numel(shape[:-1])  # (..., rows, 1)
            cols = numel(shape[:-2]) * shape[-1]  # (..., 1, cols)
            return [step, StateTensor(name="row_var", numel=rows, elem_bytes=state_bytes),
                    StateTensor(name="col_var", numel=cols, elem_bytes=state_bytes)]
        return [step, StateTensor(name="variance", numel=n, elem_bytes=state_bytes)]
    if name in ("adam8bit", "adamw8bit"):
        if n < BNB_MIN_8BIT_SIZE:
            return [StateTensor(name="state1", numel=n, elem_bytes=4),
                    StateTensor(name="state2", numel=n, elem_bytes=4)]
        blocks = ceil_div(n, block_size)
        return [StateTensor(name="state1", numel=n, elem_bytes=1), StateTensor(name="state2", numel=n, elem_bytes=1),
                StateTensor(name="absmax1", numel=blocks, elem_bytes=4),
                StateTensor(name="absmax2", numel=blocks, elem_bytes=4)]
    if name == "lion":
        return [StateTensor(name="exp_avg", numel=n, elem_bytes=state_bytes)]
    raise TrainmathError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def optimizer_state_bytes(name: str, shapes: Iterable[tuple[int, ...]], *, state_bytes: int,
                          impl: str = "foreach", device_only: bool = False, block_size: int = 256) -> int:
    """Bytes of all optimizer state for parameters of ``shapes`` (one entry per tensor). ``device_only`` leaves
    out CPU-resident step scalars (what the GPU holds); otherwise every state tensor is counted, as summing
    ``t.nbytes`` over ``optimizer.state`` does. 8-bit Adam adds its two shared quantization maps once."""
    check_optimizer(name, impl)
    total = 0
    any_8bit = False
    for shape in shapes:
        for st in state_tensors(name, shape, state_bytes=state_bytes, impl=impl, block_size=block_size):
            if st.on_device or not device_only:
                total += st.nbytes
            any_8bit |= st.elem_bytes == 1
    return total + (BNB_QMAP_BYTES if any_8bit else 0)


def step_temporary_bytes(name: str, shapes: Iterable[tuple[int, ...]], *, state_bytes: int,
                         impl: str = "foreach") -> int:
    """Peak bytes the optimizer step allocates beyond its state (estimated from the code; default
    hyper-parameters: no L2 weight decay for Adam, no nesterov, no dampening):

    - foreach Adam/AdamW (``_multi_tensor_adam``): ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`` holds one
      state-sized tensor per parameter of the whole group at once → Σ numel · state_bytes. Fused: 0.
      For-loop (``_single_tensor_adam``, ``foreach=False``): ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt)``
      holds the square root and the quotient of one parameter at once → 2 · max numel · state_bytes.
    - foreach Adafactor (``_multi_tensor_adafactor``): ``var_estimates`` (row_var @ col_var, or a clone of
      ``variance``) is one full-size tensor per parameter → Σ numel · state_bytes (row/col means are negligible).
    - Lion (``lion-pytorch``, a loop over tensors): ``exp_avg.clone().mul_(β1).add(grad, ...)`` holds two
      tensors of the largest parameter for a moment → 2 · max numel · state_bytes.
    - SGD (with or without momentum): in-place foreach ops → 0. bitsandbytes 8-bit: fused kernels → 0.
    """
    check_optimizer(name, impl)
    numels = [numel(s) for s in shapes]
    if name in ("adam", "adamw", "adam-amsgrad") and impl == "forloop":
        return 2 * max(numels, default=0) * state_bytes
    if name == "adafactor" and impl == "forloop":
        return max(numels, default=0) * state_bytes
    if name in ("adam", "adamw", "adam-amsgrad", "adafactor"):
        return 0 if impl == "fused" else sum(numels) * state_bytes
    if name == "lion":
        return 2 * max(numels, default=0) * state_bytes
    return 0
