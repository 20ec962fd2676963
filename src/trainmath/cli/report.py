"""``trainmath report MODEL [setup flags] -o FILE.html``: one self-contained page to share."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from trainmath.report.options import add_plan_flags, add_serving_flags, add_training_flags

    p = sub.add_parser("report", help="one self-contained HTML page: parameters, FLOPs, memory and fit, KV cache, "
                                      "charts",
                       description="Write one HTML file (inline CSS and SVG, nothing fetched when viewed, printable) "
                                   "with the parameter ledger, the FLOPs of a micro-batch, the training memory per "
                                   "GPU with the fit verdict, the layout, the serving KV cache, the charts and the "
                                   "conventions used. The flags are those of `trainmath memory` and `infer`.")
    p.add_argument("model", metavar="MODEL", help="config.json path, directory, catalog name or Hub id")
    add_training_flags(p)
    add_serving_flags(p)
    add_plan_flags(p)
    from trainmath.adapters import add_peft_args

    add_peft_args(p)
    p.add_argument("--output", "-o", required=True, help="file to write (.html)")
    p.set_defaults(func=run)


def build(args: argparse.Namespace) -> str:
    """The page's HTML for parsed flags (shared with ``serve``'s report link)."""
    from trainmath.adapters import peft_from_args
    from trainmath.args import positions_warning
    from trainmath.report.gather import gather
    from trainmath.report.html import page
    from trainmath.report.options import plan_from_args, serving_from_args, training_from_args
    from trainmath.sources import load_spec

    peft = peft_from_args(args)
    setup, layout, gpu = training_from_args(args)
    serving = serving_from_args(args)
    spec = load_spec(args.model)
    positions_warning(spec, setup.seq, "--seq")  # learned positions: an error, as in flops and memory
    return page(gather(spec, setup, layout, gpu=gpu, serving=serving, plan=plan_from_args(args, spec, setup, gpu),
                       mem_util_percent=args.mem_util, serve_output=args.serve_output, peft=peft,
                       **({} if args.host_memory is None else {"host_memory_bytes": args.host_memory})))


def run(args: argparse.Namespace) -> int:
    from trainmath.plot.output import check_output, write_text_atomic

    path = check_output(args.output, (".html", ".htm"))
    write_text_atomic(path, build(args))
    print(f"wrote {path}")
    return 0
