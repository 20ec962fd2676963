"""The MoE rows of tests/perf/published_runs_more.json, one line each: what the rows outside 15% share.

    python benchmarks/moe_rows.py              # every MoE row: speed, generation, EP, tokens per expert, switches
    python benchmarks/moe_rows.py --variants   # and two candidate mechanisms, each refitted per generation
    python benchmarks/moe_rows.py --loso       # and the MoE rows' leave-one-source-out error (plan_oracles.py's)

Columns: speed = predicted / published throughput (above 1: the model is too fast); the GPU generation; experts,
top-k, ep and local experts (experts / ep); tokens per expert = the tokens one expert receives per micro-batch
(ep ranks · mb · seq / cp / (tp / expert tp) · top-k / experts); nodes the EP group spans; the dispatcher and the
1F1B EP overlap the row records; micro-batches M; and the step's shares: the expert-side compute is in fwd/bwd,
``a2a`` the exposed EP all-to-all, ``ov`` the fitted per-local-expert overhead (``trainmath.perf.moe.OVERHEAD``).

``--variants`` prices two mechanisms that are not in the model, each with its constant refitted per generation
(grid, median |speed − 1|, throughput-suspect rows out) and its leave-one-source-out error, against the model as
it is:

- ``hidden``: the per-local-expert cost is host time (launches after the dispatcher's device-to-host sync of the
  split sizes), so it hides behind the one dispatch all-to-all queued before the expert GEMMs: exposed per MoE
  layer pass = max(0, e · local experts − one all-to-all).
- ``a2a-0.9``: the cross-node all-to-all at 0.9 of the NIC's line rate instead of the generation's link fraction
  (the overhead kept as fitted).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"))

from published_more import RUNS, estimate_run, spec, speed  # noqa: E402

from trainmath.errors import TrainmathError  # noqa: E402
from trainmath.hardware import presets  # noqa: E402
from trainmath.perf import moe  # noqa: E402

E_GRID = [i * 5e-6 for i in range(401)]


def rows() -> list[dict]:
    """Each priced MoE run with its figures (the model as it is) and the terms the variants need."""
    hw = presets()
    out = []
    for r in RUNS:
        if not r.get("moe"):
            continue
        try:
            est, job = estimate_run(r, hw)
        except TrainmathError:
            continue
        s = spec(r["id"])
        block = next(b for lay in s.layers for b in lay.blocks if b.kind == "moe")
        lay = est.layout
        local = block.dims.experts // lay.ep
        tokens = job["micro_batch"] * job["seq"] / lay.cp / (lay.tp // lay.expert_tp)
        busiest = max(range(len(est.stage_times_s)), key=lambda i: est.stage_times_s[i])
        layers = est.stage_layers[busiest]
        moe_layers = round(layers * sum(any(b.kind == "moe" for b in x.blocks) for x in s.layers) / s.num_layers)
        passes = 2 + (job["recompute"] == "full")
        a2a = [c for c in est.comm if c.name == "ep_comm"]
        one = a2a[0].time_s / a2a[0].count if a2a and a2a[0].count else 0.0
        b = est.breakdown
        out.append({
            "id": r["id"], "gpu": r["gpu"], "source": r["paper"], "gen": hw.gpu(r["gpu"]).generation,
            "speed": speed(r, est),
            "experts": block.dims.experts, "top_k": block.dims.top_k, "ep": lay.ep, "local": local,
            "per_expert": tokens * block.dims.top_k * lay.ep / block.dims.experts, "nodes": est.groups.ep.nodes,
            "dispatcher": job.get("ep_dispatcher", "alltoall"), "overlap": bool(job.get("ep_overlap")),
            "M": est.micro_batches, "suspect": bool(r.get("throughput_suspect")),
            "share": {k: b[v] / est.step_time_s for k, v in (("fwd+bwd", "forward"), ("a2a", "ep_comm"),
                                                                ("ov", "moe_overhead"))},
            "step": est.step_time_s, "published_step": est.step_time_s * speed(r, est),
            "base": est.step_time_s - b["moe_overhead"], "units": moe_layers * est.micro_batches * passes,
            "a2a_one": one})
        out[-1]["share"]["fwd+bwd"] += b["backward"] / est.step_time_s
    return out


def print_rows(rs: list[dict]) -> None:
    print(f"{'run':60s} {'gen':5s} {'speed':>6s}    E  k  ep  le tok/exp nodes disp    ovl    M  fwd+bwd a2a  ov")
    for r in rs:
        mark = ("out" if abs(r["speed"] - 1) > 0.15 else "") + ("*" if r["suspect"] else "")
        sh = r["share"]
        print(f"{r['id'][:60]:60s} {r['gen'][:5]:5s} {r['speed']:6.3f} {mark:4s} {r['experts']:3d} {r['top_k']:2d} "
              f"{r['ep']:3d} {r['local']:3d} {r['per_expert']:7.0f} {r['nodes']:5d} {r['dispatcher'][:6]:6s} "
              f"{'yes' if r['overlap'] else 'no':4s} {r['M']:4d} {sh['fwd+bwd']:6.2f} {sh['a2a']:4.2f} {sh['ov']:4.2f}")
    errs = [abs(r["speed"] - 1) for r in rs]
    print("* throughput suspect (tokens/s and TFLOP/s columns disagree; out of the fits)")
    print(f"{len(rs)} MoE rows: median |speed - 1| {100 * statistics.median(errs):.1f}%, "
          f"{sum(e <= 0.15 for e in errs)} within 15%")


def _hidden_step(r: dict, e: float) -> float:
    return r["base"] + max(0.0, e * r["local"] - r["a2a_one"]) * r["units"]


def _fit(rs: list[dict], step) -> float:
    use = [r for r in rs if not r["suspect"]]
    return min(E_GRID, key=lambda e: (statistics.median([abs(r["published_step"] / step(r, e) - 1) for r in use]),
                                      e))


def variants(rs: list[dict]) -> None:
    """The ``hidden`` variant refitted per generation, and the ``a2a-0.9`` variant, against the model."""
    base = [abs(r["speed"] - 1) for r in rs]
    print(f"\nmodel as it is: median {100 * statistics.median(base):.1f}%, {sum(x <= 0.15 for x in base)} of "
          f"{len(rs)} within 15%")
    errs, loso = [], []
    for gen in sorted({r["gen"] for r in rs}):
        g = [r for r in rs if r["gen"] == gen]
        e = _fit(g, _hidden_step)
        errs += [abs(r["published_step"] / _hidden_step(r, e) - 1) for r in g]
        for src in sorted({r["source"] for r in g}):
            train = [r for r in g if r["source"] != src and not r["suspect"]]
            if train:
                el = _fit(train, _hidden_step)
                loso += [abs(r["published_step"] / _hidden_step(r, el) - 1) for r in g if r["source"] == src]
        print(f"  hidden: {gen} e = {1e3 * e:.3f} ms per local expert")
    print(f"hidden: median {100 * statistics.median(errs):.1f}%, {sum(x <= 0.15 for x in errs)} within 15%, "
          f"leave-one-source-out median {100 * statistics.median(loso):.1f}%")

    import trainmath.perf.comm as pc

    real = pc._time_s
    hw = presets()
    fractions = {hw.efficiency(hw.gpu(name)).link_fraction for name in {r["gpu"] for r in rs}}
    if len(fractions) != 1:
        raise SystemExit(f"the MoE rows' generations have different link fractions {sorted(fractions)}")
    scale = 0.9 / fractions.pop()

    def faster(op, size, group, topo, algorithm="auto"):
        if op == "all_to_all" and group.nodes > 1:  # the NIC at 0.9 of line rate, not the link fraction
            bw = topo.inter.bandwidth_bytes_per_s * scale
            topo = replace(topo, inter=replace(topo.inter, bandwidth_bytes_per_s=bw))
        return real(op, size, group, topo, algorithm)

    pc._time_s, saved = faster, dict(moe.OVERHEAD)
    pc.time_s.cache_clear()
    try:
        fast = rows()
    finally:
        pc._time_s = real
        pc.time_s.cache_clear()
        moe.OVERHEAD.update(saved)
    e2 = [abs(r["speed"] - 1) for r in fast]
    print(f"a2a-0.9: median {100 * statistics.median(e2):.1f}%, {sum(x <= 0.15 for x in e2)} within 15%")


def loso() -> None:
    """The MoE rows' errors under ``plan_oracles.leave_one_source_out`` (each source predicted with the constants
    refitted without it), beside the in-sample figures."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from plan_oracles import leave_one_source_out
    from published_more import try_predict

    held = leave_one_source_out(RUNS)
    moe_errs, all_errs = [], []
    for src, errs in held.items():  # errs follow the source's priced runs in file order
        priced = [r for r in RUNS if r["paper"] == src and try_predict(r)[0] is not None]
        moe_errs += [e for r, e in zip(priced, errs) if r.get("moe")]
        all_errs += errs
    for name, errs in (("MoE rows", moe_errs), ("all rows", all_errs)):
        print(f"leave-one-source-out, {name}: {len(errs)} priced, median {100 * statistics.median(errs):.1f}%, "
              f"{sum(e <= 0.15 for e in errs)} within 15%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", action="store_true", help="price the two candidate mechanisms too")
    ap.add_argument("--loso", action="store_true", help="the MoE rows' leave-one-source-out error too (~1 min)")
    args = ap.parse_args()
    rs = rows()
    print_rows(rs)
    if args.variants:
        variants(rs)
    if args.loso:
        loso()


if __name__ == "__main__":
    main()
