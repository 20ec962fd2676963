"""Per-rank saved bytes of the hf profile for the layouts of issue 9 (item 4), and the gloo TP oracle beside them.

Part 1 (pure calculator, instant): what one rank saves for backward (``activation_bytes`` + the saved part of
``logits_bytes``) for Qwen3-8B at 1 × 4096 in bf16 (``model.to(bfloat16)``) and amp-bf16 (fp32 weights under
autocast), for tp ∈ {1, 2, 4, 8} with and without sequence parallelism and a vocabulary-parallel head, cp 2, and
Qwen3-30B-A3B (eager expert loop) at ep 1, 2, 4.

Part 2 (``--oracle``: needs torch and transformers, ~2 min on two cores): the same prediction against what
transformers' decoder layers save on each of 2 real gloo ranks under ``parallelize_module`` (the tiny models and
the plans of ``tests/memory/tp_oracle.py`` / ``trainmath.runtime.tensor_parallel``).
Run: ``python benchmarks/per_rank.py [--oracle]``.
"""

from __future__ import annotations

import sys

from trainmath.memory.activations import activation_bytes, logits_bytes
from trainmath.sources import load_spec

PRECISIONS = {"bf16": (2, 2), "amp-bf16": (2, 4)}


def saved(spec, c, p, *, b=1, s=4096, **deg) -> int:
    act = activation_bytes(spec, micro_batch=b, seq=s, compute_dtype_bytes=c, param_dtype_bytes=p, **deg)
    head = logits_bytes(spec, b, s, compute_dtype_bytes=c, param_dtype_bytes=p, tp=deg.get("tp", 1),
                        sp=deg.get("sp", False), cp=deg.get("cp", 1), vocab_parallel=deg.get("vocab_parallel", False))
    return act.total_bytes + head.saved_bytes


def gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def table() -> None:
    spec = load_spec("Qwen/Qwen3-8B")
    layouts = [dict(tp=t, sp=sp) for t in (1, 2, 4, 8) for sp in ((False,) if t == 1 else (False, True))]
    layouts += [dict(tp=t, sp=True, vocab_parallel=True) for t in (2, 4, 8)]
    layouts += [dict(cp=2), dict(tp=2, sp=True, cp=2), dict(tp=8, sp=True, cp=2, vocab_parallel=True)]
    print("Qwen3-8B, micro-batch 1 × 4096, saved for backward per rank (activations + head/loss), GiB = 2**30")
    print("| layout | bf16 bytes | GiB | amp-bf16 bytes | GiB |")
    print("|---|---:|---:|---:|---:|")
    for lay in layouts:
        name = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in lay.items()
                        if v is True or (v is not False and v > 1)) or "one device"
        row = [saved(spec, *PRECISIONS[pr], **lay) for pr in PRECISIONS]
        print(f"| {name} | {row[0]:,} | {gib(row[0])} | {row[1]:,} | {gib(row[1])} |")
    moe = load_spec("Qwen/Qwen3-30B-A3B")
    print()
    print("Qwen3-30B-A3B, 1 × 4096, eager expert loop, saved for backward per rank")
    print("| layout | bf16 bytes | GiB | amp-bf16 bytes | GiB |")
    print("|---|---:|---:|---:|---:|")
    for ep in (1, 2, 4):
        row = [saved(moe, *PRECISIONS[pr], ep=ep, experts="eager") for pr in PRECISIONS]
        print(f"| {'--ep ' + str(ep) if ep > 1 else 'one device'} | {row[0]:,} | {gib(row[0])} | {row[1]:,} | "
              f"{gib(row[1])} |")


def oracle() -> None:
    import os

    import transformers

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "memory"))
    import tp_oracle as o

    from trainmath.families import spec_from_config

    modes = {"fp32": (4, 4), "bf16": (2, 2), "autocast": (2, 4)}
    cases = [(mt, attn, mode, sp, vp) for mt in ("llama", "qwen3") for attn in ("sdpa", "eager") for mode in modes
             for sp in (False, True) for vp in (False, True)]
    res = o.run_tp(2, cases, peak_cases=[])
    print("| case (model, attention, precision, sp, vocab-parallel) | measured rank 0 | rank 1 | predicted |")
    print("|---|---:|---:|---:|")
    for case, ranks in zip(cases, res):
        spec = spec_from_config(transformers.AutoConfig.for_model(case[0], **o.BASE).to_dict(), name="tiny",
                                source="test")
        c, p = modes[case[2]]
        kw = dict(tp=2, sp=case[3], vocab_parallel=case[4])
        act = activation_bytes(spec, micro_batch=o.B, seq=o.S, compute_dtype_bytes=c, param_dtype_bytes=p,
                               profile="eager" if case[1] == "eager" else "hf", **kw)
        head = logits_bytes(spec, o.B, o.S, compute_dtype_bytes=c, param_dtype_bytes=p, **kw)
        pred = act.total_bytes + head.saved_bytes
        print(f"| {' '.join(map(str, case))} | {ranks[0]['saved']:,} | {ranks[1]['saved']:,} | {pred:,} |")


if __name__ == "__main__":
    table()
    if "--oracle" in sys.argv:
        print()
        oracle()
