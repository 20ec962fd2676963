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
"""

from __future__ import annotations

import sys

from trainmath.memory.activations import activation_bytes
from trainmath.memory.simulate import simulate
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.model import spec_from_config
from trainmath.sources import resolve

MODELS = ("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.2-1B")
RECOMPUTE = ("none", "selective", "full")


def main() -> None:
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
            transient = sum(c.value for c in act.children if c.name == "recompute transient")
            r = training_memory(spec, setup)
            sim = simulate(config, setup)
            measured = sim.peak_bytes - sim.buffers_bytes
            diff = 100 * (r.peak_bytes - measured) / measured
            print(f"| {name} | {recompute} | {act.value - transient:,} | {transient:,} | {r.peak_bytes:,} | "
                  f"{r.stages[0].phase} | {measured:,} | {diff:+.3f}% | {sim.seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
