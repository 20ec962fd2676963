"""Fit the per-generation serving constants of `trainmath.infer.speed` to the published serving records and write
them into `src/trainmath/hardware/serving.json`.

    python benchmarks/serving_calibrate.py [--file PATH] [--dry-run]

Per GPU generation (never per run or per source), four numbers: prefill_compute_fraction,
decode_memory_fraction, step_overhead_s and layer_overhead_s, minimising the median |log(predicted /
published)| over every published metric of that generation's records (coordinate descent over grids,
`serving_oracles.fit`). A generation with fewer than MIN_RECORDS records gets hopper's constants, said so in
its 'how' (four numbers are not pinned by a handful of runs). The
honest out-of-sample figure is `serving_oracles.py`'s leave-one-source-out table; this script prints both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from serving_oracles import DEFAULT, errors, fit, fmt, load, loso  # noqa: E402

TARGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "trainmath", "hardware",
                      "serving.json")
MIN_RECORDS = 10
KEYS = ("prefill_compute_fraction", "decode_memory_fraction", "step_overhead_s", "layer_overhead_s")


def medians(errs) -> dict:
    by = {}
    for _, k, e in errs:
        by.setdefault(k, []).append(abs(e))
    return {k: statistics.median(v) for k, v in by.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", default=DEFAULT, help="published records (default tests/infer/published_serving.json)")
    ap.add_argument("--dry-run", action="store_true", help="print the constants, write nothing")
    a = ap.parse_args()
    with open(a.file) as f:
        records, raws, skipped, _ = load(json.load(f))
    consts = fit(records, raws)
    counts = Counter(raws[r["id"]]["generation"] for r in records)
    sources = {g: sorted({r["source"] for r in records if raws[r["id"]]["generation"] == g}) for g in counts}
    ins, out = medians(errors(records, raws, consts)), medians(loso(records, raws))
    summary = ", ".join(f"{k} {ins[k] * 100:.1f}% in-sample / {out[k] * 100:.1f}% leave-one-source-out"
                        for k in ("tpot_s", "output_tokens_per_s", "ttft_s"))
    with open(TARGET) as f:
        data = json.load(f)
    for gen, entry in data["generations"].items():
        if counts.get(gen, 0) >= MIN_RECORDS:
            entry.update(dict(zip(KEYS, consts[gen], strict=True)))
            entry["how"] = (f"fitted by benchmarks/serving_calibrate.py to the {counts[gen]} {gen} records of "
                            f"tests/infer/published_serving.json ({', '.join(sources[gen])}); all generations: "
                            f"{summary}")
        else:
            entry.update(dict(zip(KEYS, consts["hopper"], strict=True)))
            entry["how"] = (f"not calibrated: {counts.get(gen, 0)} published serving records (< {MIN_RECORDS}); "
                            "hopper's fitted constants reused (an assumption)")
        print(f"{gen:<10} {fmt(tuple(entry[k] for k in KEYS))}  {entry['how']}")
    print(f"{len(records)} records, {len(skipped)} skipped; {summary}")
    if not a.dry_run:
        with open(TARGET, "w") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
            f.write("\n")
        print(f"wrote {os.path.relpath(TARGET)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
