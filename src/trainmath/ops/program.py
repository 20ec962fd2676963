"""One program per layer: the only place that builds a ``Ctx`` from a spec and calls a family's emitters.

Every quantity that folds over op lists (FLOPs, the inference cache, saved bytes, selective recompute, per-rank
bytes under TP/SP/CP/EP, FSDP2's backward buffers) asks ``layer_program`` (or ``head_program``) for them, so the
run's switches are resolved once, the same way for all: the family's emitter and row from ``spec.family``, the
router and family switches from the spec's config (``ModelSpec.options``) under the family's config-class
defaults, the attention kernel from the job or the family's default kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.model.spec import LayerSpec, ModelSpec
from trainmath.ops.context import Ctx, Family, Router
from trainmath.ops.ir import SINGLE, Degrees, Program
from trainmath.ops.model import head_ops
from trainmath.vocabulary import RECIPES, Precision

BF16_MODEL = RECIPES["bf16"]
"""A bf16 model: what the shape folds emit for (dtypes change no FLOPs; the cache's are a serving format)."""


@dataclass(frozen=True, kw_only=True)
class EmitJob:
    """The run an op list is emitted for, as the folds state it (``context`` resolves the rest from the spec)."""

    batch: int
    """Micro-batch (sequences)."""
    seq: int
    """Tokens per sequence."""
    precision: Precision = BF16_MODEL
    attention: str = "sdpa"
    """``eager`` forces ``attn_implementation="eager"``; ``sdpa`` runs the family's default kernel
    (``Style.attention``: Gemma-2 and gpt-oss are eager)."""
    experts: str = "eager"
    """The routed experts' path: ``eager`` (transformers' loop) or ``grouped`` (``grouped_mm``)."""
    experts_hit: int | None = None
    router: Router | None = None
    """The router switches (None: from the spec's config)."""
    family: Family | None = None
    """The family switches (None: from the spec's config)."""
    degrees: Degrees = SINGLE
    device: str = "cuda"
    gdn_chunk: int = 64
    mamba_chunk: int | None = None
    shapes_only: bool = False
    """For the folds that read only shapes: the family whose code runs (``FamilyDef.runs_as``), every op emitted
    even where its saved bytes are not modelled (``Ctx.shapes_only``)."""


def _family(spec: ModelSpec, job: EmitJob):
    return spec.family.shape_family if job.shapes_only else spec.family


def context(spec: ModelSpec, job: EmitJob) -> Ctx:
    """The ``Ctx`` of ``job`` on ``spec``."""
    defaults = spec.family.config_defaults
    row = _family(spec, job).row
    return Ctx(b=job.batch, s=job.seq, d=spec.hidden_size, p=job.precision,
               eager=job.attention == "eager" or row.attention == "eager", experts=job.experts,
               experts_hit=job.experts_hit, router=job.router or Router.from_config(spec.options, defaults),
               family=job.family or Family.from_config(spec.options, defaults), degrees=job.degrees,
               device=job.device, gdn_chunk=job.gdn_chunk, mamba_chunk=job.mamba_chunk, shapes_only=job.shapes_only)


def layer_program(spec: ModelSpec, job: EmitJob, layer: LayerSpec, ctx: Ctx | None = None) -> Program:
    """The op list of one decoder layer of ``spec`` under ``job`` (``ctx``: ``context(spec, job)``, when the caller
    folds several layers of one job)."""
    emit, style = spec.family.shape_emitter() if job.shapes_only else (spec.family.layer, spec.family.row)
    prog = Program()
    emit(prog, ctx or context(spec, job), layer, style)
    return prog


def head_program(spec: ModelSpec, job: EmitJob, ctx: Ctx | None = None):
    """The final norm, LM head and loss of ``spec`` under ``job``: (program, tensors alive but not saved)."""
    return head_ops(ctx or context(spec, job), spec, _family(spec, job).row)
