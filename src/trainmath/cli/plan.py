"""``trainmath plan MODEL --gpus N --gpu NAME --seq S --global-batch G``: the fastest layouts that fit, and why
the others were dropped."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    from trainmath.args import count, number
    from trainmath.cli.estimate import add_job_arguments

    p = sub.add_parser(
        "plan",
        help="search DP×TP×PP×CP×EP, ZeRO, recompute, micro-batch and virtual stages for the fastest layouts "
             "that fit",
        description="Enumerates every layout of the GPUs (degrees, ZeRO stage, recompute, micro-batch, virtual "
                    "stages), drops those that cannot be built or do not fit the GPU's memory, and ranks the rest "
                    "by step time (the model of `trainmath estimate`). Exit 1 when nothing fits, with the closest "
                    "candidates and what they lack. With --peft lora|qlora, the layouts a fine-tune is modelled on "
                    "(one device, DDP, ZeRO-1/2; the rest rejected with the reason), timed as `estimate --peft`.",
    )
    add_job_arguments(p, gpus_auto=True, offload_auto=True)
    p.add_argument("--deadline", default=None, metavar="DURATION",
                   help="how many GPUs: the fewest (multiples of the node) whose best layout trains --tokens within "
                        "this time (30d, 12h, 90m)")
    p.add_argument("--budget", type=number(0, 1e15), default=None, metavar="DOLLARS",
                   help="how many GPUs: the fastest layout whose cost on --tokens stays within this amount (needs "
                        "--price-per-gpu-hour)")
    p.add_argument("--top", type=count(1, 10_000), default=5, help="layouts to show (default 5)")
    p.add_argument("--uneven-stages", action="store_true",
                   help="also try pp not dividing the layers: the even split (stages one layer apart) and "
                        "Megatron-LM's lighter first and last stages (--decoder-first/last-pipeline-num-layers)")
    p.add_argument("--explain", action="store_true", help="also list every rejected candidate with its reason")
    p.add_argument("--fit-profiles", default=None, metavar="P[,P]",
                   help="activation profiles every recommended layout must fit under (default: --profile and hf "
                        "where transformers' saved tensors are modelled for the family; the larger peak is shown)")
    p.set_defaults(func=run)


def search(args: argparse.Namespace):
    """(PlanResult, token budget or None) of the job flags (shared with ``plot plan MODEL``)."""
    from trainmath.cli.estimate import load
    from trainmath.plan import plan

    spec, gpu, hw, job, tokens = load(args)
    kw = dict(gpus=args.gpus, gpu=gpu, job=job, gpus_per_node=args.gpus_per_node, top=args.top, hardware=hw,
              fit_profiles=_profiles(args))
    if getattr(args, "offload", "none") == "auto":
        from trainmath.plan.offload import plan_offload

        return plan_offload(spec, **kw), tokens
    return plan(spec, **kw), tokens


def document(result, *, explain: bool, tokens: int | None = None, price: float | None = None) -> dict:
    """The object ``plan --json`` prints (and ``plot plan`` draws)."""
    out = result.to_dict()
    if tokens and result.layouts:
        for d, e in zip(out["layouts"], result.layouts):
            d["budget"] = e.budget(tokens, price)
    if explain:
        out["rejected_list"] = [{**_row_dict(r), "reason": r.reason, "detail": r.detail, "count": r.count,
                                 "peak_bytes": r.peak_bytes, "step_time_s": r.step_time_s}
                                for r in result.rejected_list]
    return out


def sizing(args: argparse.Namespace):
    """The how-many-GPUs answer (``plan.sizing.Sizing``) when --gpus is auto or --deadline/--budget is given,
    else None."""
    from trainmath.errors import TrainmathError

    auto = args.gpus == "auto" or (args.gpus is None and (args.deadline is not None or args.budget is not None))
    if args.gpus is None and not auto:
        raise TrainmathError("--gpus is required: a GPU count, or auto with --deadline or --budget")
    if not auto:
        if args.deadline is not None or args.budget is not None:
            raise TrainmathError("--deadline and --budget choose the GPU count: pass --gpus auto (or leave it out)")
        return None
    from trainmath.cli.estimate import load
    from trainmath.plan.sizing import check_goal, parse_duration, size

    if getattr(args, "offload", "none") == "auto":
        raise TrainmathError("--offload auto is not searched when the planner sizes the GPU count: name one mode "
                             "(none, optimizer or params)")

    deadline = parse_duration(args.deadline) if args.deadline is not None else None
    tokens_text = args.tokens
    if tokens_text is None:
        check_goal(None, deadline, args.budget, args.price_per_gpu_hour)
    args.gpus = 1  # load()'s checks of the other flags
    spec, gpu, hw, job, tokens = load(args)
    return size(spec, gpu=gpu, job=job, tokens=tokens, deadline_s=deadline, budget=args.budget,
                price_per_gpu_hour=args.price_per_gpu_hour, hardware=hw, top=args.top,
                fit_profiles=_profiles(args)), tokens


def _profiles(args):
    text = getattr(args, "fit_profiles", None)  # `plot plan MODEL` shares the job flags, not this one
    return None if text is None else tuple(p for p in text.split(",") if p)


def run(args: argparse.Namespace) -> int:
    sized = sizing(args)
    if sized is not None:
        s, tokens = sized
        if args.json:
            doc = document(s.result, explain=args.explain, tokens=tokens, price=args.price_per_gpu_hour) \
                if s.result else {}
            print(json.dumps({**doc, "sizing": s.to_dict()}, indent=1))
        else:
            print(render_sizing(s, tokens=tokens, price=args.price_per_gpu_hour, explain=args.explain))
        return 0 if s.gpus else 1
    result, tokens = search(args)
    if args.json:
        print(json.dumps(document(result, explain=args.explain, tokens=tokens, price=args.price_per_gpu_hour),
                         indent=1))
    else:
        print(render(result, explain=args.explain, tokens=tokens, price=args.price_per_gpu_hour))
    return 0 if result.layouts else 1


def _row_dict(r) -> dict:
    lay = r.layout
    return {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "sp": lay.sp, "zero": lay.zero,
            "micro_batch": r.micro_batch or None, "recompute": r.recompute, "virtual_stages": r.virtual_stages or None,
            "first_stage_layers": lay.first_stage_layers, "last_stage_layers": lay.last_stage_layers}


def pp_cell(lay) -> str:
    """pp, and Megatron-LM's first/last stage layers when set (``16:7..7``)."""
    if lay.stage_split == (None, None):
        return str(lay.pp)
    first, last = lay.stage_split
    return f"{lay.pp}:{'' if first is None else first}..{'' if last is None else last}"


def render(result, *, explain: bool = False, tokens: int | None = None, price: float | None = None) -> str:
    from trainmath.render import human_bytes, table

    lines = [f"{result.model} on {result.gpus} × {result.gpu} ({result.gpus_per_node} per node): "
             f"{result.candidates:,} candidates, {result.memory_checks} memory-model checks", ""]
    head = ["#", "dp", "tp", "pp", "cp", "ep", "zero", "mb", "v", "recompute", "step s", "tokens/s", "TFLOP/s/GPU",
            "MFU", "memory"]
    offloaded = any(e.offload is not None for e in result.layouts)
    if offloaded:
        head += ["offload", "host/node"]
    if result.layouts:
        rows = []
        for i, e in enumerate(result.layouts, 1):
            lay, job = e.layout, e.job
            rows.append([i, lay.dp, lay.tp, pp_cell(lay), lay.cp, lay.ep, lay.zero, job.micro_batch, job.virtual_stages,
                         job.recompute, f"{e.step_time_s:.3f}", f"{e.tokens_per_s:,.0f}", f"{e.tflops_per_gpu:.1f}",
                         f"{100 * e.mfu:.1f}%", human_bytes(e.peak_bytes)]
                        + ([job.offload, human_bytes(e.offload["host_bytes"]) if e.offload else "-"] if offloaded
                           else []))
        lines.append(table(head, rows))
        best = result.layouts[0]
        lines += ["", "fastest, step breakdown (s): " + ", ".join(f"{k} {v:.3f}" for k, v in best.breakdown.items()
                                                                  if v > 0)]
        if tokens:
            b = best.budget(tokens, price)
            cost = f", cost {b['cost']:,.0f}" if "cost" in b else ""
            lines.append(f"fastest on {tokens:,} tokens: {b['days']:,.2f} days, {b['gpu_hours']:,.0f} GPU-hours{cost}")
    else:
        lines.append(f"no layout fits in {human_bytes(result.usable_bytes)} per GPU. closest (smallest memory need):")
        rows = [[r.layout.dp, r.layout.tp, r.layout.pp, r.layout.cp, r.layout.ep, r.layout.zero, r.micro_batch or "*",
                 r.virtual_stages or "*", r.recompute, human_bytes(r.peak_bytes),
                 human_bytes(r.peak_bytes - result.usable_bytes), r.reason] for r in result.closest]
        lines.append(table(["dp", "tp", "pp", "cp", "ep", "zero", "mb", "v", "recompute", "needs", "lacks", "why"],
                           rows, align="rrrrrrrrlrrl"))
    lines += ["", "rejected:"]
    lines += [f"  {n:>8,}  {reason}" for reason, n in sorted(result.rejected.items(), key=lambda kv: -kv[1])]
    if explain:
        lines += ["", "every rejected candidate ('*': all options of that layout):"]
        rows = [[r.layout.dp, r.layout.tp, r.layout.pp, r.layout.cp, r.layout.ep, r.layout.zero,
                 r.micro_batch or "*", r.virtual_stages or "*", r.recompute, r.count, r.detail]
                for r in result.rejected_list]
        lines.append(table(["dp", "tp", "pp", "cp", "ep", "zero", "mb", "v", "recompute", "n", "reason"], rows,
                           align="rrrrrrrrlrl"))
    if result.layouts:
        lines += [""] + [f"convention: {c}" for c in result.layouts[0].conventions]
    lines.append(result.fit_rule)
    lines.append(f"fit: every layout's peak fits under the {' and the '.join(result.fit_profiles)} activation "
                 f"profile{'s' if len(result.fit_profiles) > 1 else ''} (memory column: the larger peak)")
    lines.append(f"search (--peft): {result.search}" if result.search else
                 "search: tp within a node, sp on whenever tp > 1, cp while each rank keeps >= 1024 tokens; "
                 "micro-batch 1/2/4/8, virtual stages 1/2/4, ZeRO 0-3, recompute none/selective/full")
    return "\n".join(lines)


def render_sizing(s, *, tokens: int, price: float | None, explain: bool = False) -> str:
    """The how-many-GPUs answer: the goal, the search range and every probe, then the plan at the answer."""
    from trainmath.render import table

    what = (f"the fewest GPUs that train {tokens:,} tokens within {s.deadline_s / 86400:,.2f} days"
            if s.goal == "deadline" else
            f"the fastest layout that trains {tokens:,} tokens within a budget of {s.budget:,.0f} at "
            f"{s.price_per_gpu_hour:g}/GPU-hour")
    if s.goal == "deadline" and s.budget is not None:
        what += f", at most {s.budget:,.0f}"
    lines = [f"how many GPUs: {what}",
             f"search: multiples of {s.node} GPUs (one node) from {s.search_from:,} to {s.search_to:,}: doubling, then "
             f"bisection; each probe is the planner's best layout at that count (assumes more GPUs never make the "
             f"best layout slower{', nor cheaper' if s.goal == 'budget' else ''})"]
    rows = [[f"{p.gpus:,}", "nothing fits" if p.time_s is None else f"{p.time_s / 86400:,.2f}",
             "" if p.cost is None else f"{p.cost:,.0f}"] for p in s.probes]
    lines.append(table(["GPUs", "days", "cost"], rows, align="rrr"))
    lines.append("")
    if s.gpus is None:
        lines.append(f"no GPU count up to {s.search_to:,} meets the goal")
        return "\n".join(lines)
    lines.append(f"answer: {s.gpus:,} GPUs")
    lines.append(render(s.result, explain=explain, tokens=tokens, price=price))
    return "\n".join(lines)
