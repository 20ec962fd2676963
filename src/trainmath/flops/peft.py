"""Training FLOPs of a LoRA / QLoRA fine-tune, per GEMM, as ``FlopCounterMode`` counts them on a peft model.

With the base frozen, autograd computes only the gradients something needs (``grad_input_mask`` of ``mm``/``addmm``
/``bmm``), read from the requires-grad flow of each layer's op list (``ops.lora.grad_flow``):

- a frozen Linear's backward is its input's gradient only, 2·m·k·n (no weight-gradient GEMM), and nothing when its
  input needs no grad (layer 0 with a frozen embedding, before the first adapted Linear, unless
  ``enable_input_require_grads``);
- each adapted Linear adds lora_A (m × in × r) and lora_B (m × r × out) forward; lora_B's backward is its weight's
  and its input's gradients (2×), lora_A's its weight's and, when its input needs grad, its input's;
- the attention core's two products keep the gradient of each operand that needs one: Q·Kᵀ gives Q's and K's, P·V
  gives P's (when Q or K needs grad) and V's, as eager attention's ``bmm``s run them;
- the LM head's backward is its input's gradient; the embedding has no GEMM;
- ``target_parameters`` (routed experts, routers; peft's ``ParamWrapper``): the expert GEMMs read W + B·A, which
  requires grad, so their backward adds the weight's gradient (full training's wgrad GEMM, per routed token), and
  the wrapper adds one ``baddbmm`` per layer per forward, 2·E·a·b·r, with a backward twice that (``delta_gemm``);
- ``recompute="full"`` runs every layer's forward again, adapters included (Megatron's convention, the whole
  layer);
- QLoRA: ``bnb.matmul_4bit`` dequantises each 4-bit weight to bf16 before every product that uses it (forward, the
  input's gradient, the recompute). That is not a GEMM, so not a FLOP here: it is reported as
  ``dequant_elements`` (weights' elements dequantised per step) for the time model.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.adapters import PeftJob, select
from trainmath.errors import TrainmathError
from trainmath.flops.model import COMPONENT_ORDER, FlopsReport, count_flops
from trainmath.ops import flops as op_flops
from trainmath.ops.emit import head_ops, layer_ops, layer_top_k
from trainmath.ops.gemm import Gemm
from trainmath.ops.lora import LoraRun, grad_flow, module_of
from trainmath.tree import Node

LORA = "lora_adapters"


@dataclass(frozen=True, kw_only=True)
class PeftFlops:
    report: FlopsReport
    """Forward, backward, recompute trees with the adapters as their own component."""
    dequant_elements: int
    """QLoRA: weight elements dequantised per step (0 for LoRA)."""
    trainable_params: int


@dataclass(frozen=True, kw_only=True)
class Row:
    """One GEMM of a layer's forward with its forward and backward FLOPs under peft, and the 4-bit weight it
    reads (QLoRA dequantises ``dequant_numel`` elements before each use: forward, and the input's gradient when
    ``backward_flops`` is not 0)."""

    gemm: Gemm
    forward_flops: int
    backward_flops: int
    dequant_numel: int = 0
    """Elements of the frozen weight dequantised per use (0: not a quantisable Linear, or an adapter)."""
    wgrad_flops: int = 0
    """Of ``backward_flops``, the weight-gradient GEMM of a weight peft's ``ParamWrapper`` adapts (else 0)."""


@dataclass(frozen=True, kw_only=True)
class LayerRows:
    """The rows of one layer type in one position (layer 0 or later), and how many layers share them."""

    layer: object
    count: int
    rows: tuple[Row, ...]
    recompute_dequant: int
    """Elements dequantised again by a full recompute of one layer (its quantised Linears)."""


def _layer(spec, layer, index: int, job: PeftJob, targets, *, batch: int, seq: int, causal: str,
           input_grads: bool) -> list[Row]:
    """The rows of one layer: each frozen GEMM, its adapters and the attention core's products; a GEMM whose
    weight peft's ``ParamWrapper`` adapts also takes its weight's gradient, and the wrapper's ``baddbmm`` (the
    adapted weight W + B·A, once per forward) is its own row."""
    modules, wrapped = targets
    ops = layer_ops(spec, layer, batch=batch, seq=seq)
    if any(op.kind in ("scan", "conv") for op in ops):
        raise TrainmathError(f"--peft FLOPs are modelled for attention layers; {spec.name} has scan/conv layers")
    run = LoraRun(targets=modules, rank=job.rank, input_grad=index > 0 or input_grads, wrapped=frozenset(wrapped))
    flow = grad_flow(ops, run)
    linears = op_flops.linear_gemms_from_ops(ops, top_k=layer_top_k(layer))
    out: list[Row] = []
    it = iter(linears)
    done: set[str] = set()
    for op, rg, target in flow:
        if op.kind == "linear" and op.weight is not None:
            g = next(it)
            wgrad = g.flops if op.weight.name in wrapped else 0
            out.append(Row(gemm=g, forward_flops=g.flops, backward_flops=(g.flops if rg[0] else 0) + wgrad,
                           dequant_numel=0 if op.weight.experts else op.weight.numel, wgrad_flops=wgrad))
            p = wrapped.get(op.weight.name)
            if p is not None and p[0].name not in done:
                done.add(p[0].name)
                d = delta_gemm(*p)
                out.append(Row(gemm=d, forward_flops=delta_evaluations(p[0]) * d.flops, backward_flops=2 * d.flops))
            if target:
                a = Gemm(name=f"{module_of(op)}.lora_A", component=LORA, m=g.m, k=g.k, n=job.rank)
                b = Gemm(name=f"{module_of(op)}.lora_B", component=LORA, m=g.m, k=job.rank, n=g.n)
                out.append(Row(gemm=a, forward_flops=a.flops, backward_flops=a.flops * (2 if rg[0] else 1)))
                out.append(Row(gemm=b, forward_flops=b.flops, backward_flops=2 * b.flops))
        elif op.kind == "attention":
            q, k, v = rg[:3]
            scores, values = op_flops.attention_gemms(op, causal=causal)
            out.append(Row(gemm=scores, forward_flops=scores.flops, backward_flops=scores.flops * (q + k)))
            out.append(Row(gemm=values, forward_flops=values.flops, backward_flops=values.flops * ((q or k) + v)))
    return out


def targets_of(spec, job: PeftJob) -> tuple[frozenset, dict]:
    """(the adapted Linear modules' names, ledger weight name → (the ``target_parameters`` parameter it is part
    of, its rank) for the parameters peft's ``ParamWrapper`` adapts)."""
    from trainmath.adapter_params import hf_parameters

    chosen = select(spec, job)
    have = hf_parameters(spec)
    wrapped = {}
    for m in chosen:
        if m.parameter:
            p = have[m.name]
            wrapped.update({t: (p, job.rank * m.rank_mult) for t in p.ledger})
    return frozenset(m.name for m in chosen if not m.parameter), wrapped


def delta_evaluations(p) -> int:
    """How many times one forward computes the ``ParamWrapper``'s product: a 3-d stack's ``_LoraFactorsProxy``
    runs its ``baddbmm`` twice (torch's ``register_parametrization``, unsafe=False, evaluates a new
    parametrization once to check its shape and dtype, and the cached forward again; the backward runs through
    the second); a 2-d weight's B·A is computed once before registering (``_LoraParameterProxy`` only adds it)."""
    return 2 if p.experts > 1 else 1


def delta_gemm(p, rank: int) -> Gemm:
    """The ``ParamWrapper``'s product of one layer: ``baddbmm`` of (E, a, r) × (E, r, b) for a 3-d expert stack
    (``_LoraFactorsProxy``), or B·A (b × r × a) for a 2-d weight (``Linear.get_delta_weight``): 2·E·a·b·r FLOPs,
    per forward, not per token; the backward is both factors' gradients, twice that (derived from peft 0.21's
    ``tuners/lora/layer.py``)."""
    return Gemm(name=f"{p.name}.lora_delta", component=LORA, m=p.in_features, k=rank, n=p.out_features,
                count=p.experts, weighted=False)


def peft_rows(spec, job: PeftJob, *, batch: int, seq: int, causal: str = "executed",
              input_grads: bool = False) -> tuple[tuple[LayerRows, ...], tuple[Gemm, ...]]:
    """(each layer type's rows, the head's GEMMs) of one micro-batch: what ``peft_flops`` sums and the step-time
    model (``perf.peft``) prices, so the two count the same FLOPs."""
    targets = targets_of(spec, job)
    out = []
    for layer, idx in spec.layer_groups():
        for first in (True, False):
            n = sum(1 for i in idx if (i == 0) == first)
            if n:
                rows = _layer(spec, layer, 0 if first else 1, job, targets, batch=batch, seq=seq, causal=causal,
                              input_grads=input_grads)
                again = sum(w.numel for w in _quantised(layer))
                out.append(LayerRows(layer=layer, count=n, rows=tuple(rows), recompute_dequant=again))
    return tuple(out), tuple(op_flops.linear_gemms_from_ops(head_ops(spec, batch=batch, seq=seq)))


def peft_flops(spec, job: PeftJob, *, batch: int, seq: int, causal: str = "executed", recompute: str = "none",
               input_grads: bool = False) -> PeftFlops:
    """GEMM FLOPs of one fine-tuning step of ``batch`` × ``seq`` tokens (see the module docstring)."""
    if recompute not in ("none", "full"):
        raise TrainmathError(f"--peft FLOPs count --recompute none or full, not {recompute}")
    base = count_flops(spec, batch=batch, seq=seq, causal=causal)
    groups, head = peft_rows(spec, job, batch=batch, seq=seq, causal=causal, input_grads=input_grads)
    fw: dict[str, dict[str, int]] = {}
    bw: dict[str, dict[str, int]] = {}
    rc: dict[str, dict[str, int]] = {}

    def add(into, g, v, times):
        mods = into.setdefault(g.component, {})
        mods[g.name] = mods.get(g.name, 0) + v * times

    dequant = 0
    for lr in groups:
        n = lr.count
        for row in lr.rows:
            add(fw, row.gemm, row.forward_flops, n)
            add(bw, row.gemm, row.backward_flops, n)
            if recompute == "full":
                add(rc, row.gemm, row.forward_flops, n)
            dequant += n * row.dequant_numel * (1 + (1 if row.backward_flops else 0))
        if recompute == "full":
            dequant += n * lr.recompute_dequant
    for g in head:
        add(fw, g, g.flops, 1)
        add(bw, g, g.flops, 1)  # the input's gradient only
    if job.method != "qlora":
        dequant = 0
    order = (*COMPONENT_ORDER, LORA)

    def tree(name, d):
        return Node.of(name, [Node.of(c, [Node(name=m, value=v, unit="flops") for m, v in d.get(c, {}).items()],
                                      "flops") for c in order], "flops")

    forward, backward, recomputed = tree("forward", fw), tree("backward", bw), tree("recompute", rc)
    training = Node.of("training", [forward, backward, recomputed], "flops",
                       note=f"{batch} × {seq} tokens, causal={causal}, recompute={recompute}, peft {job.method}")
    conventions = base.conventions[:1] + (
        f"peft {job.method}: base frozen: a frozen Linear's backward is its input's gradient only (no weight-"
        f"gradient GEMM); adapters r={job.rank} add lora_A and lora_B (forward 2·m·r·(in+out), backward their "
        f"weights' and inputs' gradients)",
        "layer 0 " + ("computes its input's gradient (enable_input_require_grads)" if input_grads else
                      "computes no gradient before its first adapted Linear (frozen embedding)"),
        "attention: each product's operand gradients only where the operand needs one (eager bmm)",
        f"recompute={recompute}" + (": every layer's forward again, adapters included" if recompute == "full" else ""),
    ) + ((f"target_parameters ({', '.join(sorted({p.name for p, _ in targets_of(spec, job)[1].values()}))}): "
          "peft's ParamWrapper adapts W + B·A per layer per forward (baddbmm 2·E·a·b·r, evaluated twice for a 3-d "
          "stack: register_parametrization checks it; backward 4·E·a·b·r), and the expert GEMMs take their weight "
          "gradient",) if targets_of(spec, job)[1] else ()) + (
        ("QLoRA dequantisation is not a GEMM: dequant_elements counts the 4-bit weight elements dequantised to "
          "bf16 per step (each use: forward, input gradient, recompute)",) if job.method == "qlora" else ())
    report = FlopsReport(model=spec.name, batch=batch, seq=seq, causal=causal, recompute=recompute, forward=forward,
                         backward=backward, recomputed=recomputed, training=training, layer_types=base.layer_types,
                         head=base.head, notes=base.notes, conventions=conventions)
    trainable = sum(p for _, p in _adapter_rows(spec, job))
    return PeftFlops(report=report, dequant_elements=dequant, trainable_params=trainable)


def _quantised(layer):
    return [t for t in layer.tensors if t.kind == "linear" and not t.experts and t.component != "router"]


def _adapter_rows(spec, job):
    from trainmath.adapters import adapter_report

    return adapter_report(spec, job, base_params=0).modules

