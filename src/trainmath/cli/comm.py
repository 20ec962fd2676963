"""``trainmath comm demo|layout|bench|check``: torch.distributed primitives you can run, check and measure.

Top level imports only the standard library and the pure cost model; torch is imported inside the commands.
Arguments are validated before any worker starts, so bad input prints one line and nothing else.
"""

from __future__ import annotations

import argparse
import json

from trainmath.args import count, host, number, port
from trainmath.comm.busbw import OPS
from trainmath.comm.layout import even_ranks, subgroup_table, world_table
from trainmath.comm.sizes import format_size, parse_size, parse_size_range
from trainmath.errors import TrainmathError

# trainmath.runtime.ring.SEGMENT_BYTES, written here so that --help needs no torch (a test keeps them equal).
RING_SEGMENT_DEFAULT = "4M"

# trainmath.runtime.demo.DEMOS without the functions: name -> (minimum ranks, description), so that --help and
# --list need no torch (a test keeps the two equal).
DEMO_INFO = {
    "send_recv": (2, "blocking send from rank 0 to rank 1"),
    "isend_irecv": (2, "non-blocking isend/irecv, then wait()"),
    "scatter": (1, "rank 0's list, one slice to each rank"),
    "broadcast": (1, "rank 0's tensor copied to every rank"),
    "gather": (1, "every rank's tensor collected on rank 0"),
    "reduce": (1, "every rank's tensor reduced onto rank 0 (--reduce-op)"),
    "all_gather": (1, "every rank's tensor collected on every rank"),
    "all_reduce": (1, "every rank's tensor reduced onto every rank (--reduce-op)"),
    "reduce_scatter": (1, "reduce, then rank j keeps slice j (--reduce-op)"),
    "all_to_all": (1, "slice j of every rank goes to rank j"),
    "barrier": (1, "rank r sleeps r·--sleep s; all leave when the last arrives"),
    "subgroup": (1, "a process group of the even ranks: group rank vs global rank"),
}
_DEMO_NAMES = tuple(DEMO_INFO)
_REDUCE_OPS = ("sum", "avg", "max", "min", "product")

# Bounds of what a launch accepts (say so in --help): ranks per node are forked processes on this machine.
MAX_NPROC = 64
MAX_NNODES = 1024
MAX_TIMEOUT_S = 86_400.0
MAX_SLEEP_S = 60.0
MAX_LAYOUT_WORLD = 65_536
MAX_BENCH_BYTES = 2**32  # every rank allocates a tensor of each size (and the ring twice that)
RUNTIME_MISSING = 'this command needs torch: pip install "trainmath[runtime]"'


def require_runtime() -> None:
    """Raise one line saying how to install the runtime when torch cannot be imported (before any work)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TrainmathError(RUNTIME_MISSING) from None


def _add_job_args(p: argparse.ArgumentParser, nproc_default: int) -> None:
    p.add_argument("--nproc", "--nproc-per-node", dest="nproc", type=count(1, MAX_NPROC), default=nproc_default,
                   help=f"ranks on this node, 1..{MAX_NPROC} (torchrun's --nproc-per-node; default {nproc_default})")
    p.add_argument("--nnodes", type=count(1, MAX_NNODES), default=1,
                   help=f"launchers (nodes) in the job, 1..{MAX_NNODES}; default 1")
    p.add_argument("--node-rank", type=count(0, MAX_NNODES - 1), default=0,
                   help="this launcher's node index, 0..nnodes-1; node 0 hosts the rendezvous (default 0)")
    p.add_argument("--master-addr", type=host, default="127.0.0.1", help="address of node 0 (default 127.0.0.1)")
    p.add_argument("--master-port", type=port, default=0,
                   help="rendezvous port on node 0; 0 picks a free one (single node only; default 0)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU) or nccl (one GPU per rank)")
    p.add_argument("--timeout", type=number(0, MAX_TIMEOUT_S, exclusive_minimum=True, unit="of seconds"),
                   default=30.0, help="seconds a collective may wait before the job fails naming the rank at fault, "
                                      f"at most {MAX_TIMEOUT_S:g} (default 30)")
    p.add_argument("--keep-logs", action="store_true", help="on failure, keep each rank's log and print its folder")


def register(subparsers) -> None:
    comm = subparsers.add_parser("comm", help="run, check and benchmark torch.distributed collectives",
                                 description="torch.distributed primitives, ring algorithms and an nccl-tests-style "
                                             "benchmark, launched torchrun-style on one or more nodes.")
    sub = comm.add_subparsers(dest="comm_command", metavar="SUBCOMMAND", required=True)

    demo = sub.add_parser("demo", help="show each rank's tensor before and after a primitive",
                          description="Start N ranks and show, per rank in rank order, the tensor before and after "
                                      "a primitive (the examples of Jiang Yi's blog series on distributed training). "
                                      "Two launchers with --nnodes 2 and "
                                      "--node-rank 0/1 (same --master-addr/--master-port) form one job.")
    demo.add_argument("op", nargs="?", help=f"one of: {', '.join(_DEMO_NAMES)}")
    demo.add_argument("--list", action="store_true", help="list the demos and exit")
    demo.add_argument("--reduce-op", choices=_REDUCE_OPS, default="sum", help="for reduce, all_reduce, reduce_scatter")
    demo.add_argument("--sleep", type=number(0, MAX_SLEEP_S, unit="of seconds"), default=1.0,
                      help=f"barrier: rank r sleeps r times this many seconds, 0..{MAX_SLEEP_S:g} (default 1)")
    demo.add_argument("--json", action="store_true", help="print the records as JSON")
    _add_job_args(demo, 4)
    demo.set_defaults(func=cmd_demo)

    layout = sub.add_parser("layout", help="print the process table (process id, rank, node, local GPU)",
                            description="The table of processes, ranks, nodes and GPUs of Jiang Yi's blog series on "
                                        "distributed training, and a subgroup's.")
    layout.add_argument("--nnodes", type=count(1, MAX_NNODES), default=2, help=f"nodes, 1..{MAX_NNODES} (default 2)")
    layout.add_argument("--nproc-per-node", type=count(1, MAX_NNODES), default=4,
                        help=f"processes per node, 1..{MAX_NNODES}; at most {MAX_LAYOUT_WORLD:,} processes in all, "
                             f"one table row each (default 4)")
    layout.add_argument("--subgroup", default="even", help="'even' or comma-separated global ranks (default even)")
    layout.add_argument("--json", action="store_true", help="print the tables as JSON")
    layout.set_defaults(func=cmd_layout)

    bench = sub.add_parser("bench", help="nccl-tests-style benchmark with the cost model's prediction",
                           description="Time a collective over a range of sizes: nccl-tests columns (size, count, "
                                       "type, time, algbw, busbw) and the α-β-γ model's predicted time, with α, β "
                                       "calibrated from a ring exchange in the same run unless given.")
    bench.add_argument("--op", choices=OPS, default="all_reduce", help="collective (default all_reduce)")
    bench.add_argument("--impl", choices=("native", "ring", "naive"), default="native",
                       help="native torch collective, ring from isend/irecv, or naive gather+broadcast")
    bench.add_argument("--sizes", default="64K:4M", help="bytes: 1K:64M (doubling), 1M,8M, or 4M (default 64K:4M)")
    bench.add_argument("--factor", type=count(2, 1024), default=2,
                       help="multiplier between sizes of a range (default 2)")
    bench.add_argument("--dtype", default="float32",
                       choices=("float32", "float64", "bfloat16", "float16", "int32", "int64"))
    bench.add_argument("--segment", default=RING_SEGMENT_DEFAULT,
                       help=f"ring only: segment size; chunks are cut into clamp(chunk/segment, 1, 8) segments that "
                            f"move on as soon as they arrive (default {RING_SEGMENT_DEFAULT})")
    bench.add_argument("--iters", type=count(1, 100_000), default=20, help="timed iterations per size (default 20)")
    bench.add_argument("--warmup", type=count(0, 100_000), default=5, help="untimed iterations per size (default 5)")
    bench.add_argument("--alpha-us", type=number(0, 1e6, unit="of µs"),
                       help="link latency α in µs (skips calibration; needs --link-gbps)")
    bench.add_argument("--link-gbps", type=number(0, 1e6, exclusive_minimum=True, unit="of GB/s"),
                       help="link bandwidth in GB/s (1e9 bytes/s)")
    bench.add_argument("--reduce-gbps", type=number(0, 1e6, exclusive_minimum=True, unit="of GB/s"),
                       help="local reduction throughput in GB/s (default: free)")
    bench.add_argument("--json", action="store_true", help="print a list of row objects as JSON")
    _add_job_args(bench, 2)
    bench.set_defaults(func=cmd_bench)

    check = sub.add_parser("check", help="run the correctness matrix and print a pass/fail table",
                           description="Every primitive against hand-computed values and every ring algorithm "
                                       "against torch's native collectives (dtypes, reduce ops, uneven lengths).")
    check.add_argument("--only", choices=("native", "ring"), help="run one half of the matrix")
    check.add_argument("--all-rows", action="store_true", help="print every case, not one line per op/impl")
    check.add_argument("--json", action="store_true", help="print every case as JSON")
    _add_job_args(check, 4)
    check.set_defaults(func=cmd_check)


def _spec(args, deadline_s: float | None):
    from trainmath.runtime.launch import JobSpec

    return JobSpec(nproc_per_node=args.nproc, nnodes=args.nnodes, node_rank=args.node_rank, backend=args.backend,
                   master_addr=args.master_addr, master_port=args.master_port, timeout_s=args.timeout,
                   deadline_s=deadline_s)


def _launch(args, fn, *fn_args, deadline_s: float | None):
    spec = _spec(args, deadline_s)  # validates before torch is imported
    from trainmath.runtime.launch import launch

    results = launch(spec, fn, *fn_args, keep_logs=args.keep_logs)
    return spec, results


# ---------------------------------------------------------------------------------------------------- demo

def _fmt(value) -> str:
    """A tensor's values as torch prints them: [1., 2., 3.]."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.0f}." if value == int(value) and abs(value) < 1e15 else f"{value:.4g}"
    return str(value)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def normalize_demo(op: str) -> str:
    """``all-reduce`` / ``allreduce`` / ``all_reduce`` -> ``all_reduce``; unknown names raise."""
    key = op.strip().lower().replace("-", "_")
    aliases = {k.replace("_", ""): k for k in DEMO_INFO}
    key = aliases.get(key.replace("_", ""), key)
    if key not in DEMO_INFO:
        shown = repr(op) if len(op) <= 40 else repr(op[:30]) + "..."
        raise TrainmathError(f"unknown demo {shown}; known: {', '.join(DEMO_INFO)} (see `trainmath comm demo --list`)")
    return key


def cmd_demo(args) -> int:
    if args.list:  # names and descriptions only: no torch
        width = max(map(len, DEMO_INFO))
        for name, (min_n, text) in DEMO_INFO.items():
            extra = f" (needs >= {min_n} ranks)" if min_n > 1 else ""
            print(f"{name.ljust(width)}  {text}{extra}")
        return 0
    if not args.op:
        raise TrainmathError("name a demo (e.g. `trainmath comm demo all_reduce`) or use --list")
    name = normalize_demo(args.op)
    world = args.nproc * args.nnodes
    if world < DEMO_INFO[name][0]:
        raise TrainmathError(f"{name} needs at least {DEMO_INFO[name][0]} ranks, got {world}; use --nproc "
                             f"{DEMO_INFO[name][0]}")
    _spec(args, None)  # validate before importing torch
    require_runtime()
    from trainmath.runtime.demo import run_demo

    deadline = args.timeout + args.sleep * world + 30
    spec, results = _launch(args, run_demo, name, {"reduce_op": args.reduce_op, "sleep_s": args.sleep},
                            deadline_s=deadline)
    records = next(iter(results.values()))
    print(render_demo(name, records, nnodes=args.nnodes, nproc=args.nproc, backend=args.backend,
                      reduce_op=args.reduce_op, as_json=args.json))
    return 0


def render_demo(name: str, records: list[dict], *, nnodes: int, nproc: int, backend: str, reduce_op: str,
                as_json: bool = False) -> str:
    """What ``comm demo`` prints of every rank's record (also used under torchrun by ``trainmath.cli.demo``)."""
    world = len(records)
    if as_json:
        return json.dumps({"op": name, "world_size": world, "nnodes": nnodes, "backend": backend,
                           "reduce_op": reduce_op, "records": records}, indent=1)
    red = f", reduce op {reduce_op}" if name in ("reduce", "all_reduce", "reduce_scatter") else ""
    out = [f"{name}: {world} ranks ({nnodes} node(s) x {nproc}, {backend}{red})"]
    if name == "barrier":
        rows = [[str(r["rank"]), f"{r['sleep_s']:.2f}", f"{r['arrival_s']:.4f}", f"{r['release_s']:.4f}"]
                for r in records]
        out.append(_table(["rank", "sleeps (s)", "arrives at (s)", "released at (s)"], rows))
        out.append("every rank is released once the last one arrives (times since a common start on rank 0's clock)")
        return "\n".join(out)
    if name == "subgroup":
        rows = [[str(r["rank"]), "-" if r["group_rank"] is None else str(r["group_rank"]), _fmt(r["before"]),
                 _fmt(r["after"])] for r in records]
        out.append(_table(["global rank", "group rank", "before", "after all_reduce in group"], rows))
        out.append(f"group = global ranks {even_ranks(world)}: a process's rank depends on the group")
        return "\n".join(out)
    rows = [[str(r["rank"]), str(r["node"]), str(r["local_rank"]), _fmt(r["before"]), _fmt(r["after"])]
            + ([r.get("note", "")] if any(x.get("note") for x in records) else []) for r in records]
    headers = ["rank", "node", "local", "before", "after"] + (["note"] if any(x.get("note") for x in records) else [])
    for r in records:
        if "scatter_list" in r:
            out.append(f"rank {r['rank']} scatter list: {_fmt(r['scatter_list'])}")
    out.append(_table(headers, rows))
    return "\n".join(out)


# -------------------------------------------------------------------------------------------------- layout

def cmd_layout(args) -> int:
    if args.nnodes * args.nproc_per_node > MAX_LAYOUT_WORLD:
        raise TrainmathError(f"--nnodes {args.nnodes} x --nproc-per-node {args.nproc_per_node} = "
                             f"{args.nnodes * args.nproc_per_node:,} processes; the table lists at most "
                             f"{MAX_LAYOUT_WORLD:,} (one row each)")
    world = world_table(args.nnodes, args.nproc_per_node)
    if args.subgroup == "even":
        members = even_ranks(len(world))
    else:
        try:
            if len(args.subgroup) > 10 * MAX_LAYOUT_WORLD:
                raise ValueError
            members = [int(x) for x in args.subgroup.split(",") if x.strip() and len(x.strip()) <= 8]
            if len(members) != len([x for x in args.subgroup.split(",") if x.strip()]):
                raise ValueError
        except ValueError:
            shown = repr(args.subgroup) if len(args.subgroup) <= 60 else repr(args.subgroup[:40]) + "..."
            raise TrainmathError(f"--subgroup must be 'even' or comma-separated ranks, got {shown}") from None
    sub = subgroup_table(world, members)
    if args.json:
        print(json.dumps({"world": [vars(r) for r in world], "subgroup": [vars(r) for r in sub]}, indent=1))
        return 0
    headers = ["process id", "rank", "node", "local GPU"]

    def rows(table):
        return [[str(r.process_id), str(r.rank), str(r.node), str(r.local_gpu)] for r in table]

    print(f"default group: {args.nnodes} node(s) x {args.nproc_per_node} processes, world size {len(world)}")
    print(_table(headers, rows(world)))
    print()
    print(f"subgroup of global ranks {sorted(set(members))}: ranks renumbered within the group")
    print(_table(headers, rows(sub)))
    return 0


# --------------------------------------------------------------------------------------------------- bench

def _sizes(text: str, flag: str) -> None:
    """Refuse size text no real size has (20+ digit numbers overflow Python's int parsing limits)."""
    if len(text) > 200 or any(len(part) > 20 for part in text.replace(":", ",").split(",")):
        raise TrainmathError(f"{flag} {text[:40]!r}{'...' if len(text) > 40 else ''}: sizes are at most "
                             f"{format_size(MAX_BENCH_BYTES)} bytes, e.g. 1M:64M")


def cmd_bench(args) -> int:
    _sizes(args.sizes, "--sizes")
    _sizes(args.segment, "--segment")
    sizes = parse_size_range(args.sizes, args.factor)
    if max(sizes) > MAX_BENCH_BYTES:
        raise TrainmathError(f"--sizes {args.sizes!r} reaches {max(sizes):,} bytes; at most {MAX_BENCH_BYTES:,} "
                             f"({format_size(MAX_BENCH_BYTES)}: every rank allocates a tensor of each size)")
    segment = parse_size(args.segment)
    if not 1 <= segment <= MAX_BENCH_BYTES:
        raise TrainmathError(f"--segment must be 1 byte to {format_size(MAX_BENCH_BYTES)}, got {args.segment!r}")
    if args.iters < 1 or args.warmup < 0:
        raise TrainmathError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    link = None
    if args.alpha_us is not None or args.link_gbps is not None:
        if args.alpha_us is None or args.link_gbps is None:
            raise TrainmathError("give both --alpha-us and --link-gbps, or neither (then they are calibrated)")
        from trainmath.comm.cost import Link

        link = Link(alpha_s=args.alpha_us * 1e-6, bandwidth_bytes_per_s=args.link_gbps * 1e9,
                    reduce_bytes_per_s=None if args.reduce_gbps is None else args.reduce_gbps * 1e9)
    world = args.nproc * args.nnodes
    if args.op == "send_recv" and world < 2:
        raise TrainmathError("send_recv needs at least 2 ranks")
    _spec(args, None)
    from trainmath.runtime.bench import supported

    if not supported(args.op, args.impl):
        raise TrainmathError(f"no {args.impl} implementation of {args.op}; ring: all_reduce, reduce_scatter, "
                             f"all_gather; naive: all_reduce")
    if args.segment != RING_SEGMENT_DEFAULT and args.impl != "ring":
        raise TrainmathError(f"--segment applies to --impl ring only (got --impl {args.impl})")
    from trainmath.runtime.bench import run_bench

    cfg = {"op": args.op, "impl": args.impl, "sizes": sizes, "dtype": args.dtype, "warmup": args.warmup,
           "iters": args.iters, "link": None if link is None else vars(link), "segment_bytes": segment}
    _, results = _launch(args, run_bench, cfg, deadline_s=None)
    out = results.get(0)
    if out is None:  # a launcher without global rank 0 measures but does not report
        print(f"node {args.node_rank}: done (node 0 prints the table)")
        return 0
    lk = out["link"]
    source = "calibrated from a ring exchange in this run" if out["calibrated"] else "given"
    from trainmath.comm.cost import predict_time_s

    fit = _fit_in_run(args.op, args.impl, world, args.backend, out["rows"], lk["reduce_bytes_per_s"])
    for row in out["rows"]:
        row.update(alpha_s=lk["alpha_s"], link_bytes_per_s=lk["bandwidth_bytes_per_s"],
                   reduce_bytes_per_s=lk["reduce_bytes_per_s"], link_source=source)
        if fit:
            row.update(fitted_time_s=predict_time_s(args.op, args.impl, row["size_bytes"], world, fit, args.backend),
                       fitted_alpha_s=fit.alpha_s, fitted_link_bytes_per_s=fit.bandwidth_bytes_per_s)
    if args.json:
        print(json.dumps(out["rows"], indent=1))
        return 0
    seg = f", {format_size(segment)} segments" if args.impl == "ring" else ""
    print(f"# {args.op} ({args.impl}{seg}) on {world} ranks, {args.backend}; {args.warmup} warm-up + {args.iters} "
          f"timed iterations per size; time = max over ranks")
    red = (f", reduce {lk['reduce_bytes_per_s'] / 1e9:.2f} GB/s" if lk["reduce_bytes_per_s"] else "")
    print(f"# model link ({source}): alpha {lk['alpha_s'] * 1e6:.1f} us, "
          f"{lk['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s{red}")
    if fit:
        print(f"# model link (fitted to this run's {args.op} times, least squares on relative error): alpha "
              f"{fit.alpha_s * 1e6:.1f} us, {fit.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
    headers = ["size", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "predicted(us)", "pred/meas"]
    headers += ["fitted(us)", "fit/meas"] if fit else []
    rows = [[format_size(r["size_bytes"]), str(r["count"]), r["dtype"], f"{r['time_s'] * 1e6:.1f}",
             f"{r['algbw_bytes_per_s'] / 1e9:.3f}", f"{r['busbw_bytes_per_s'] / 1e9:.3f}",
             f"{r['predicted_time_s'] * 1e6:.1f}", f"{r['predicted_time_s'] / r['time_s']:.2f}"]
            + ([f"{r['fitted_time_s'] * 1e6:.1f}", f"{r['fitted_time_s'] / r['time_s']:.2f}"] if fit else [])
            for r in out["rows"]]
    print(_table(headers, rows))
    print("# GB/s = 1e9 bytes/s; busbw = algbw x nccl-tests factor (all_reduce 2(n-1)/n; reduce_scatter, "
          "all_gather, all_to_all (n-1)/n; others 1)")
    return 0


def _fit_in_run(op, impl, n, backend, rows, reduce_bytes_per_s):
    """The link fitted to the run's own times (trainmath.comm.calibrate), or None when it cannot be fitted
    (one rank, one size, times that do not grow)."""
    from trainmath.comm.calibrate import fit_collective_link

    try:
        return fit_collective_link(op, impl, n, [(r["size_bytes"], r["time_s"]) for r in rows], backend=backend,
                                   reduce_bytes_per_s=reduce_bytes_per_s)
    except TrainmathError:
        return None


# --------------------------------------------------------------------------------------------------- check

def cmd_check(args) -> int:
    _spec(args, None)
    from trainmath.runtime.check import run_check

    _, results = _launch(args, run_check, args.only, deadline_s=args.timeout * 4 + 120)
    rows = results.get(0)
    if rows is None:
        print(f"node {args.node_rank}: done (node 0 prints the table)")
        return 0
    failed = [r for r in rows if not r["ok"]]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 1 if failed else 0
    world = args.nproc * args.nnodes
    if args.all_rows:
        table = [[r["op"], r["impl"], r["dtype"], r["reduce_op"], str(r["length"]), "pass" if r["ok"] else "FAIL",
                  r["why"]] for r in rows]
        print(_table(["op", "impl", "dtype", "reduce", "length", "result", "why"], table))
    else:
        groups: dict[tuple[str, str], list[dict]] = {}
        for r in rows:
            groups.setdefault((r["op"], r["impl"]), []).append(r)
        table = []
        for (op, impl), rs in groups.items():
            bad = [r for r in rs if not r["ok"]]
            dtypes = sorted({r["dtype"] for r in rs})
            table.append([op, impl, str(len(rs)), ",".join(dtypes), "pass" if not bad else f"FAIL {len(bad)}",
                          bad[0]["why"] if bad else ""])
        print(_table(["op", "impl", "cases", "dtypes", "result", "first failure"], table))
    print(f"{len(rows) - len(failed)}/{len(rows)} cases passed on {world} ranks ({args.backend})")
    return 1 if failed else 0


