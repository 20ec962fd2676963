"""One tensor-parallel rank at full width: the real transformers step on fake tensors over a fake process group.

Method: for each model, precision and layout, ``trainmath.verify.simulate.simulate`` builds the model inside
``FakeTensorMode``, splits it with ``trainmath.runtime.tensor_parallel.apply_tp`` (torchtitan's plans; the device
mesh of a ``dist.init_process_group("fake")`` world of tp ranks made outside the fake mode), and runs
``out = model(ids, labels=ids); out.loss.backward(); opt.step(); opt.zero_grad()`` twice (for-loop AdamW,
set_to_none) under MemTracker, the second measured. Printed per rank: MemTracker's peak and its Activation part,
and the bytes the first forward saved for backward (distinct non-parameter storages, DTensors by their local
tensor). Micro-batch 1 × 2048 tokens, SDPA. Run: ``python benchmarks/memory_tp.py [--quick] [--vocab-parallel]``
(``--quick``: Qwen3-0.6B, bf16 only). Each case takes 20-60 s on two shared cores.
"""

from __future__ import annotations

import sys

from trainmath.layout import ParallelLayout
from trainmath.memory.training import TrainingSetup
from trainmath.sources import resolve
from trainmath.verify.simulate import simulate

MODELS = ("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.2-1B")
LAYOUTS = [(1, False), (2, False), (2, True), (4, False), (4, True)]


def main() -> None:
    quick = "--quick" in sys.argv
    vp = "--vocab-parallel" in sys.argv
    models = MODELS[:1] if quick else MODELS
    precisions = ("bf16",) if quick else ("bf16", "amp-bf16")
    print("| model | precision | tp | sp | vocab parallel | peak / rank (B) | GiB | Activation at peak (B) | "
          "saved for backward (B) | saved ÷ tp=1 | sim s |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for name in models:
        config = resolve(name).config
        for precision in precisions:
            setup = TrainingSetup(micro_batch=1, seq=2048, precision=precision, optimizer_impl="forloop",
                                  device="cpu")
            base = None
            for tp, sp in LAYOUTS:
                layout = ParallelLayout(tp=tp, sp=sp, vocab_parallel=vp and tp > 1)
                sim = simulate(config, setup, layout)
                base = base or sim.saved_bytes
                print(f"| {name} | {precision} | {tp} | {'yes' if sp else 'no'} | "
                      f"{'yes' if layout.vocab_parallel else 'no'} | {sim.peak_bytes:,} | "
                      f"{sim.peak_bytes / 2**30:.3f} | {sim.by_kind.get('Activation', 0):,} | "
                      f"{sim.saved_bytes:,} | {sim.saved_bytes / base:.3f} | {sim.seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
