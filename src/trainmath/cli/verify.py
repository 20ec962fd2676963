"""``trainmath verify MODEL ...``: train as ``trainmath train`` does, measure every rank, and compare each field
with the calculator's prediction. Exit 0 only when every field is within its tolerance, 1 otherwise.

Top level imports only the standard library; the tolerances and what they stand for are in
``trainmath.verify.train``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from trainmath.errors import TrainmathError


def register(subparsers) -> None:
    from trainmath.cli.train import add_train_args

    p = subparsers.add_parser(
        "verify", help="train and compare the calculator with the measurement, field by field",
        description="Run the calculator (training memory per rank, FLOPs) and the training with the same flags; "
                    "print predicted vs measured per field with the relative error and its tolerance. Exit 0 "
                    "only when every field is within tolerance.")
    add_train_args(p)
    p.set_defaults(func=run, steps=2, measure=True)


def run(args: argparse.Namespace) -> int:
    from trainmath.cli.train import run_training
    from trainmath.runtime.train.model import model_spec, shrunk_config
    from trainmath.verify.train import compare, predict

    if args.steps < 2:
        raise TrainmathError(f"verify measures the second step (the first creates the optimizer states): --steps must "
                             f"be >= 2, got {args.steps}")
    if args.resume or args.stop_after is not None:
        raise TrainmathError("verify runs from scratch: --resume and --stop-after are for trainmath train")
    json_steps, args.json = args.json, False
    # With --json, stdout holds the one JSON document: the live step lines are progress, on stderr.
    with contextlib.redirect_stdout(sys.stderr) if json_steps else contextlib.nullcontext():
        results, _ = run_training(args)
    first = results[min(results)]
    by_rank = dict(enumerate(first["measured_by_rank"]))
    cfg_world = len(by_rank)
    from trainmath.cli.train import config_from_args

    cfg = config_from_args(args, cfg_world)
    name, conf = shrunk_config(cfg.model, cfg.overrides)
    spec = model_spec(name, conf)
    predicted = predict(spec, cfg, cfg_world, cuda=args.backend == "nccl")
    if cfg.peft.enabled:
        from trainmath.verify.peft import compare_peft, predict_peft

        predicted = predict_peft(spec, cfg, cfg_world, predicted, cuda=args.backend == "nccl")
        fields = compare_peft(predicted, by_rank, cfg)
    else:
        fields = compare(predicted, by_rank, cfg)
    unpredicted = {}
    if cfg.peft.enabled:
        from trainmath.verify.peft import measured_only

        unpredicted = measured_only(predicted, by_rank)
    if min(results) != 0:  # under torchrun only rank 0 prints
        return 0 if all(f.ok for f in fields) else 1
    if json_steps:
        print(json.dumps({"model": name, "world_size": cfg_world, "fields": [f.to_dict() for f in fields],
                          "collective_bytes": by_rank[0].get("collective_bytes", {}),
                          "measured_only": unpredicted,
                          "conventions": predicted["conventions"]}, indent=2))
    else:
        print(render(name, cfg, cfg_world, fields, by_rank[0], predicted))
        for key, per_rank in unpredicted.items():
            if isinstance(per_rank, dict):
                print(f"measured, not predicted for a fine-tune yet: {key} "
                      + ", ".join(f"rank {r} {v:,}" for r, v in per_rank.items()))
            else:
                print(f"  ({key.replace('_', ' ')}: {per_rank})")
    return 0 if all(f.ok for f in fields) else 1




def render(name, cfg, world, fields, rank0: dict, predicted: dict) -> str:
    from trainmath.runtime.train.config import job_label

    job = "" if not cfg.peft.enabled else f", {job_label(cfg.peft)}"
    lines = [f"{name}: {cfg.strategy} ({cfg.impl}) on {world} rank(s), {cfg.precision}, {cfg.optimizer}, "
             f"recompute {cfg.recompute}{job}; step 2 measured",
             f"{'field':<40} {'predicted':>14} {'measured':>14} {'rel err':>8} {'tol':>6}  ok"]
    for f in fields:
        lines.append(f"{f.name:<40} {f.predicted:>14,.0f} {f.measured:>14,.0f} {f.rel_error:>8.4f} "
                     f"{'≤' if f.upper_bound else f'{f.tolerance:.3f}':>6}  {'yes' if f.ok else 'NO'}")
    comm = rank0.get("collective_bytes")
    if comm:
        lines.append("collective bytes per step (rank 0, buffer sizes): "
                     + ", ".join(f"{k} {v:,}" for k, v in sorted(comm.items())))
    bad = [f for f in fields if not f.ok]
    lines.append(f"{len(fields) - len(bad)}/{len(fields)} fields within tolerance"
                 + ("" if not bad else "; outside: " + ", ".join(f.name for f in bad)))
    for f in {f.note for f in fields if f.note}:
        lines.append(f"  note: {f}")
    return "\n".join(lines)
