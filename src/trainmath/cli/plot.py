"""``trainmath plot KIND ... -o FILE``: pictures of parameters, memory, collectives, a step's timeline and the
planner's candidates (PNG, SVG or PDF by the suffix; matplotlib is imported only when a chart is drawn).

``trainmath plot MODEL... -o FILE`` (no KIND) is ``plot params``, as before the subcommands existed.
"""

from __future__ import annotations

import argparse

from trainmath.args import add_strict, count

KINDS = ("params", "memory", "comm", "timeline", "plan", "latency")


class _KindOrParams(argparse._SubParsersAction):
    """Subcommands where a first word that is no KIND means ``params`` (``plot MODEL... -o FILE``)."""

    class _Any:
        """The choices argparse checks a first word against: every word passes; ``__call__`` decides."""

        def __init__(self, names: dict) -> None:
            self.names = names

        def __contains__(self, key) -> bool:
            return True

        def __iter__(self):
            return iter(self.names)

        def items(self):
            return self.names.items()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.choices = self._Any(self._name_parser_map)

    def __call__(self, parser, namespace, values, option_string=None):
        if values and values[0] not in self._name_parser_map:
            values = ["params", *values]
        super().__call__(parser, namespace, values, option_string)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="charts: parameter shares, memory per GPU, bus bandwidth, step timeline, plan "
                                    "(needs matplotlib)",
                       description="Charts of trainmath's results, written as PNG, SVG or PDF (by the suffix of "
                                   "-o). `trainmath plot MODEL... -o FILE` is `plot params`. Needs matplotlib: "
                                   'pip install "trainmath[plot]".')
    p.register("action", "kind_or_params", _KindOrParams)
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True, action="kind_or_params")

    def out(q: argparse.ArgumentParser) -> None:
        q.add_argument("--output", "-o", required=True, help="file to write (.png, .svg or .pdf)")
        q.set_defaults(func=run)

    q = kinds.add_parser("params", help="stacked shares of embedding, attention, FFN/MoE and others per model",
                         description="One stacked bar per model: the shares of Embedding, Attention, FFN or MoE "
                                     "and Others (the groups of Jiang Yi's blog series), counts labelled.")
    q.add_argument("models", metavar="MODEL", nargs="+")
    q.add_argument("--activated", action="store_true",
                   help="a second bar per model: the shares of the parameters activated per token")
    add_strict(q)
    out(q)

    from trainmath.report.options import add_training_flags

    q = kinds.add_parser("memory", help="per-GPU training memory, one stacked bar per recompute setting or ZeRO stage",
                         description="Training memory per GPU as stacked bars (the terms of `trainmath memory`), one "
                                     "bar per recompute setting (default) or ZeRO stage, with --gpu's capacity.")
    q.add_argument("model", metavar="MODEL")
    add_training_flags(q)
    q.add_argument("--compare", choices=("recompute", "zero", "none"), default="recompute",
                   help="one bar per recompute setting (default), per ZeRO stage, or the setup alone")
    q.add_argument("--layout", action="append", default=[], metavar="DEGREES", dest="layouts",
                   help="one bar per layout instead, e.g. --layout dp=8,zero=1 --layout dp=4,ep=2,zero=3 "
                        "(degrees not named keep the flags' values)")
    add_strict(q)
    out(q)

    q = kinds.add_parser("comm", help="bus bandwidth vs message size from `comm bench --json` files",
                         description="Bus bandwidth against message size, measured and predicted, one line pair "
                                     "per implementation, from files written by `trainmath comm bench --json`.")
    q.add_argument("results", metavar="RESULTS.json", nargs="+")
    out(q)

    q = kinds.add_parser("timeline", help="live memory through one training step from a memory --timeline JSON",
                         description="Live bytes through one step (forward, loss, backward, optimizer), phases "
                                     "shaded and the peak marked, from a JSON list of {event, bytes}.")
    q.add_argument("memory_json", metavar="MEMORY.json")
    out(q)

    from trainmath.cli.estimate import add_job_arguments

    q = kinds.add_parser("plan", help="the planner's candidates: memory per GPU vs step time, winners highlighted",
                         description="Memory per GPU against step time of the planner's candidates, the best "
                                     "highlighted, and their step-time breakdown. `plot plan MODEL --gpus N --gpu "
                                     "NAME --seq S --global-batch G [plan flags]` runs the planner (the flags of "
                                     "`trainmath plan`); `plot plan PLAN.json` draws a file `trainmath plan --json` "
                                     "wrote (with --explain, the candidates memory rejected are drawn too).")
    q.add_argument("source", metavar="MODEL|PLAN.json",
                   help="a model (with the job flags) or a file written by `trainmath plan --json`")
    add_job_arguments(q, model=False, required=False, printing=False)
    q.add_argument("--top", type=count(1, 10_000), default=20,
                   help="layouts the planner ranks (MODEL form; default 20)")
    q.add_argument("--highlight", type=count(1, 10_000), default=5, help="best layouts to highlight (default 5)")
    out(q)

    from trainmath.cli.latency_plot import add_latency

    add_latency(kinds, out)


def _read_json(path: str):
    from trainmath.jsonfile import read_json_file

    return read_json_file(path)


def charts(args: argparse.Namespace):
    """The chart objects to draw (every input read and checked before matplotlib is imported)."""
    from trainmath.plot import charts as ch
    from trainmath.plot import fromjson
    from trainmath.sources import load_spec

    if args.kind == "params":
        from trainmath.params import count_params

        return [ch.params_chart([count_params(load_spec(m, strict=args.strict)) for m in args.models],
                                activated=args.activated)]
    if args.kind == "memory":
        from trainmath.report.gather import memory_variants
        from trainmath.report.options import training_from_args

        setup, layout, gpu = training_from_args(args)
        spec = load_spec(args.model, strict=args.strict)
        title = f"Training memory per GPU: {spec.name.split('/')[-1]}, {setup.micro_batch} × {setup.seq} tokens"
        variants = memory_variants(spec, setup, layout, args.compare, tuple(args.layouts))
        return [ch.memory_chart(variants, title=title, gpu=gpu)]
    if args.kind == "comm":
        rows = []
        for path in args.results:
            doc = _read_json(path)
            rows.extend(doc if isinstance(doc, list) else [doc])
        return [fromjson.comm_chart(rows)]
    if args.kind == "timeline":
        return [fromjson.timeline_chart(_read_json(args.memory_json))]
    if args.kind == "latency":
        from trainmath.cli.latency_plot import latency

        return latency(args)
    return list(fromjson.plan_charts(_plan_document(args), top=args.highlight))


def _plan_document(args: argparse.Namespace) -> dict:
    """``plot plan``'s input: with none of the job flags, the PLAN.json file; with any, the planner's own
    ``plan --json --explain`` document for MODEL (every job flag then required)."""
    from trainmath.cli.estimate import JOB_REQUIRED
    from trainmath.errors import TrainmathError

    given = [k for k in JOB_REQUIRED if getattr(args, k) is not None]
    if not given:
        return _read_json(args.source)
    missing = [f"--{k.replace('_', '-')}" for k in JOB_REQUIRED if k not in given]
    if missing:
        raise TrainmathError(f"plot plan MODEL needs {', '.join(missing)} (or give a PLAN.json and no job flags)")
    from trainmath.cli.plan import document, search

    args.model = args.source
    result, _ = search(args)
    return document(result, explain=True)


def run(args: argparse.Namespace) -> int:
    from trainmath.plot.output import check_output

    path = check_output(args.output, (".png", ".svg", ".pdf"))
    drawn = charts(args)  # every model and file is read before anything is written
    from trainmath.plot import mpl

    mpl.save(mpl.figure(drawn), path)
    print(f"wrote {path}")
    return 0
