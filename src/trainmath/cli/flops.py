"""``trainmath flops MODEL --batch B --seq S``: GEMM FLOPs of one training step, per component and per GEMM,
with the 6N + attention closed form beside it."""

from __future__ import annotations

import argparse
import json

from trainmath.args import add_strict, config_json, config_lines, count, positions_warning, tokens
from trainmath.vocabulary import RECOMPUTE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "flops",
        help="training FLOPs per GEMM: forward, backward, recompute; per token, sequence and step",
        description="FLOPs of one training step (forward + backward + recompute) of BATCH sequences of SEQ tokens, "
                    "counted per GEMM (2·m·k·n) as torch.utils.flop_counter counts them, with the 6N + attention "
                    "closed form beside it. MODEL is a config.json path, a directory holding one, a catalog name "
                    "(see `trainmath models`) or a Hub repo id.",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--batch", type=count(), default=1, help="sequences per step (default 1)")
    p.add_argument("--seq", type=count(), required=True, help="tokens per sequence")
    p.add_argument("--causal", choices=("executed", "half"), default="executed",
                   help="attention products: 'executed' counts all s×s as eager attention runs them (default); "
                        "'half' only the causally attended pairs")
    p.add_argument("--recompute", choices=RECOMPUTE, default="none",
                   help="activation recomputation: none (default), selective (torchtitan's op-level policy: "
                        "the linears it does not cache, every 2nd mm), full (every layer)")
    p.add_argument("--checkpoint", choices=("megatron", "torch"), default="megatron",
                   help="what --recompute full runs again: megatron (default) the whole layer forward; torch "
                        "(transformers' gradient checkpointing) stops before a layer's last Linear when nothing "
                        "after it saves a tensor")
    p.add_argument("--mamba-chunk", type=count(), default=None,
                   help="Mamba-2 SSD chunk length (default: the config's chunk_size, else transformers' 128)")
    p.add_argument("--gemms", action="store_true", help="also list every GEMM of each layer type")
    p.add_argument("--tokens", type=tokens, default=None,
                   help="token budget (1T, 300B, ...): total training FLOPs = per-token FLOPs at this --seq × tokens")
    p.add_argument("--json", action="store_true", help="print one JSON object with exact integers")
    add_strict(p)
    from trainmath.adapters import add_peft_args

    add_peft_args(p)
    p.add_argument("--input-grads", choices=("on", "off"), default=None,
                   help="with --peft: enable_input_require_grads() (layer 0 computes its input's gradient; default "
                        "on with --recompute full, as peft does for gradient checkpointing, off otherwise)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainmath.adapters import peft_from_args
    from trainmath.errors import TrainmathError
    from trainmath.flops import closed_form_flops, count_flops
    from trainmath.sources import load_spec

    job = peft_from_args(args)
    if args.input_grads is not None and not job.enabled:
        raise TrainmathError("--input-grads needs --peft lora or --peft qlora")
    spec = load_spec(args.model, strict=args.strict)
    warning = positions_warning(spec, args.seq, "--seq")
    tuned = None
    if job.enabled:
        from trainmath.flops.peft import peft_flops

        if args.checkpoint != "megatron":
            raise TrainmathError("--peft counts --recompute full as the whole layer again (--checkpoint megatron)")
        ig = args.recompute == "full" if args.input_grads is None else args.input_grads == "on"
        tuned = peft_flops(spec, job, batch=args.batch, seq=args.seq, causal=args.causal, recompute=args.recompute,
                           input_grads=ig)
        report = tuned.report
    else:
        report = count_flops(spec, batch=args.batch, seq=args.seq, causal=args.causal, recompute=args.recompute,
                             mamba_chunk=args.mamba_chunk,  # None: the config's chunk_size, from the spec
                             checkpoint=args.checkpoint)
    closed = closed_form_flops(spec, batch=args.batch, seq=args.seq, causal=args.causal)
    fwd_bwd = report.forward.value + report.backward.value
    budget = token_budget(report, args.tokens) if args.tokens is not None else None
    if args.json:
        out = report.to_dict()
        out["closed_form"] = closed.to_dict()
        out["closed_form"]["ratio_exact_over_closed"] = fwd_bwd / closed.training_flops
        if budget:
            out["budget"] = budget
        if tuned is not None:
            out["peft"] = {"method": job.method, "lora_rank": job.rank, "trainable_params": tuned.trainable_params,
                           "dequant_elements": tuned.dequant_elements}
        out["config"] = config_json(spec)
        out["warnings"] = [warning] if warning else []
        print(json.dumps(out, indent=1))
        return 0
    print(render(spec, report, closed, gemms=args.gemms) + (f"\nwarning: {warning}" if warning else ""))
    if tuned is not None:
        print(f"peft {job.method} r={job.rank}: trainable {tuned.trainable_params:,} params; the closed form above is "
              f"full training's" + (f"; QLoRA dequantises {tuned.dequant_elements:,} weight elements per step (not "
                                    f"FLOPs)" if tuned.dequant_elements else ""))
    if budget:
        print(f"budget: {budget['tokens']:,} tokens at seq {report.seq} = {budget['training_flops']:.4e} training "
              f"FLOPs ({_f(budget['training_flops'])}; exact per-sequence count × {budget['sequences']:,} sequences)")
    return 0


def token_budget(report, tokens_text: str) -> dict:
    """Total training FLOPs for a token budget: the exact per-sequence count × whole sequences (rounded up)."""
    from trainmath.arith import ceil_div
    from trainmath.perf.tokens import parse_tokens

    tokens = tokens_text if isinstance(tokens_text, int) else parse_tokens(tokens_text)
    sequences = ceil_div(tokens, report.seq)
    return {"tokens": tokens, "sequences": sequences,
            "training_flops": report.per_sequence(report.training) * sequences}


def _f(n: float) -> str:
    """FLOPs with SI prefixes (``render.human_flops``): 1.84e15 → '1.84 PFLOP'."""
    from trainmath.render import human_flops

    return human_flops(n)


def _per_token(flops: int, tokens: int) -> str:
    """FLOPs per token: the exact integer when tokens divide the count (they do unless --causal half makes a
    fraction), else to two decimals."""
    whole, rest = divmod(flops, tokens)
    return f"{whole:,}" if rest == 0 else f"{flops / tokens:,.2f}"


def render(spec, report, closed, *, gemms: bool = False) -> str:
    from trainmath.render import table

    fw, bw, rc, tr = report.forward, report.backward, report.recomputed, report.training
    lines = [f"{report.model}  ({spec.model_type}, {spec.num_layers} layers)  batch {report.batch} × seq "
             f"{report.seq} = {report.tokens:,} tokens", ""]
    rows = []
    for c in fw.children:
        b, r = bw.child(c.name).value, rc.child(c.name).value
        if c.value == 0 and not c.note:
            continue
        rows.append([c.name, f"{c.value:,}", f"{b:,}", f"{r:,}", f"{c.value + b + r:,}",
                     f"{100 * (c.value + b + r) / tr.value:.1f}%" if tr.value else "-", c.note])
    rows.append(["total", f"{fw.value:,}", f"{bw.value:,}", f"{rc.value:,}", f"{tr.value:,}", "100.0%", ""])
    lines.append(table(["component", "forward", "backward", "recompute", "step", "share", "note"], rows,
                       align="lrrrrrl"))
    lines.append("")
    per = [["forward", fw], ["backward", bw], ["recompute", rc], ["training", tr]]
    lines.append(table(["FLOPs", "per step", "per sequence", "per token", "per step (SI)"],
                       [[n, f"{x.value:,}", f"{report.per_sequence(x):,}", _per_token(x.value, report.tokens),
                         _f(x.value)] for n, x in per]))
    lines.append("")
    ratio = (fw.value + bw.value) / closed.training_flops if closed.training_flops else float("nan")
    lines.append(f"closed form 6N + attention: N = {closed.matmul_params:,} (activated, no input embedding), "
                 f"6N = {6 * closed.matmul_params:,}/token, attention {closed.attention_flops_per_token:,.0f}"
                 f"/token → {closed.training_flops:,.0f} per step; forward + backward / closed form = {ratio:.6f}")
    if gemms:
        for lt in report.layer_types:
            lines += ["", f"{lt.label} × {len(lt.layers)} layers: forward GEMMs per layer"]
            lines.append(table(["GEMM", "m", "k", "n", "count", "forward FLOPs"],
                               [[g.name, g.m, g.k, g.n, g.count, f"{g.flops:,}"] for g in lt.gemms],
                               indent="  "))
        lines += ["", "head"]
        lines.append(table(["GEMM", "m", "k", "n", "count", "forward FLOPs"],
                           [[g.name, g.m, g.k, g.n, g.count, f"{g.flops:,}"] for g in report.head], indent="  "))
    lines.append("")
    for note in report.notes:
        lines.append(f"note: {note}")
    lines.extend(config_lines(spec))
    lines.append("conventions: " + "; ".join(report.conventions))
    lines.append("units: FLOP counts are exact integers; Y/Z/E/P/T/G/M/K = 1e24/1e21/1e18/1e15/1e12/1e9/1e6/1e3")
    return "\n".join(lines)
