"""``trainmath plot MODEL... --output FILE``: where the parameters live, one stacked bar per model."""

from __future__ import annotations

import argparse

from trainmath.cli.args import add_strict, config_lines


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot each model's parameter share per component (needs matplotlib)",
                       description="One stacked bar per model: the share of its parameters in each component "
                                   "(embeddings, attention, MLP, experts, ...), as in the first article of Jiang "
                                   "Yi's blog series on distributed training.")
    p.add_argument("models", metavar="MODEL", nargs="+")
    p.add_argument("--output", "-o", required=True, help="file to write (.png, .svg or .pdf)")
    p.add_argument("--activated", action="store_true", help="shares of the parameters activated per token")
    add_strict(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainmath.params import count_params
    from trainmath.plot import plot_components
    from trainmath.sources import load_spec

    specs = [load_spec(m, strict=args.strict) for m in args.models]  # every model is read before anything is written
    reports = [count_params(s) for s in specs]
    path = plot_components(reports, args.output, activated=args.activated)
    for spec in specs:
        for line in config_lines(spec):
            print(f"{spec.name}: {line}")
    print(f"wrote {path}")
    return 0
