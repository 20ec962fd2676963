"""Predicted training peak (``--device cpu``) against the same step of the real transformers code run at full
width on fake tensors under MemTracker (``trainmath.memory.simulate``).

Method: for each case, ``training_memory(spec, setup)`` with ``device="cpu"`` (no allocator rounding, the
optimizer's step scalars on the one device) and ``simulate(config, setup)`` (two steps of
``out = model(ids, labels=ids); out.loss.backward(); opt.step(); opt.zero_grad()``, foreach AdamW, set_to_none,
the second measured). The simulated peak less the module buffers (rotary ``inv_freq``, not modelled) is compared
with the prediction. Target (issue 9): every case within 2%. Run: ``python benchmarks/memory_sim.py [--quick]``
(``--quick``: one model). ``--fsdp W``: rank 0 of a W-rank FSDP2 run instead (``--zero 3 --dp W``, bf16, for-loop
AdamW, over a fake process group). ``--moe``: Qwen3-30B-A3B cut to its first 4 layers (full width otherwise, as
the issue's own GPU check did), grouped experts. Each full-width case takes minutes on two shared cores.
"""

from __future__ import annotations

import sys

from trainmath.layout import ParallelLayout
from trainmath.memory.simulate import simulate
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.model import spec_from_config
from trainmath.model.spec import MoEDims
from trainmath.sources import resolve

MODELS = ("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.2-1B")
CASES = [(p, r) for p in ("bf16", "amp-bf16") for r in ("none", "full")]


def main() -> None:
    quick = "--quick" in sys.argv
    models = MODELS[:1] if quick else MODELS
    if "--moe" in sys.argv:
        models = ("Qwen/Qwen3-30B-A3B",)
    world = int(sys.argv[sys.argv.index("--fsdp") + 1]) if "--fsdp" in sys.argv else 1
    layout = ParallelLayout(dp=world, zero=3) if world > 1 else ParallelLayout()
    cases = [("bf16", r) for r in ("none", "full")] if world > 1 else CASES
    batches = (1,)
    if "--moe" in sys.argv:  # fake grouped_mm takes bf16 only; 8 × 2048 tokens put the peak in the activations
        cases, batches = [("bf16", r) for r in ("none", "full")], (1, 8)
    print("| model | layout | precision | recompute | b × s | predicted (B) | event | simulated − buffers (B) | "
          "difference | sim s |")
    print("|---|---|---|---|---|---:|---|---:|---:|---:|")
    for name in models:
        config = resolve(name).config
        if "--moe" in sys.argv:
            config = {**config, "num_hidden_layers": 4}
        spec = spec_from_config(config, name=name, source=name)
        moe = any(isinstance(b.dims, MoEDims) for layer in spec.layers for b in layer.blocks)
        for (precision, recompute), b in ((c, b) for b in batches for c in cases):
            setup = TrainingSetup(micro_batch=b, seq=2048, precision=precision, recompute=recompute,
                                  device="cpu", optimizer_impl="forloop" if world > 1 else "foreach")
            r = training_memory(spec, setup, layout)
            sim = simulate(config, setup, layout, moe=moe)
            measured = sim.peak_bytes - sim.buffers_bytes
            diff = 100 * (r.peak_bytes - measured) / measured
            where = f"FSDP2 rank 0 of {world}" if world > 1 else "1 device"
            where += ", 4 layers" if "--moe" in sys.argv else ""
            print(f"| {name} | {where} | {precision} | {recompute} | {b} × 2048 | {r.peak_bytes:,} | "
                  f"{r.stages[0].phase} | {measured:,} | {diff:+.3f}% | {sim.seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
