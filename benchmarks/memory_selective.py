"""``--recompute selective`` (torchtitan's op-level policy, ``trainmath.runtime.checkpointing``): predicted training
peak (``--device cpu``) against the same step of the real transformers code, run at full width on fake tensors
under MemTracker with ``apply_selective`` on its decoder layers (``trainmath memory ... --simulate``), beside
``none`` and ``full``.

Method as ``benchmarks/memory_sim.py``: ``training_memory(spec, setup)`` with ``device="cpu"`` and
``simulate(config, setup)`` (two steps of ``out = model(ids, labels=ids); out.loss.backward(); opt.step();
opt.zero_grad()``, foreach AdamW, set_to_none, the second measured), bf16 weights, 1 × 2048 tokens. The simulated
peak less the module buffers (rotary ``inv_freq``, not modelled) is compared with the prediction; the activations
column is the prediction's kept activations (``activation_bytes``: layer inputs + selective caches, rotary,
embedding), the transient column its ``recompute transient``. Target (issue 9): within 2%.
Run: ``python benchmarks/memory_selective.py [--quick]`` (``--quick``: Qwen3-0.6B only). Minutes per case on two
shared cores.

``--families [--only a,b]``: ``--recompute selective`` for one catalog model per hf family, full width cut to 2
decoder layers (``memory_sim.cut``: one layer of each kind), b = 1, s = 512, bf16 and amp-bf16, single device,
as ``memory_sim.py --families`` runs ``none``/``full`` (same experts path and attention; a case whose simulation
fails is a row with the error). Seconds per case.
"""

from __future__ import annotations

import dataclasses
import sys

from memory_sim import EAGER_ATTENTION, FAMILIES, cut

from trainmath.families import spec_from_config
from trainmath.memory.activations import activation_bytes
from trainmath.memory.training import TrainingSetup, experts_path, training_memory
from trainmath.model.spec import MoEDims
from trainmath.sources import resolve
from trainmath.verify.simulate import simulate

MODELS = ("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.2-1B")
RECOMPUTE = ("none", "selective", "full")


def families() -> None:
    """The ``--families`` table (module docstring)."""
    print("| family | model (cut) | precision | experts | kept activations (B) | recompute transient (B) | "
          "predicted peak (B) | event | simulated − buffers (B) | difference | sim s |")
    print("|---|---|---|---|---:|---:|---:|---|---:|---:|---:|")
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else list(FAMILIES)
    for family, name in ((f, n) for f, n in FAMILIES.items() if f in only):
        layers = ("3 layers" if family == "nemotron_h" else "2 layers") + (
            ", eager attention" if family in EAGER_ATTENTION else "")
        config = cut(resolve(name).config)
        spec = spec_from_config(config, name=name, source=name)
        moe = any(isinstance(b.dims, MoEDims) for layer in spec.layers for b in layer.blocks)
        for precision in ("bf16", "amp-bf16"):
            setup = TrainingSetup(micro_batch=1, seq=512, precision=precision, recompute="selective", device="cpu",
                                  attention="eager" if family in EAGER_ATTENTION else "sdpa")
            experts = experts_path(spec, setup) if moe else "-"
            if experts == "grouped" and precision != "bf16":
                experts = "eager"  # fake _grouped_mm takes bf16 only
            if moe:
                setup = dataclasses.replace(setup, experts=experts)
            c, p = (2, 2) if precision == "bf16" else (2, 4)
            try:
                act = activation_bytes(spec, micro_batch=1, seq=512, recompute="selective", compute_dtype_bytes=c,
                                       param_dtype_bytes=p, profile="eager" if family in EAGER_ATTENTION else "hf",
                                       experts=experts if moe else "eager")
                transient = act.recompute_transient_bytes
                r = training_memory(spec, setup)
                sim = simulate(config, setup, moe=moe)
            except Exception as e:  # noqa: BLE001 - a row, not a crash
                msg = str(e).strip().splitlines()[0][:160].replace("|", "/") if str(e).strip() else ""
                print(f"| {family} | {name}, {layers} | {precision} | {experts} | - | - | - | - | - | "
                      f"failed: {type(e).__name__}: {msg} | - |", flush=True)
                continue
            measured = sim.peak_bytes - sim.buffers_bytes
            diff = 100 * (r.peak_bytes - measured) / measured
            print(f"| {family} | {name}, {layers} | {precision} | {experts} | {act.total_bytes - transient:,} | "
                  f"{transient:,} | {r.peak_bytes:,} | {r.stages[0].phase} | {measured:,} | {diff:+.3f}% | "
                  f"{sim.seconds:.0f} |", flush=True)


def main() -> None:
    if "--families" in sys.argv:
        families()
        return
    models = MODELS[:1] if "--quick" in sys.argv else MODELS
    print("| model | recompute | kept activations (B) | recompute transient (B) | predicted peak (B) | event | "
          "simulated − buffers (B) | difference | sim s |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    for name in models:
        config = resolve(name).config
        spec = spec_from_config(config, name=name, source=name)
        for recompute in RECOMPUTE:
            setup = TrainingSetup(micro_batch=1, seq=2048, precision="bf16", recompute=recompute, device="cpu")
            act = activation_bytes(spec, micro_batch=1, seq=2048, recompute=recompute, compute_dtype_bytes=2,
                                   param_dtype_bytes=2)
            transient = act.recompute_transient_bytes
            r = training_memory(spec, setup)
            sim = simulate(config, setup)
            measured = sim.peak_bytes - sim.buffers_bytes
            diff = 100 * (r.peak_bytes - measured) / measured
            print(f"| {name} | {recompute} | {act.total_bytes - transient:,} | {transient:,} | {r.peak_bytes:,} | "
                  f"{r.stages[0].phase} | {measured:,} | {diff:+.3f}% | {sim.seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
