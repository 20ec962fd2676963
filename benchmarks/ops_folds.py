"""Old vs new: a snapshot of every figure the calculator prints, to compare two trees byte for byte.

``snapshot OUT.json`` records, for all 41 catalog configs: ``repr(count_flops(...))`` (both causal conventions,
recompute none/selective/full, four batch × seq, Gated DeltaNet / Mamba-2 chunk overrides); the cache tree at tp
1/2/8 where the layout is valid × five cache formats × five contexts × batch 1 and 3; ``kv_bytes_per_token`` and
``grows_with_context``; the output of three ``trainmath infer`` commands per model (with ``--gpu``: the largest
batch and context searches); serve's ``calc`` for six models; and the saved-bytes trees (``activation_bytes``, three
precisions × two expert paths × tp 1/2 × two lengths × recompute none/selective) that the emitters also feed;
``trainmath params --json``; ``trainmath memory --json --timeline`` under eight layouts (DDP buckets, ZeRO-1/2 ours
and DeepSpeed's, FSDP2 ZeRO-2/3, TP+SP, recompute, eager experts, megatron profile); one ``trainmath plan --json``
and one ``trainmath estimate --json`` per model; and ``plans``: the planner at scale (``trainmath plan --json``
for Llama-3.1-70B on 1024 and 4096 GPUs, Qwen3-30B-A3B on 256, DeepSeek-V3 on 2048, Qwen3-32B on 512, with
--gpus auto and --deadline, --peft lora, --uneven-stages and a case where nothing fits).
``snapshot OUT.json plans`` records only that section (a few seconds per case).
``compare OLD.json NEW.json`` prints, per section, how many cases are equal to the byte.
Run on the tree before a change and after it (``PYTHONPATH=<old tree>/src python benchmarks/ops_folds.py snapshot
old.json``; the same with the new tree; then ``compare``). Pure calculator, about a minute per snapshot on one core.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from trainmath.cli import main
from trainmath.errors import TrainmathError
from trainmath.flops import count_flops
from trainmath.infer import CacheFormat, cache_tree, kv_bytes_per_token
from trainmath.infer.kv import grows_with_context
from trainmath.infer.weights import validate_tp
from trainmath.memory.activations import activation_bytes
from trainmath.sources import catalog_index, load_spec

FORMATS = {"default": CacheFormat(), "expanded": CacheFormat(mla_cache="expanded"),
           "window": CacheFormat(sliding_tokens="window"), "k-1": CacheFormat(conv_tokens="kernel-1"),
           "fp8": CacheFormat(kv_dtype="fp8", conv_dtype="fp32", state_dtype="bf16")}
SERVE = ("Qwen/Qwen3-8B", "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-Next-80B-A3B-Thinking", "google/gemma-3-1b-it",
         "nvidia/Nemotron-H-56B-Base-8K", "openai/gpt-oss-20b")


def _cli(argv: list[str]) -> tuple[int, str]:
    f = io.StringIO()
    with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, f.getvalue()


def _flops(m: str, spec) -> dict:
    out = {}
    for causal in ("executed", "half"):
        for rec in ("none", "selective", "full"):
            for b, s in ((1, 64), (2, 1000), (3, 4096), (1, 131072)):
                if rec == "none" or (b, s) == (2, 1000):
                    out[f"{m}|{causal}|{rec}|{b}|{s}"] = repr(count_flops(spec, batch=b, seq=s, causal=causal,
                                                                         recompute=rec))
    if spec.model_type in ("qwen3_next", "nemotron_h"):
        out[f"{m}|chunks"] = repr(count_flops(spec, batch=2, seq=700, gdn_chunk=32, mamba_chunk=64))
    return out


def _cache(m: str, spec, out: dict) -> None:
    for tp in (1, 2, 8):
        try:
            validate_tp(spec, tp)
        except TrainmathError:
            continue
        for name, fmt in FORMATS.items():
            out["per_token"][f"{m}|{tp}|{name}"] = kv_bytes_per_token(spec, fmt=fmt, tp=tp)
            out["grows"][f"{m}|{tp}|{name}"] = grows_with_context(spec, fmt)
            for context in (1, 3, 100, 4097, 131072):
                for b in (1, 3):
                    out["cache"][f"{m}|{tp}|{name}|{context}|{b}"] = repr(
                        cache_tree(spec, batch=b, context=context, fmt=fmt, tp=tp).to_dict())


def _memory(m: str, spec) -> dict:
    out = {}
    for c, p in ((2, 2), (2, 4), (4, 4)):
        for experts in ("eager", "grouped"):
            for tp in (1, 2):
                for seq in (100, 512):
                    for rec in ("none", "selective"):
                        key = f"{m}|{c}{p}|{experts}|{tp}|{seq}|{rec}"
                        try:
                            out[key] = repr(activation_bytes(spec, micro_batch=2, seq=seq, compute_dtype_bytes=c,
                                                             param_dtype_bytes=p, experts=experts, tp=tp,
                                                             recompute=rec).tree())
                        except TrainmathError as e:
                            out[key] = f"error: {e}"
    return out


MEMORY = (["--micro-batch", "1", "--seq", "256"],
          ["--micro-batch", "2", "--seq", "512", "--dp", "4", "--bucket-view", "--grad-lifetime", "zero"],
          ["--micro-batch", "1", "--seq", "512", "--dp", "8", "--zero", "1", "--zero-impl", "trainmath"],
          ["--micro-batch", "1", "--seq", "512", "--dp", "8", "--zero", "2", "--zero-impl", "deepspeed",
           "--precision", "bf16", "--optimizer", "sgd-momentum"],
          ["--micro-batch", "1", "--seq", "512", "--dp", "8", "--zero", "3", "--recompute", "full"],
          ["--micro-batch", "1", "--seq", "512", "--dp", "4", "--zero", "2", "--zero-impl", "fsdp2",
           "--experts", "eager", "--device", "cpu"],
          ["--micro-batch", "1", "--seq", "1024", "--tp", "2", "--sp", "--vocab-parallel", "--recompute",
           "selective", "--gpu", "h100"],
          ["--micro-batch", "1", "--seq", "2048", "--profile", "megatron", "--dp", "2", "--zero", "1"])


def _commands(m: str) -> dict:
    out = {}
    argvs = [["params", m, "--json"]] + [["memory", m, *a, "--json", "--timeline"] for a in MEMORY]
    argvs += [["plan", m, "--gpus", "16", "--gpu", "h100", "--seq", "4096", "--global-batch", "64", "--json",
               "--top", "5"],
              ["estimate", m, "--gpus", "16", "--gpu", "h100", "--seq", "4096", "--global-batch", "64", "--json"]]
    for argv in argvs:
        out[" ".join(argv)] = _cli(argv)
    return out


PLANS = (["meta-llama/Llama-3.1-70B", "--gpus", "4096", "--gpu", "h100", "--seq", "8192", "--global-batch", "1024"],
         ["meta-llama/Llama-3.1-70B", "--gpus", "4096", "--gpu", "h100", "--seq", "8192", "--global-batch", "2048"],
         ["meta-llama/Llama-3.1-70B", "--gpus", "1024", "--gpu", "h100", "--seq", "8192", "--global-batch", "1024"],
         ["meta-llama/Llama-3.1-70B", "--gpus", "64", "--gpu", "h100", "--seq", "4096", "--global-batch", "256",
          "--top", "10"],
         ["Qwen/Qwen3-30B-A3B", "--gpus", "256", "--gpu", "h100", "--seq", "4096", "--global-batch", "512"],
         ["Qwen/Qwen3-30B-A3B", "--gpus", "256", "--gpu", "h100", "--seq", "4096", "--global-batch", "1024",
          "--precision", "fp8"],
         ["deepseek-ai/DeepSeek-V3", "--gpus", "2048", "--gpu", "h100", "--seq", "4096", "--global-batch", "2048"],
         ["Qwen/Qwen3-32B", "--gpus", "512", "--gpu", "h100", "--seq", "4096", "--global-batch", "1024"],
         ["meta-llama/Llama-3.1-405B", "--gpus", "2048", "--gpu", "h100", "--seq", "8192", "--global-batch", "1024",
          "--uneven-stages"],
         ["meta-llama/Llama-3.1-70B", "--gpus", "8", "--gpu", "h100", "--seq", "8192", "--global-batch", "64"],
         ["meta-llama/Llama-3.1-70B", "--gpus", "256", "--gpu", "a100-80gb", "--seq", "4096", "--global-batch",
          "512", "--profile", "hf", "--optimizer", "adamw8bit"],
         ["meta-llama/Llama-3.1-70B", "--gpu", "h100", "--seq", "8192", "--global-batch", "1024", "--tokens", "15T",
          "--deadline", "30d"],
         ["Qwen/Qwen3-8B", "--gpus", "auto", "--gpu", "h100", "--seq", "4096", "--global-batch", "256", "--tokens",
          "100B", "--deadline", "3d"],
         ["meta-llama/Llama-3.1-8B", "--gpus", "8", "--gpu", "h100", "--seq", "4096", "--global-batch", "64",
          "--peft", "lora", "--lora-rank", "16", "--lora-targets", "all-linear", "--top", "3"])


def _plans() -> dict:
    out = {}
    for argv in PLANS:
        for fmt in (["--json"], []):
            cmd = ["plan", *argv, *fmt]
            out[" ".join(cmd)] = _cli(cmd)
    return out


def snapshot(path: str, only: str | None = None) -> None:
    from trainmath.serve.app import calc

    if only == "plans":
        out = {"plans": _plans()}
        with open(path, "w") as f:
            json.dump(out, f)
        print({k: len(v) for k, v in out.items()})
        return
    out: dict[str, dict] = {k: {} for k in ("flops", "cache", "per_token", "grows", "cli", "serve", "memory",
                                                    "commands")}
    for m in sorted(catalog_index()):
        spec = load_spec(m)
        out["flops"].update(_flops(m, spec))
        _cache(m, spec, out)
        for argv in (["infer", m, "--batch", "2", "--context", "5000"],
                     ["infer", m, "--batch", "8", "--context", "32768", "--gpu", "h100", "--json"],
                     ["infer", m, "--batch", "4", "--context", "8192", "--tp", "8", "--gpu", "h100"]):
            out["cli"][" ".join(argv)] = _cli(argv)
        out["memory"].update(_memory(m, spec))
        out["commands"].update(_commands(m))
    for m in SERVE:
        out["serve"][m] = json.dumps(calc({"model": m, "micro-batch": "1", "seq": "1024", "serve-batch": "4",
                                           "context": "70000", "gpu": "h100"}), sort_keys=True)
    out["plans"] = _plans()
    with open(path, "w") as f:
        json.dump(out, f)
    print({k: len(v) for k, v in out.items()})


def compare(old_path: str, new_path: str) -> int:
    with open(old_path) as f:
        old = json.load(f)
    with open(new_path) as f:
        new = json.load(f)
    print("| section | cases | equal to the byte |\n|---|---:|---:|")
    differ = 0
    for sec, cases in old.items():
        if sec not in new:
            continue  # a partial snapshot (``snapshot OUT.json plans``) is compared on its sections only
        eq = sum(1 for k, v in cases.items() if new[sec].get(k) == v)
        differ += len(cases) - eq
        print(f"| {sec} | {len(cases)} | {eq} |")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "snapshot" and sys.argv[3:] in ([], ["plans"]):
        snapshot(sys.argv[2], *sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit("usage: python benchmarks/ops_folds.py snapshot OUT.json [plans] | compare OLD.json NEW.json")
