"""``python -m torch.distributed.run --nproc_per_node N -m trainmath.cli.demo OP``: a demo of ``trainmath comm demo``
as the ranks of a real torchrun job (torch is imported inside ``main``)."""

from __future__ import annotations

import sys

from trainmath.args import Parser, number
from trainmath.cli.comm import _REDUCE_OPS, DEMO_INFO, MAX_SLEEP_S, MAX_TIMEOUT_S, normalize_demo, render_demo
from trainmath.errors import TrainmathError


def main(argv: list[str] | None = None) -> int:
    """``python -m torch.distributed.run --nproc_per_node N -m trainmath.cli.demo OP``: the demo as the ranks
    of a real torchrun job; rank 0 prints what ``trainmath comm demo OP`` prints."""
    from trainmath.runtime.demo import run_demo
    from trainmath.runtime.launch import run_under_torchrun

    p = Parser(prog="python -m trainmath.cli.demo",
               description="Run a demo of `trainmath comm demo` as the ranks of a torchrun job.")
    p.add_argument("op", help=f"one of: {', '.join(DEMO_INFO)}")
    p.add_argument("--reduce-op", choices=_REDUCE_OPS, default="sum")
    p.add_argument("--sleep", type=number(0, MAX_SLEEP_S, unit="of seconds"), default=1.0)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--timeout", type=number(0, MAX_TIMEOUT_S, exclusive_minimum=True, unit="of seconds"),
                   default=30.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        name = normalize_demo(args.op)
        ctx, records = run_under_torchrun(run_demo, name, {"reduce_op": args.reduce_op, "sleep_s": args.sleep},
                                          backend=args.backend, timeout_s=args.timeout)
    except TrainmathError as e:
        print(f"trainmath: error: {e}", file=sys.stderr)
        return 2
    if ctx.rank == 0:
        print(render_demo(name, records, nnodes=ctx.world_size // ctx.local_world_size, nproc=ctx.local_world_size,
                          backend=args.backend, reduce_op=args.reduce_op, as_json=args.json), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
