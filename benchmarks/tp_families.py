"""Tensor parallelism measured per family: what each of 2 real gloo ranks saves for backward, beside the calculator.

Method: ``tests/memory/tp_oracle.run_tp`` starts 2 gloo ranks on this CPU; on each, the tiny model of
``tests/memory/tp_oracle.py`` (b = 2, s = 16, hidden 64, 4 heads, 2 KV heads, 2 layers, vocab 128, each family's
config keys in ``tp_oracle.FAMILY``) is split by ``trainmath.runtime.tensor_parallel.apply_tp`` and one forward
with labels runs under ``saved_tensors_hooks`` (distinct non-parameter storages, DTensors by their local tensor).
The calculator's figure is ``activation_bytes`` + the saved part of ``logits_bytes`` at the same degrees
(``tests/memory/test_tp_oracle.py::fold``). Printed per family and precision: tp = 1 (the fold; the single-device
oracle measures it), then each layout's measured bytes (both ranks equal, else both shown) and ``=`` when it equals
the fold. SDPA; qwen3_moe with transformers' grouped_mm experts and, as ``qwen3_moe:eager``, the eager loop.
Run: ``python benchmarks/tp_families.py [family,...]`` (about 3 s a case on two shared cores).

``--full-width``: one catalog model per family at full width, cut to 2 decoder layers (``memory_sim.cut``),
b = 1, s = 512, bf16 (Gemma-3-1B with 4 KV heads instead of 1), rank 0 of tp = 2 with SP over a fake process
group (``trainmath.verify.simulate.simulate``: the model built on fake tensors, split by ``apply_tp``, two steps
under MemTracker, for-loop AdamW): the simulated saved bytes beside the fold, and the simulated peak (less module
buffers) beside ``training_memory``'s CPU peak.
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "memory"))

FAMILIES = ("gemma3_text", "olmo2", "starcoder2", "cohere", "qwen3_moe", "qwen3_moe:eager", "phi3")
MODES = ("fp32", "bf16", "autocast")
LAYOUTS = ((False, False), (False, True), (True, False), (True, True))


def full_width() -> None:
    import dataclasses

    from memory_sim import FAMILIES as MODELS
    from memory_sim import cut

    from trainmath.families import spec_from_config
    from trainmath.layout import ParallelLayout
    from trainmath.memory.activations import activation_bytes, logits_bytes
    from trainmath.memory.training import TrainingSetup, training_memory
    from trainmath.sources import resolve
    from trainmath.verify.simulate import simulate

    layout = ParallelLayout(tp=2, sp=True)
    print("| family | model (2 layers) | saved / rank, simulated (B) | fold (B) | peak − buffers, simulated (B) | "
          "predicted peak (B) | difference | sim s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    for family in only or ("gemma3_text", "olmo2", "starcoder2", "cohere", "qwen3_moe", "phi3"):
        name = MODELS[family]
        config = cut(resolve(name).config)
        if family == "gemma3_text":  # Gemma-3-1B has one KV head, which tp = 2 cannot split: 4 (its query heads)
            config["num_key_value_heads"] = config["num_attention_heads"]
            name += " (4 KV heads)"
        spec = spec_from_config(config, name=name, source=name)
        moe = family == "qwen3_moe"
        setup = TrainingSetup(micro_batch=1, seq=512, precision="bf16", optimizer_impl="forloop", device="cpu")
        if moe:
            setup = dataclasses.replace(setup, experts="grouped")
        kw = dict(compute_dtype_bytes=2, param_dtype_bytes=2, tp=2, sp=True)
        want = activation_bytes(spec, micro_batch=1, seq=512, experts="grouped", **kw).total_bytes \
            + logits_bytes(spec, 1, 512, vocab_parallel=False, **kw).saved_bytes
        predicted = training_memory(spec, setup, layout).peak_bytes
        sim = simulate(config, setup, layout, moe=moe)
        measured = sim.peak_bytes - sim.buffers_bytes
        print(f"| {family} | {name} | {sim.saved_bytes:,} | {want:,} | {measured:,} | {predicted:,} | "
              f"{100 * (predicted - measured) / measured:+.3f}% | {sim.seconds:.0f} |", flush=True)


def main() -> None:
    if "--full-width" in sys.argv:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        return full_width()
    import tp_oracle
    from test_tp_oracle import fold

    families = sys.argv[1].split(",") if len(sys.argv) > 1 else FAMILIES
    cases = [(f, "sdpa", m, sp, vp) for f in families for m in MODES for sp, vp in LAYOUTS]
    ranks = tp_oracle.run_tp(2, cases, peak_cases=set())
    got = dict(zip(cases, ranks))
    print("| model_type | precision | tp = 1 | tp = 2 | tp = 2, vocab parallel | tp = 2, SP | "
          "tp = 2, SP + vocab parallel |")
    print("|---|---|---:|---:|---:|---:|---:|")
    equal = 0
    for f in families:
        for m in MODES:
            cells = []
            for sp, vp in LAYOUTS:
                case = (f, "sdpa", m, sp, vp)
                saved = sorted({r["saved"] for r in got[case]})
                ok = saved == [fold(case)]
                equal += ok
                cells.append(" / ".join(f"{x:,}" for x in saved) + (" =" if ok else f" (fold {fold(case):,})"))
            print(f"| {f} | {m} | {fold((f, 'sdpa', m, False, False), tp=1):,} | " + " | ".join(cells) + " |")
    print(f"\n{equal} of {len(cases)} cases equal to the calculator's per-rank fold on both ranks")


if __name__ == "__main__":
    main()
