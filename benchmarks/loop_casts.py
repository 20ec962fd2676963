"""The loops people write, predicted against the same step of transformers' real code on fake tensors under
MemTracker (``trainmath.verify.simulate``), at Qwen3-8B's full width cut to 2 decoder layers.

Method: amp-bf16, micro-batch 1 × seq 1024, plain SGD (no optimizer state, so the peak falls in backward: at the
embedding's backward), ``device="cpu"``; the loop ``loss = model(...).loss`` (the default ``--loop-keeps loss``)
with ``backward()`` after ``torch.autocast`` exits, and inside it (``--backward-in-autocast``), each under
``--recompute full`` and ``none``. The simulated peak less the module buffers is compared with the prediction;
the inside-minus-after difference must equal the calculator's (2 bytes per linear parameter, the LM head's
included). Run: ``python benchmarks/loop_casts.py`` (about 30 s on two shared cores).
"""

from __future__ import annotations

import time

from trainmath.families import spec_from_config
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.render import table
from trainmath.sources import catalog_entry
from trainmath.verify.simulate import simulate


def main() -> None:
    cfg = dict(catalog_entry("Qwen/Qwen3-8B").config, num_hidden_layers=2)
    spec = spec_from_config(cfg, name="Qwen3-8B (2 layers)", source="catalog")
    rows, got = [], {}
    for recompute in ("full", "none"):
        for inside in (False, True):
            setup = TrainingSetup(micro_batch=1, seq=1024, precision="amp-bf16", optimizer="sgd",
                                  recompute=recompute, device="cpu", backward_in_autocast=inside)
            start = time.perf_counter()
            sim = simulate(cfg, setup)
            r = training_memory(spec, setup)
            measured = sim.peak_bytes - sim.buffers_bytes
            got[recompute, inside] = measured, r.peak_bytes
            rows.append([recompute, "inside" if inside else "after", r.stages[0].phase, f"{measured:,}",
                         f"{r.peak_bytes:,}", f"{r.peak_bytes - measured:+,}",
                         f"{time.perf_counter() - start:.1f}"])
    print(table(["recompute", "backward()", "peak event", "MemTracker", "predicted", "difference", "s"], rows))
    for recompute in ("full", "none"):
        (m0, p0), (m1, p1) = got[recompute, False], got[recompute, True]
        print(f"recompute {recompute}: inside - after = {m1 - m0:,} measured, {p1 - p0:,} predicted")


if __name__ == "__main__":
    main()
