"""LoRA / QLoRA adapters: which Linear modules peft wraps, and the exact parameters it adds.

peft (the reference implementation) replaces each targeted ``nn.Linear`` (or GPT-2's ``Conv1D``) of in → out
features with the frozen base plus ``lora_A`` (in → r) and ``lora_B`` (r → out), both without bias by default:
r·(in + out) trainable parameters per module. The targeted modules come from the parameter ledger itself (every
``linear`` weight of a decoder layer), so there is no second list of module names per family.

What is and is not supported, as peft 0.18+ sees transformers 5's modules:
- ``all-linear``: every ``nn.Linear``/``Conv1D`` except the output layer (``get_output_embeddings()``, lm_head);
  fused projections (Phi-3's ``qkv_proj``/``gate_up_proj``, Falcon's ``query_key_value``, GPT-2's ``c_attn``)
  are one module, one adapter.
- MoE: attention, dense MLPs, shared experts and Llama 4's router (an ``nn.Linear`` subclass) are Linear modules.
  Routed experts are stored fused as 3-d ``nn.Parameter``s (E, in, out), most routers as a bare weight Parameter.
  For the model types transformers converts from v4 checkpoints (Mixtral; Qwen3-MoE, Qwen3-Next, DeepSeek-V2/V3,
  GLM-4.5), peft (``utils/transformers_weight_conversion.py``) maps the v4 names to those parameters:
  ``gate`` → ``gate.weight`` (r·(d + E)), ``gate_proj``+``up_proj`` (``w1``+``w3``) → ``gate_up_proj`` at rank 2r,
  ``down_proj`` (``w2``) → ``down_proj``, each expert r·(in + out); ``all-linear`` adds all three. A leaf name so
  mapped no longer targets the Linear modules of that name (dense MLPs, shared experts), as in peft. Any MoE
  type's experts and bare routers are reached by ``target_parameters`` (``--lora-target-parameters``,
  ``adapter_params``: peft's ``ParamWrapper``); naming them in ``--lora-targets`` is refused with that hint.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from trainmath.errors import TrainmathError

METHODS = ("none", "lora", "qlora")
ALL_LINEAR = "all-linear"
ADAPTER_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Per family (``FamilyDef``): whether the MoE router is an nn.Linear peft can wrap (``linear_router``), peft's
# v4 → v5 MoE target conversion (``lora_moe_conversion``), and whether peft's Mamba check applies (``lora_mamba``:
# it refuses LoRA on these leaf modules, tuners_utils._check_lora_target_modules_mamba).
MAMBA_REFUSED = ("out_proj", "conv1d")
CONVENTIONS = (
    "LoRA adds r·(in + out) per targeted Linear (lora_A in→r, lora_B r→out, bias='none'), as peft's LoraConfig",
    "trainable = adapters only (the base is frozen); total = base + adapters, as peft's "
    "get_nb_trainable_parameters()",
    "all-linear = every Linear/Conv1D but the output layer (peft's rule)",
    "routed experts and routers: bare Parameters, adapted through peft's target_parameters (ParamWrapper: "
    "r·E·(in+out) per 3-d expert stack, r·(in+out) per 2-d weight), named directly (--lora-target-parameters) or "
    "by the v4 module names peft converts (Mixtral, Qwen2/3-MoE, Qwen3-Next, DeepSeek-V2/V3, GLM-4.5: gate_up_proj "
    "at rank 2r where both gate and up are named)",
)


@dataclass(frozen=True, kw_only=True)
class PeftJob:
    """The fine-tuning job: ``method`` none (full training), lora or qlora; adapter rank, alpha, targets, dtype."""

    method: str = "none"
    rank: int = 8
    alpha: int | None = None
    targets: tuple[str, ...] | str = ("q_proj", "v_proj")
    dtype: str = "fp32"
    target_parameters: tuple[str, ...] = ()
    """peft's ``target_parameters``: bare Parameters (routed experts, routers) by name (``adapter_params``)."""

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def lora_alpha(self) -> int:
        """peft's default lora_alpha is 8 whatever the rank; the scaling applied is alpha / r."""
        return 8 if self.alpha is None else self.alpha


@dataclass(frozen=True, kw_only=True)
class TargetModule:
    """One targeted module name (relative to its layer), in all layers that have it."""

    name: str
    in_features: int
    out_features: int
    count: int  # modules of this name in the model (layers that have it; × experts for a fused parameter)
    rank_mult: int = 1  # peft's rank_pattern: 2 for a fused gate_up_proj that stands for two v4 targets
    parameter: bool = False  # a bare Parameter peft wraps through target_parameters (ParamWrapper), not a Linear
    experts: int = 1  # E of a 3-d expert stack (count is layers × E)


@dataclass(frozen=True, kw_only=True)
class AdapterReport:
    job: PeftJob
    modules: tuple[tuple[TargetModule, int], ...]  # (module, adapter params over all its copies)
    base_params: int
    notes: tuple[str, ...] = ()

    @property
    def adapter_params(self) -> int:
        return sum(p for _, p in self.modules)

    @property
    def trainable_params(self) -> int:
        return self.adapter_params

    @property
    def total_params(self) -> int:
        return self.base_params + self.adapter_params

    @property
    def adapter_bytes(self) -> int:
        return self.adapter_params * ADAPTER_DTYPES[self.job.dtype]

    def to_dict(self) -> dict:
        j = self.job
        return {
            "peft": j.method, "lora_rank": j.rank, "lora_alpha": j.lora_alpha,
            "lora_targets": j.targets if isinstance(j.targets, str) else list(j.targets), "lora_dtype": j.dtype,
            "lora_target_parameters": list(j.target_parameters),
            "trainable_params": self.trainable_params, "adapter_params": self.adapter_params,
            "total_params": self.total_params, "adapter_bytes": self.adapter_bytes,
            "adapter_modules": [{"module": m.name, "in_features": m.in_features, "out_features": m.out_features,
                                 "rank": j.rank * m.rank_mult, "modules": m.count, "params": p,
                                 "target": "parameter" if m.parameter else "module"}
                                for m, p in self.modules],
            "peft_notes": list(self.notes), "peft_conventions": list(CONVENTIONS),
        }


def linear_modules(spec) -> dict[str, TargetModule]:
    """Every Linear module peft can wrap, by name relative to its layer, in order of first appearance."""
    found: dict[str, list] = {}
    for layer, idx in spec.layer_groups():
        for t in layer.tensors:
            if t.kind != "linear" or not t.name.endswith(".weight") or t.experts:
                continue
            if t.component == "router" and not spec.family.linear_router:
                continue
            out_f, in_f = reversed(t.shape) if t.transposed else t.shape
            name = t.name[: -len(".weight")]
            entry = found.setdefault(name, [in_f, out_f, 0])
            if (entry[0], entry[1]) != (in_f, out_f):
                raise TrainmathError(f"module {name} changes shape across layers; per-layer LoRA is not modelled")
            entry[2] += len(idx)
    return {n: TargetModule(name=n, in_features=i, out_features=o, count=c) for n, (i, o, c) in found.items()}


def expert_modules(spec) -> set[str]:
    """Names of routed-expert and router weights: targetable by peft only as parameters, not modules."""
    out = set()
    for layer in spec.layers:
        for t in layer.tensors:
            if t.kind == "linear" and (t.experts or t.component == "router"):
                out.add(t.name.rsplit(".weight", 1)[0].replace(".{e}", ""))
    return out


def _matches(name: str, target: str) -> bool:
    """peft's suffix rule for a string in target_modules: the module's name equals it or ends with '.' + it."""
    return name == target or name.endswith("." + target)


def _convert_moe(spec, targets) -> tuple[list[str], list[str], bool]:
    """peft's conversion (``utils/transformers_weight_conversion._convert_peft_config_moe``): v4 expert/router
    names become ``target_parameters`` (gate_up_proj, down_proj, gate.weight); the rest stay module targets.
    Returns (module targets, parameter targets, whether the fused pair was named: gate_up_proj then at 2r)."""
    mapping, pair = spec.family.lora_moe_conversion
    if targets == ALL_LINEAR:
        targets = sorted({n.rsplit(".", 1)[-1] for n in linear_modules(spec)} | set(mapping))
    modules, params, olds = [], {}, set()
    for t in targets:
        old = next((o for o in mapping if t == o or t.endswith("." + o)), None)
        if old is None:
            modules.append(t)
        else:
            params[mapping[old]] = None
            olds.add(old)
    if len(olds & set(pair)) == 1:
        raise TrainmathError(f"--lora-targets: {' and '.join(pair)} are fused into the experts' gate_up_proj in "
                             f"transformers 5; target both or neither (peft refuses one alone)")
    return modules, list(params), set(pair) <= olds


def _parameters(spec, names: list[str], fused: bool) -> list[TargetModule]:
    """The ``target_parameters`` as adapters: r·E·(in + out) each (peft's ``ParamWrapper``), gate_up_proj at 2r
    where the fused v4 pair was named (peft's rank_pattern)."""
    from trainmath.adapter_params import parameter_targets

    return [TargetModule(name=p.name, in_features=p.in_features, out_features=p.out_features,
                         count=len(p.layers) * p.experts, parameter=True, experts=p.experts,
                         rank_mult=2 if fused and p.name.endswith(".gate_up_proj") else 1)
            for p in parameter_targets(spec, tuple(dict.fromkeys(names)))]


def select(spec, job: PeftJob) -> list[TargetModule]:
    """The modules and parameters ``job`` targets, or a one-line error naming what the model has."""
    from trainmath.adapter_params import NONE

    mods = linear_modules(spec)
    targets, params, fused = job.targets, list(job.target_parameters), False
    if targets == NONE:
        targets = ()
    if spec.family.lora_moe_conversion:
        targets, converted, fused = _convert_moe(spec, targets)
        params = converted + params
    elif targets == ALL_LINEAR:
        return list(mods.values()) + _parameters(spec, params, False)
    chosen: dict[str, TargetModule] = {}
    for target in targets:
        hits = [m for n, m in mods.items() if _matches(n, target)]
        if not hits:
            experts = sorted(n for n in expert_modules(spec) if _matches(n, target) or target in n.split("."))
            if experts:
                raise TrainmathError(
                    f"--lora-targets {target}: {', '.join(experts)} is a routed-expert/router weight stored as a "
                    f"bare Parameter, not a Linear; peft reaches it through target_parameters: pass "
                    f"--lora-target-parameters (e.g. experts.gate_up_proj,experts.down_proj)")
            names = sorted({n.rsplit(".", 1)[-1] for n in mods})
            raise TrainmathError(f"--lora-targets {target}: no such Linear module in {spec.name}; it has "
                                 f"{', '.join(names)} (or {ALL_LINEAR})")
        for m in hits:
            chosen[m.name] = m
    return list(chosen.values()) + [m for m in _parameters(spec, params, fused) if m.count]


def adapter_report(spec, job: PeftJob, base_params: int) -> AdapterReport:
    """Adapters of ``job`` on ``spec``: r·(in + out) per targeted module, checked against each module's width."""
    if job.method == "qlora" and spec.options.get("quantization_config"):
        qm = (spec.options["quantization_config"] or {}).get("quant_method", "quantized")
        raise TrainmathError(f"--peft qlora: {spec.name} already ships quantized ({qm} quantization_config); "
                             f"QLoRA quantizes a bf16/fp16 base: use --peft lora, or a bf16 checkpoint")
    rows, notes = [], []
    chosen = select(spec, job)
    bad = sorted({m.name for m in chosen if m.name.rsplit(".", 1)[-1] in MAMBA_REFUSED})
    if spec.family.lora_mamba and bad:
        ok = sorted({m.name.rsplit(".", 1)[-1] for m in linear_modules(spec).values()} - set(MAMBA_REFUSED))
        raise TrainmathError(f"--lora-targets: peft refuses LoRA on {', '.join(bad)} of Mamba-based models "
                             f"({spec.model_type}); name the targets instead, from {','.join(ok)}")
    for m in chosen:
        width = min(m.in_features, m.out_features)
        if job.rank > width:
            if job.targets != ALL_LINEAR and not m.parameter:
                raise TrainmathError(f"--lora-rank {job.rank} exceeds {m.name}'s smaller dimension "
                                     f"({m.in_features} → {m.out_features}): choose r ≤ {width}")
            notes.append(f"r={job.rank} exceeds {m.name}'s smaller dimension {width}: "
                         f"{'target_parameters' if m.parameter else 'all-linear'} adapts it anyway, as peft does "
                         f"(a rank beyond {width} adds parameters, not expressiveness)")
        rows.append((m, job.rank * m.rank_mult * (m.in_features + m.out_features) * m.count))
    return AdapterReport(job=job, modules=tuple(rows), base_params=base_params, notes=tuple(notes))


def add_peft_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fine-tuning (peft)")
    g.add_argument("--peft", choices=METHODS, default=None,
                   help="none (full training, the default), lora, or qlora (4-bit NF4 frozen base, bitsandbytes)")
    g.add_argument("--lora-rank", type=int, default=None, metavar="R", help="adapter rank r (default 8, as peft)")
    g.add_argument("--lora-alpha", type=int, default=None, metavar="A",
                   help="lora_alpha (default 8, as peft); scaling alpha/r, no effect on counts")
    g.add_argument("--lora-targets", default=None, metavar="NAMES",
                   help="comma-separated module names matched as peft does (suffix of the module's name), or "
                        "all-linear (every Linear but the output layer); default q_proj,v_proj")
    g.add_argument("--lora-target-parameters", default=None, metavar="NAMES",
                   help="comma-separated Parameter names, peft's target_parameters (matched as a suffix of "
                        "<module>.<parameter>): routed experts (experts.gate_up_proj, experts.down_proj) and bare "
                        "routers (gate.weight); added to --lora-targets (pass --lora-targets none for these alone)")
    g.add_argument("--lora-dtype", choices=tuple(ADAPTER_DTYPES), default=None,
                   help="adapter dtype (default fp32: where peft's autocast_adapter_dtype=True leaves adapters of "
                        "a bf16/fp16 model)")


def peft_from_args(args: argparse.Namespace) -> PeftJob:
    """The job from the flags; ``--lora-*`` without ``--peft lora|qlora`` is an error."""
    given = [f for f in ("lora_rank", "lora_alpha", "lora_targets", "lora_dtype", "lora_target_parameters")
             if getattr(args, f, None) is not None]
    method = args.peft or "none"
    if method == "none":
        if given:
            flags = ", ".join("--" + f.replace("_", "-") for f in given)
            raise TrainmathError(f"{flags} needs --peft lora or --peft qlora (without it the job is full training)")
        return PeftJob()
    rank = 8 if args.lora_rank is None else args.lora_rank
    if rank < 1:
        raise TrainmathError(f"--lora-rank {rank}: the rank must be a positive integer")
    from trainmath.adapter_params import NONE

    raw = args.lora_targets or "q_proj,v_proj"
    raw_params = getattr(args, "lora_target_parameters", None)
    params = tuple(t.strip() for t in (raw_params or "").split(",") if t.strip())
    if raw_params is not None and not params:
        raise TrainmathError(f"--lora-target-parameters {raw_params!r}: name at least one parameter")
    if raw.strip().lower() in (ALL_LINEAR, NONE):
        targets: tuple[str, ...] | str = raw.strip().lower()
        if targets == NONE and not params:
            raise TrainmathError("--lora-targets none adapts nothing without --lora-target-parameters")
    else:
        targets = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not targets:
            raise TrainmathError(f"--lora-targets {raw!r}: name at least one module, or {ALL_LINEAR}")
    return PeftJob(method=method, rank=rank, alpha=args.lora_alpha, targets=targets, dtype=args.lora_dtype or "fp32",
                   target_parameters=params)
