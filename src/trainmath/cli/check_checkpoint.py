"""``trainmath check-checkpoint PATH...``: a checkpoint's tensors (names, shapes, total) against the ledger.

Exit codes: 0 when every tensor and the total match; 1 on any mismatch (missing, unexpected, wrong shape, stored
quantised, an extras group present only in part, a truncated file, totals differing); 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainmath.args import add_strict, config_json, config_lines
from trainmath.errors import TrainmathError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-checkpoint",
        help="compare a safetensors checkpoint with the ledger, tensor by tensor (headers only)",
        description="Compare a checkpoint with the parameter ledger of its config: every tensor by name and shape, "
                    "and the total. PATH is a model.safetensors.index.json (with or without its shards beside it), "
                    "one or more .safetensors files, a directory holding them, or a Hub repo id (online). Only "
                    "safetensors headers are read, never tensor data. Exit 0: everything matches; 1: mismatches "
                    "(listed); 2: bad input.",
    )
    p.add_argument("paths", metavar="PATH", nargs="+")
    p.add_argument("--config", metavar="MODEL",
                   help="the model's config: a config.json, a directory holding one, a catalog name or a Hub id "
                        "(default: config.json beside the checkpoint; for a Hub id, that repo's)")
    p.add_argument("--dtype", default="bf16",
                   help="dtype of every tensor, used only to turn an index's total_size into parameters when the "
                        "shards are not at hand (default: bf16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_strict(p)
    p.set_defaults(func=run)


def _config_for(args: argparse.Namespace, ckpt) -> str:
    if args.config:
        return args.config
    if ckpt.config_dir is not None and (Path(ckpt.config_dir) / "config.json").is_file():
        return str(Path(ckpt.config_dir) / "config.json")
    if ckpt.hub_id is not None:
        return ckpt.hub_id
    raise TrainmathError(f"no config.json beside {ckpt.source}; pass --config MODEL (a config.json, a directory "
                         f"holding one, a catalog name such as Qwen/Qwen3-32B, or a Hub id)")


def run(args: argparse.Namespace) -> int:
    from trainmath.checkpoint import compare, load_checkpoint
    from trainmath.params import count_params
    from trainmath.sources import load_spec

    ckpt = load_checkpoint(args.paths)
    config = _config_for(args, ckpt)
    spec = load_spec(config, strict=args.strict)
    report = compare(spec, ckpt, ledger_params=count_params(spec).total_params, dtype=args.dtype)
    if args.json:
        print(json.dumps({"config": config, **report.to_dict(), "config_read": config_json(spec)}, indent=1))
    else:
        print(render(report, config) + "".join(f"\n{line}" for line in config_lines(spec)))
    return 0 if report.ok else 1


def _shape(s) -> str:
    return "(" + ", ".join(map(str, s)) + ")"


def render(r, config: str) -> str:
    from trainmath.render import human_count, table

    lines = [
        f"checkpoint  {r.checkpoint}  ({len(r.files)} file{'s' * (len(r.files) != 1)}; "
        f"{'headers read' if r.shapes_checked else 'index only'})",
        f"config      {config}  ({r.model_type})",
        f"lm_head     {r.lm_head}",
        "",
        f"tensors     {r.matched:,} of {r.expected:,} expected match by name"
        + (" and shape" if r.shapes_checked else " (shapes not read)"),
        f"            missing {len(r.missing)}, unexpected {len(r.unexpected)}, "
        f"shape mismatches {len(r.shape_mismatches)}, stored quantised {len(r.quantised)}",
    ]
    if r.missing:
        lines += ["", f"missing in checkpoint ({len(r.missing)}):", *(f"  {n}" for n in r.missing)]
    if r.unexpected:
        lines += ["", f"unexpected in checkpoint ({len(r.unexpected)}):",
                  *(f"  {u['name']}" + (f"  {u['dtype']} {_shape(u['shape'])}" if "shape" in u else "")
                    for u in r.unexpected)]
    if r.shape_mismatches:
        lines += ["", f"shape mismatches ({len(r.shape_mismatches)}):",
                  table(["tensor", "expected", "found", "dtype"],
                        [[m["name"], _shape(m["expected"]), _shape(m["found"]), m["dtype"]]
                         for m in r.shape_mismatches], align="lllr", indent="  ")]
    if r.quantised:
        lines += ["", f"stored quantised ({len(r.quantised)}):"]
        for q in r.quantised:
            stored = ", ".join(s["name"].rsplit(".", 1)[-1] + (f" {s['dtype']} {_shape(s['shape'])}" if "dtype" in s
                                                               else "") for s in q["stored"])
            logical = f"  [{q['logical_params']:,} 4-bit values]" if "logical_params" in q else ""
            where = f"  [extras: {q['extras']}]" if "extras" in q else ""
            lines.append(f"  {q['name']} {_shape(q['expected'])}: {stored}{logical}{where}")
    for e in r.extras:
        state = ("absent" if e.found == 0 else "all present" if e.found == e.expected else
                 f"{e.found} of {e.expected} present")
        lines += ["", f"extras (not in the ledger total): {e.label}: {state}, {e.params_found:,} of "
                      f"{e.params_expected:,} params found", f"  why: {e.why}"]
        lines += [f"  missing: {n}" for n in e.missing]
        lines += [f"  shape mismatch: {m['name']} expected {_shape(m['expected'])} found {_shape(m['found'])}"
                  for m in e.shape_mismatches]
    lines += ["", f"params      from {r.params_from}"]
    if r.checkpoint_params is not None:
        w = len(f"{max(r.checkpoint_params, r.compared_ledger_params):,}") + 1
        lines += [f"  checkpoint  {r.checkpoint_params:>{w},}  ({human_count(r.checkpoint_params)})",
                  f"  ledger      {r.compared_ledger_params:>{w},}  ({human_count(r.compared_ledger_params)})",
                  f"  difference  {r.params_difference:>+{w},}"]
    if r.quantised_left_out_params:
        lines.append(f"  (ledger {r.ledger_params:,} less {r.quantised_left_out_params:,} in tensors stored "
                     f"quantised under other names, left out of both sides)")
    if r.index_total_size is not None:
        lines.append(f"  index total_size {r.index_total_size:,} bytes")
    if r.params_by_dtype:
        lines.append("  stored dtypes: " + ", ".join(f"{d} {n:,}" for d, n in sorted(r.params_by_dtype.items())))
    lines += [f"problem: {p}" for p in r.problems]
    lines += [f"note: {n}" for n in r.notes]
    lines += ["", f"verdict     {r.verdict.upper() if r.ok else r.verdict}"]
    return "\n".join(lines)
