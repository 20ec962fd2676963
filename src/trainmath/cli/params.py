"""``trainmath params MODEL``: the exact parameter ledger of a model."""

from __future__ import annotations

import argparse
import json

from trainmath.args import add_strict, config_json, config_lines


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "params",
        help="exact parameter counts per component, per layer type, and activated per token",
        description="Exact parameter counts of a model from its config.json: total, per component, per layer "
                    "type, activated per token (MoE) and non-embedding. MODEL is a config.json path, a directory "
                    "holding one, a catalog name (see `trainmath models`) or a Hub repo id.",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--json", action="store_true", help="print one JSON object with exact integers")
    p.add_argument("--explain", action="store_true",
                   help="print the formula in the notation of Jiang Yi's blog series on distributed training (N, "
                        "|V|, d, d_ff, h_d, h, h_kv, n, k) with values")
    add_strict(p)
    from trainmath.adapters import add_peft_args

    add_peft_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainmath.adapters import adapter_report, peft_from_args
    from trainmath.params import count_params
    from trainmath.sources import load_spec

    job = peft_from_args(args)
    spec = load_spec(args.model, strict=args.strict)
    report = count_params(spec)
    adapters = adapter_report(spec, job, report.total_params) if job.enabled else None
    if args.json:
        out = report.to_dict()
        if adapters is not None:
            out.update(adapters.to_dict())
        out["config"] = config_json(spec)
        if args.explain:
            from trainmath.explain import explain

            out["explain"] = explain(spec, report)
        print(json.dumps(out, indent=1))
        return 0
    print(render(spec, report, explain=args.explain))
    if adapters is not None:
        print()
        print(render_adapters(adapters))
    return 0


def render_adapters(a) -> str:
    from trainmath.adapters import CONVENTIONS
    from trainmath.render import human_count, table

    j = a.job
    targets = j.targets if isinstance(j.targets, str) else ",".join(j.targets)
    lines = [f"{j.method} adapters: r={j.rank}, alpha={j.lora_alpha}, targets={targets}, dtype={j.dtype}", ""]
    rows = [[m.name, f"{m.in_features:,}", f"{m.out_features:,}", j.rank * m.rank_mult, m.count, f"{p:,}"]
            for m, p in a.modules]
    lines.append(table(["module", "in", "out", "rank", "modules", "adapter params"], rows))
    lines.append("")
    lines.append(f"trainable params      {a.trainable_params:>20,}  ({human_count(a.trainable_params)}, "
                 f"{100 * a.trainable_params / a.total_params:.4f}% of total)")
    lines.append(f"adapter params        {a.adapter_params:>20,}  ({human_count(a.adapter_params)})")
    lines.append(f"total params          {a.total_params:>20,}  ({human_count(a.total_params)}, base + adapters)")
    lines.extend(f"note: {n}" for n in a.notes)
    lines.append("peft conventions: " + "; ".join(CONVENTIONS))
    return "\n".join(lines)


def render(spec, report, *, explain: bool = False) -> str:
    from trainmath.render import human_count, table

    total = report.total_params
    lines = [f"{report.model}  ({report.model_type}, {spec.architecture}, {spec.num_layers} layers)", ""]
    rows = []
    for comp in report.components.children:
        if comp.value == 0 and not comp.note:
            continue
        share = f"{100 * comp.value / total:.1f}%" if total else "-"
        rows.append([comp.name, f"{comp.value:,}", human_count(comp.value), share, comp.note])
        for mod in comp.children:
            if len(comp.children) > 1:
                rows.append([f"  {mod.name}", f"{mod.value:,}", human_count(mod.value), "", ""])
    rows.append(["total", f"{total:,}", human_count(total), "100.0%", ""])
    lines.append(table(["component", "params", "≈", "share", "note"], rows, align="lrrrl"))
    lines.append("")
    lt_rows = [[lt.label, lt.layers, f"{lt.params_per_layer:,}", f"{lt.activated_per_layer:,}", f"{lt.params:,}"]
               for lt in report.layer_types]
    lines.append(table(["layer type", "layers", "params/layer", "activated/layer", "params"], lt_rows))
    lines.append("")
    lines.append(f"total params          {total:>20,}  ({human_count(total)})")
    lines.append(f"activated per token   {report.activated_params:>20,}  ({human_count(report.activated_params)})")
    lines.append(f"non-embedding params  {report.non_embedding_params:>20,}  "
                 f"({human_count(report.non_embedding_params)})")
    for extra in report.extras:
        lines.append(f"not counted: {extra.label}: {extra.params:,} ({extra.why})")
    for note in report.notes:
        lines.append(f"note: {note}")
    lines.extend(config_lines(spec))
    lines.append("conventions: " + "; ".join(report.conventions))
    if explain:
        from trainmath.explain import explain as explain_lines

        lines.append("")
        lines.extend(explain_lines(spec, report))
    return "\n".join(lines)
