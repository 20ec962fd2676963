"""The op list of one decoder layer for the folds that read only shapes: the FLOPs (``ops.flops``) and the
inference cache (``ops.cache``, ``infer.kv``), through ``ops.program`` with ``shapes_only``."""

from __future__ import annotations

from trainmath.model.spec import LayerSpec, ModelSpec
from trainmath.ops.ir import Op
from trainmath.ops.program import EmitJob, head_program, layer_program


def head_ops(spec: ModelSpec, *, batch: int, seq: int) -> list[Op]:
    """The final norm, LM head and loss of ``spec`` (``ops.model.head_ops``) for the shape folds."""
    return head_program(spec, EmitJob(batch=batch, seq=seq, shapes_only=True))[0].ops


def layer_ops(spec: ModelSpec, layer: LayerSpec, *, batch: int, seq: int, experts: str = "eager",
              gdn_chunk: int = 64, mamba_chunk: int | None = None) -> list[Op]:
    """The op list of one decoder layer of ``spec`` for the folds that read shapes (FLOPs, the inference cache):
    a bf16 model (dtypes change no FLOPs; the cache's are a serving format), the kernel transformers picks, the
    family switches of the spec's config (``spec.options``), every op emitted even where the config's saved bytes
    are not modelled (``Ctx.shapes_only``)."""
    job = EmitJob(batch=batch, seq=seq, experts=experts, gdn_chunk=gdn_chunk, mamba_chunk=mamba_chunk,
                  shapes_only=True)
    return layer_program(spec, job, layer).ops


def layer_top_k(layer: LayerSpec) -> int | None:
    """The routed experts per token of a layer's MoE block (None without one)."""
    return next((b.dims.top_k for b in layer.blocks if getattr(b.dims, "top_k", 0)), None)
