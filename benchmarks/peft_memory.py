"""Predicted LoRA step peak (``training_memory(..., peft=...)``, ``--device cpu``) against MemTracker's peak of the
same step of transformers' real code wrapped by peft, at full width on fake tensors (``trainmath.verify.peft_sim``).

Method: per family, its catalog config at full width cut to its first 2 decoder layers (as
``benchmarks/memory_sim.py --families`` does), b = 1, s = 512, LoRA r = 16 on all-linear, fp32 adapters; the loop
``loss = model(ids, labels=ids).loss; loss.backward(); opt.step(); opt.zero_grad()`` (the logits die when the
forward returns), torch's AdamW (foreach) over the adapters, two steps, the second measured; bf16 (base cast before
peft wraps it) or amp-bf16 (fp32 base, forward under ``torch.autocast``, backward after it exits); recompute none
(layer 0 without input gradients) or full (``gradient_checkpointing_enable`` with ``enable_input_require_grads``).
The simulated peak less the module buffers (rotary ``inv_freq``, not modelled) is compared with the prediction.
Target: within 2%. Run: ``python benchmarks/peft_memory.py [--only llama,qwen3] [--seq S] [--moe]``.

``--fsdp W``: rank 0 of a W-rank FSDP2 run instead (``--zero 3 --dp W``; ``trainmath.verify.peft_fsdp``: peft
applied before ``fully_shard`` per decoder layer and at the root, FSDPMemTracker over a fake process group,
for-loop AdamW over the adapters), bf16 with recompute none and full.
"""

from __future__ import annotations

import argparse
import sys
import time

FAMILIES = {"llama": "meta-llama/Llama-3.1-8B", "qwen3": "Qwen/Qwen3-8B", "qwen2": "Qwen/Qwen2.5-7B",
            "mistral": "mistralai/Mistral-7B-v0.3", "olmo2": "allenai/OLMo-2-1124-7B",
            "starcoder2": "bigcode/starcoder2-7b"}
MOE_FAMILIES = {"qwen3_moe": "Qwen/Qwen3-30B-A3B", "mixtral": "mistralai/Mixtral-8x7B-v0.1"}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
"""``--moe``: the routed experts and the router frozen, LoRA on the attention (expert targets are peft's
``target_parameters``, which ``memory --peft`` refuses)."""
CASES = (("bf16", "none"), ("bf16", "full"), ("amp-bf16", "none"))
FSDP_CASES = (("bf16", "none"), ("bf16", "full"))


def case(repo: str, precision: str, recompute: str, *, b: int = 1, s: int = 512, rank: int = 16,
         world: int = 1, targets="all-linear") -> dict:
    from trainmath.adapters import PeftJob
    from trainmath.families import spec_from_config
    from trainmath.layout import ParallelLayout
    from trainmath.memory.peft import PeftRun
    from trainmath.memory.training import TrainingSetup, training_memory
    from trainmath.sources import catalog_entry
    from trainmath.verify.peft_sim import peft_step_peak
    from trainmath.verify.simulate import hf_config

    config = {k: v for k, v in catalog_entry(repo).config.items() if not k.startswith("_")}
    config["num_hidden_layers"] = 2
    config.pop("layer_types", None)
    start = time.perf_counter()
    if world > 1:
        from trainmath.verify.peft_fsdp import peft_fsdp_step_peak

        sim = peft_fsdp_step_peak(hf_config(config), world=world, micro_batch=b, seq=s, precision=precision,
                                  targets=targets if isinstance(targets, str) else list(targets), rank=rank,
                                  recompute=recompute, fake=True)
    else:
        sim = peft_step_peak(hf_config(config), micro_batch=b, seq=s, precision=precision,
                             targets=targets if isinstance(targets, str) else list(targets), rank=rank,
                             recompute=recompute, fake=True)
    seconds = time.perf_counter() - start
    spec = spec_from_config(config, name=repo, source="catalog")
    run = PeftRun(job=PeftJob(method="lora", rank=rank, targets=targets))
    rep = training_memory(spec, TrainingSetup(micro_batch=b, seq=s, precision=precision, device="cpu",
                                              recompute=recompute, loop_keeps="loss", peft=run,
                                              optimizer_impl="forloop" if world > 1 else "foreach"),
                          ParallelLayout(dp=world, zero=3) if world > 1 else ParallelLayout())
    measured = sim["peak_bytes"] - sim["buffers_bytes"]
    return {"model": repo, "precision": precision, "recompute": recompute, "predicted": rep.peak_bytes,
            "measured": measured, "error": (rep.peak_bytes - measured) / measured, "phase": rep.stages[0].phase,
            "trainable": sim["trainable_params"], "seconds": seconds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated families (default: all six)")
    ap.add_argument("--seq", type=int, default=512, help="sequence length (default 512)")
    ap.add_argument("--moe", action="store_true", help="the MoE families, LoRA on the attention")
    ap.add_argument("--fsdp", type=int, default=1, metavar="W", help="rank 0 of W FSDP2 ranks (default: 1 device)")
    args = ap.parse_args(argv)
    table = MOE_FAMILIES if args.moe else FAMILIES
    names = args.only.split(",") if args.only else list(table)
    targets = ATTENTION if args.moe else "all-linear"
    cases = FSDP_CASES if args.fsdp > 1 else CASES
    layout = f"FSDP2 rank 0 of {args.fsdp}" if args.fsdp > 1 else "1 device"
    print(f"| family | model | layout | precision | recompute | trainable | predicted bytes | "
          f"{'FSDPMemTracker' if args.fsdp > 1 else 'MemTracker'} bytes | error | peak event | s |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---|---:|")
    worst = 0.0
    for fam in names:
        for precision, recompute in cases:
            try:
                r = case(table[fam], precision, recompute, world=args.fsdp, s=args.seq, targets=targets)
            except Exception as e:  # a failing family is a row, not a crash
                print(f"| {fam} | {table[fam]} | {layout} | {precision} | {recompute} | error: "
                      f"{type(e).__name__}: {e} |")
                continue
            worst = max(worst, abs(r["error"]))
            print(f"| {fam} | {r['model']} | {layout} | {precision} | {recompute} | {r['trainable']:,} | "
                  f"{r['predicted']:,} | "
                  f"{r['measured']:,} | {100 * r['error']:+.3f}% | {r['phase']} | {r['seconds']:.0f} |", flush=True)
    print(f"\nworst |error|: {100 * worst:.3f}% (target 2%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
