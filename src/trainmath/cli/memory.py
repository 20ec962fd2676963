"""``trainmath memory MODEL``: training memory per GPU, a breakdown that sums to the peak."""

from __future__ import annotations

import argparse
import json

from trainmath.args import add_mem_util, add_strict, byte_size, config_json, config_lines, integer, positions_warning
from trainmath.vocabulary import (
    ATTENTION,
    DEVICES,
    EXPERTS,
    GRAD_LIFETIMES,
    LOOP_KEEPS,
    MEMORY_ATTENTION,
    MEMORY_ATTENTION_HELP,
    OFFLOAD,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PROFILES,
    RECIPES,
    RECOMPUTE,
    ZERO_IMPLS,
    attention_as,
)

# The choices are the calculator's own tables (pure Python, no heavy import).
PRECISIONS = tuple(RECIPES)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "memory",
        help="training memory per GPU: weights, grads, optimizer states, activations, transients",
        description="Peak training memory of one GPU (what torch.cuda.max_memory_allocated reports for a step) "
                    "with a breakdown that sums to it. MODEL is a config.json path, a directory, a catalog name "
                    "or a Hub repo id.",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--micro-batch", type=integer, required=True, help="sequences per micro-batch per DP rank")
    p.add_argument("--seq", type=integer, required=True, help="tokens per sequence")
    p.add_argument("--precision", choices=PRECISIONS, default="mixed-bf16")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="foreach",
                   help="torch optimizer implementation: forloop (foreach=False), foreach (the default on CUDA; "
                        "its temporaries hold one state-sized tensor per parameter), fused (no temporaries; "
                        "keeps the step scalars on the GPU)")
    p.add_argument("--grad-lifetime", choices=GRAD_LIFETIMES, default="set_to_none",
                   help="when gradients exist: set_to_none (torch's zero_grad default: none when the step starts), "
                        "zero (zero_grad(set_to_none=False)), accumulate (gradient accumulation: the whole step)")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP gradient_as_bucket_view=True (ZeRO-0, dp > 1): gradients are views of the buckets")
    p.add_argument("--loop-keeps", choices=sorted(LOOP_KEEPS), default="loss",
                   help="what the training loop holds through backward: loss (loss = model(...).loss, the "
                        "default, as the HF Trainer, torchtitan and Lightning: the logits are freed after the "
                        "forward) or output (out = model(...); the logits until the step returns)")
    p.add_argument("--backward-in-autocast", action="store_true",
                   help="the loop calls backward() inside the torch.autocast context (amp-bf16): autocast's cache "
                        "keeps the forward's bf16 weight casts to the end of backward (about 2 bytes per linear "
                        "parameter more); default: backward() after the context exits")
    p.add_argument("--device", choices=DEVICES, default="cuda",
                   help="cuda: what torch.cuda.max_memory_allocated reports; cpu: what CPU kernels allocate "
                        "(MemTracker on a CPU step)")
    p.add_argument("--experts", choices=EXPERTS, default="grouped",
                   help="routed experts as transformers runs them: grouped (grouped_mm, its default) or eager "
                        "(the per-expert loop, which saves more)")
    p.add_argument("--offload", choices=OFFLOAD, default="none",
                   help="ZeRO-Offload: optimizer states and step on the CPU; params (with --zero 3): also the "
                        "parameter shards. Prints the host RAM per node (host_bytes) as DeepSpeed pins it; with "
                        "--peft, optimizer only (ZeRO 0-2): the adapters alone go to the host")
    p.add_argument("--host-memory", type=byte_size, default=None, metavar="BYTES",
                   help="host RAM per node for the --gpu verdict with --offload (e.g. 2TiB, 512GB; default 2 TiB, "
                        "a DGX H100's; docs/offload.md)")
    p.add_argument("--recompute", choices=RECOMPUTE, default="none",
                   help="activation recompute (default none): selective = torchtitan's op-level policy with the hf "
                        "profile (every 2nd mm and SDPA cached), Korthikanti et al.'s with --profile megatron"
                        "; full = every decoder layer")
    p.add_argument("--attention", choices=ATTENTION, default="sdpa", help=MEMORY_ATTENTION_HELP)
    p.add_argument("--profile", choices=PROFILES, default="hf",
                   help="what the model code saves for backward: transformers or Megatron-Core")
    p.add_argument("--zero", type=integer, default=0, help="ZeRO stage 0-3 over data parallel")
    p.add_argument("--zero-impl", choices=ZERO_IMPLS, default="deepspeed",
                   help="whose ZeRO: deepspeed (ZeRO-1/2 with a reduce bucket of min(5e8, params) elements for "
                        "the whole step; ZeRO-3 as FSDP2), trainmath (trainmath train --impl trainmath: flat "
                        "padded buffers at the reduce and the all-gather only; ZeRO-3 without prefetch), fsdp2 "
                        "(torch's FSDP2 also for ZeRO-2: reshard_after_forward=False) or megatron (Megatron-Core's "
                        "DDP and distributed optimizer: gradients reduced in their contiguous buffer, no bucket)")
    p.add_argument("--dp", type=integer, default=None,
                   help="data-parallel degree (default: --world-size / (tp·pp·cp), else 1)")
    p.add_argument("--tp", type=integer, default=1,
                   help="tensor-parallel degree; with the hf profile: parallelize_module on the decoder layers "
                        "(column-wise q/k/v/gate/up, row-wise o/down; embedding, LM head, loss and norms whole on "
                        "every rank)")
    p.add_argument("--pp", type=integer, default=1, help="pipeline stages (1F1B)")
    p.add_argument("--cp", type=integer, default=1,
                   help="context-parallel degree: s/cp positions per rank (ring attention: the local K/V chunk)")
    p.add_argument("--ep", type=integer, default=1,
                   help="expert-parallel degree (drawn from dp·cp): routed experts / ep per rank; each rank still "
                        "computes its own tokens' top-k rows (balanced routing assumed)")
    p.add_argument("--sp", action="store_true",
                   help="sequence parallelism over the tp ranks (needs --tp > 1): norms and residual stream cut "
                        "on the sequence, as Megatron and torchtitan run it")
    p.add_argument("--vocab-parallel", action="store_true",
                   help="vocabulary-parallel embedding, LM head and loss over the tp ranks (needs --tp > 1; "
                        "always on with --profile megatron)")
    p.add_argument("--world-size", type=integer, default=None,
                   help="GPUs: with --dp given, checked to equal dp·tp·pp·cp; without, dp is derived from it")
    p.add_argument("--gpu", metavar="NAME", default=None,
                   help="a GPU preset (h100, h200, a100, a100-40gb, b200, l40s, 4090, mi300x; "
                        "src/trainmath/hardware/gpus.json): print whether the step fits, "
                        "the margin, and which levers (recompute, ZeRO stage, more DP ranks, TP, offload) would "
                        "make it fit, each re-run through the model")
    add_mem_util(p)
    p.add_argument("--micro-batches", type=integer, default=None,
                   help="micro-batches per step (gradient accumulation); default: at least pp")
    p.add_argument("--simulate", action="store_true",
                   help="also run one step of the real transformers code on fake tensors under MemTracker (CPU; "
                        "one device, rank 0 of FSDP2 with --zero 3 --dp W, or rank 0 of --tp N [--sp] "
                        "[--vocab-parallel]; with --peft lora, peft wraps it first, on one device or --zero 3; needs "
                        "torch, transformers and peft) and print its peak beside the --device "
                        "cpu prediction; progress per layer and a time estimate go to stderr)")
    p.add_argument("--simulate-layers", type=integer, default=None, metavar="N",
                   help="with --simulate: simulate N and N+1 decoder layers (N >= 4) and fold in the rest, each "
                        "segment's peak extrapolated linearly; a model of several layer types (Gemma-2/3, gpt-oss, "
                        "Qwen3-Next, Nemotron-H, DeepSeek-V3's dense-first layers) keeps its pattern, with N and N+1 "
                        "repeats of its unit of layer types; exact where layers of a type are identical; which "
                        "layers ran is said in the output (a model too short to gain is simulated whole)")
    p.add_argument("--timeline", action="store_true",
                   help="print the step's timeline: bytes live at every event (with --json: the list only)")
    p.add_argument("--explain", "--verbose", dest="explain", action="store_true",
                   help="also print every term (zeros included) and every convention the figures assume "
                        "(--json always carries them)")
    p.add_argument("--json", action="store_true", help="print one JSON object with exact integers")
    add_strict(p)
    from trainmath.adapters import add_peft_args

    add_peft_args(p)
    g = p.add_argument_group("fine-tuning memory")
    g.add_argument("--lora-dropout", type=float, default=None, metavar="P",
                   help="peft's lora_dropout (default 0: no dropout, nothing saved for it)")
    g.add_argument("--input-grads", choices=("on", "off"), default=None,
                   help="enable_input_require_grads(): layer 0 computes its input's gradient (default: on with "
                        "--recompute full, as peft does for gradient checkpointing; off otherwise)")
    g.add_argument("--paged-optimizer", action="store_true",
                   help="bitsandbytes' paged 8-bit optimizer (PagedAdamW8bit): its states in CUDA managed memory, "
                        "outside torch's allocator (reported beside the peak, not in it)")
    p.set_defaults(func=run)


def peft_run(args: argparse.Namespace):
    """The ``memory.peft.PeftRun`` of the flags, or None for full training (a fine-tuning flag without --peft is
    one error)."""
    from trainmath.adapters import peft_from_args
    from trainmath.errors import TrainmathError
    from trainmath.memory.peft import PeftRun

    job = peft_from_args(args)
    extra = [f for f, v in (("--lora-dropout", args.lora_dropout), ("--input-grads", args.input_grads),
                            ("--paged-optimizer", args.paged_optimizer or None)) if v is not None]
    if not job.enabled:
        if extra:
            raise TrainmathError(f"{', '.join(extra)} needs --peft lora or --peft qlora")
        return None
    return PeftRun(job=job, dropout=args.lora_dropout or 0.0, paged=args.paged_optimizer,
                   input_grads=None if args.input_grads is None else args.input_grads == "on")


def layout_of(args: argparse.Namespace):
    """The ``ParallelLayout`` the flags name (``--dp`` derived from ``--world-size`` when not given)."""
    from trainmath.layout import ParallelLayout
    from trainmath.memory.fit import derive_dp

    dp = args.dp
    if dp is None:
        dp = derive_dp(args.world_size, tp=args.tp, pp=args.pp, cp=args.cp) if args.world_size is not None else 1
    return ParallelLayout(dp=dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, sp=args.sp,
                          vocab_parallel=args.vocab_parallel, zero=args.zero, world_size=args.world_size)


def run(args: argparse.Namespace) -> int:
    from trainmath.memory.training import TrainingSetup, training_memory
    from trainmath.sources import load_spec

    setup = TrainingSetup(micro_batch=args.micro_batch, seq=args.seq, precision=args.precision,
                          optimizer=args.optimizer, optimizer_impl=args.optimizer_impl, recompute=args.recompute,
                          attention=attention_as(args.attention, MEMORY_ATTENTION), profile=args.profile,
                          micro_batches=args.micro_batches,
                          grad_lifetime=args.grad_lifetime, bucket_view=args.bucket_view, device=args.device,
                          offload=args.offload, experts=args.experts, loop_keeps=args.loop_keeps,
                          backward_in_autocast=args.backward_in_autocast,
                          zero_impl=args.zero_impl, peft=peft_run(args))
    if setup.peft is not None and args.simulate:  # verify.peft_simulate: one device, or rank 0 of FSDP2
        from trainmath.verify.peft_simulate import check as check_peft_simulable

        check_peft_simulable(setup, layout_of(args), fold_layers=args.simulate_layers)
    layout = layout_of(args)
    # check the cheap things before reading the model
    from trainmath.errors import TrainmathError
    from trainmath.layout import layout_problems
    from trainmath.memory.training import check_setup

    bad = check_setup(setup) + layout_problems(layout)
    if bad:
        raise TrainmathError("; ".join(bad))
    if args.simulate_layers is not None and not args.simulate:
        raise TrainmathError("--simulate-layers needs --simulate")
    if args.simulate:
        from trainmath.verify.simulate import check_simulable

        check_simulable(setup, layout)
    gpu = None
    if args.gpu is not None:
        from trainmath.hardware import gpu as lookup_gpu

        gpu = lookup_gpu(args.gpu)
    from trainmath.memory.host import HOST_MEMORY_BYTES, check_host_memory

    host_memory = check_host_memory(args.host_memory if args.host_memory is not None else HOST_MEMORY_BYTES)
    spec = load_spec(args.model, strict=args.strict)
    plan = None
    if args.simulate_layers is not None:
        from trainmath.verify.fold import check_foldable

        plan = check_foldable(spec, args.simulate_layers)
    warning = positions_warning(spec, args.seq, "--seq")
    try:
        report = training_memory(spec, setup, layout)
    except TrainmathError as e:
        if not (args.simulate and layout.tp > 1):
            raise
        from trainmath.layout import validate_layout

        validate_layout(layout, spec)  # an impossible layout is still the calculator's one line
        return simulate_only(args, spec, setup, layout, str(e))  # the hf profile does not model TP yet
    verdict = None
    if gpu is not None:
        from trainmath.memory.fit import fit

        verdict = fit(spec, setup, layout, gpu, report=report, mem_util_percent=args.mem_util,
                      host_memory_bytes=host_memory)
    from trainmath.memory.host import job_host_memory

    host = job_host_memory(spec, setup, layout, gpus_per_node=gpu.gpus_per_node if gpu is not None else None)
    sim = None
    if args.simulate and setup.peft is not None:
        from trainmath.sources import resolve
        from trainmath.verify.peft_simulate import peft_simulation

        progress("simulating the fine-tune's step on fake tensors")
        sim = peft_simulation(resolve(args.model).config, spec, setup, layout)
    elif args.simulate:
        sim = simulation(args.model, spec, setup, layout, plan=plan)
    if args.timeline and args.json:
        print(json.dumps(report.to_dict()["timeline"], indent=1))
        return 0
    if args.timeline:
        print(render_timeline(report))
        return 0
    summary = None
    if setup.peft is not None:
        from trainmath.memory.peft import report_summary

        summary = report_summary(spec, setup, layout)
    if args.json:
        out = report.to_dict()
        if summary is not None:
            out["peft"] = summary
        if host is not None:
            out.update(host.to_dict())
        if verdict is not None:
            out.update(verdict.to_dict())
        if sim is not None:
            out["simulation"] = sim
        out["config"] = config_json(spec)
        out["warnings"] = [warning] if warning else []
        print(json.dumps(out, indent=1))
        return 0
    print(render(report, explain=args.explain))
    if summary is not None:
        print(f"peft {setup.peft.job.method}: trainable {summary['trainable_params']:,} params; frozen base "
              f"{summary['base_weight_bytes'] / 2**30:.2f} GiB, adapters {summary['adapter_weight_bytes'] / 2**30:.3f} "
              f"GiB" + (f"; paged optimizer states {summary['paged_optimizer_states_bytes'] / 2**30:.3f} GiB "
                        f"(managed memory, outside peak_bytes)" if summary["paged_optimizer_states_bytes"] else "")
              + (f"; largest dequantised weight {summary['qlora_dequant_transient_bytes'] / 2**20:.1f} MiB"
                 if summary["qlora_dequant_transient_bytes"] else ""))
    if host is not None:
        print(render_host(host))
    for line in config_lines(spec) + ([f"warning: {warning}"] if warning else []):
        print(line)
    if verdict is not None:
        print(render_fit(verdict))
    if sim is not None:
        print(render_simulation(sim))
    return 0


def progress(line: str) -> None:
    """A line of the simulation's progress on stderr."""
    import sys

    print(f"simulate: {line}", file=sys.stderr, flush=True)


def simulation(model: str, spec, setup, layout, *, plan=None) -> dict:
    """The fake-tensor step's peak beside the ``--device cpu`` prediction (what it measures); with a ``plan``
    (``--simulate-layers``), simulated on fewer layers and folded (``trainmath.verify.fold``)."""
    from dataclasses import replace

    from trainmath.memory.training import experts_path, training_memory
    from trainmath.model.spec import MoEDims
    from trainmath.sources import resolve
    from trainmath.verify.simulate import simulate

    moe = any(isinstance(b.dims, MoEDims) for layer in spec.layers for b in layer.blocks)
    if moe:  # simulate the path the prediction models (a grouped path not modelled is its eager loop)
        setup = replace(setup, experts=experts_path(spec, setup))
    from trainmath.verify.fold import estimate_seconds, simulate_folded

    config = resolve(model).config
    folding = plan is not None and plan.pattern is not None
    runs = plan.runs() if plan is not None else [len(spec.layers)]
    est, per_layer, rest = estimate_seconds(config, setup, layout, moe=moe, runs=runs)
    progress(f"estimated {est:.0f} s for {' + '.join(map(str, runs))} layers (an estimate: {per_layer:.2f} s per "
             f"layer and {rest:.1f} s for the rest, timed on a 2-layer run of the same width just now)")
    if folding:
        sim = simulate_folded(config, setup, layout, moe=moe, plan=plan, name=spec.name, progress=progress)
    else:
        sim = simulate(config, setup, layout, moe=moe, progress=progress)
        if plan is not None:
            sim = replace(sim, folded=plan.why)
    cpu = training_memory(spec, replace(setup, device="cpu"), layout)
    out = sim.to_dict()
    out["estimated_seconds"] = round(est, 1)
    out["predicted_cpu_peak_bytes"] = cpu.peak_bytes
    out["predicted_cpu_peak_event"] = cpu.stages[cpu.stage].phase
    out["difference_bytes"] = cpu.peak_bytes - (sim.peak_bytes - sim.buffers_bytes)
    return out


def simulate_only(args, spec, setup, layout, refusal: str) -> int:
    """``--simulate`` of a layout the calculator refuses (the hf profile with --tp > 1, for now): the simulated
    rank alone, with the refusal in place of the prediction."""
    from trainmath.sources import resolve
    from trainmath.verify.simulate import simulate

    sim = simulate(resolve(args.model).config, setup, layout, progress=progress).to_dict()
    if args.json:
        print(json.dumps({"simulation": sim, "prediction_error": refusal, "config": config_json(spec)}, indent=1))
        return 0
    from trainmath.render import human_bytes

    kinds = ", ".join(f"{k} {human_bytes(v)}" for k, v in sim["by_kind"].items() if v)
    print(f"{spec.name}: rank 0 of {layout.describe()} simulated (transformers on fake tensors under MemTracker, "
          f"CPU, {sim['seconds']:.1f} s): peak {sim['peak_bytes']:,} bytes ({human_bytes(sim['peak_bytes'])}): "
          f"{kinds}")
    print(f"  module buffers ({sim['buffers_bytes']:,} bytes) are in the peak; the forward saved "
          f"{sim['saved_bytes']:,} bytes for backward ({human_bytes(sim['saved_bytes'])})")
    print(f"  no prediction: {refusal}")
    return 0


def render_simulation(sim: dict) -> str:
    from trainmath.render import human_bytes

    measured = sim["peak_bytes"] - sim["buffers_bytes"]
    kinds = ", ".join(f"{k} {human_bytes(v)}" for k, v in sim["by_kind"].items() if v)
    rel = 100 * sim["difference_bytes"] / measured if measured else 0.0
    return "\n".join([
        "",
        f"simulated (transformers on fake tensors under MemTracker, CPU, {sim['seconds']:.1f} s): peak "
        f"{sim['peak_bytes']:,} bytes ({human_bytes(sim['peak_bytes'])}): {kinds}",
        f"  loop: {sim['loop']}; peak at {sim['peak_segment']}",
        *([f"  {sim['folded']}"] if sim.get("folded") else []),
        f"  less module buffers ({sim['buffers_bytes']:,} bytes, not modelled): {measured:,}",
        f"  predicted with --device cpu: {sim['predicted_cpu_peak_bytes']:,} at "
        f"{sim['predicted_cpu_peak_event']!r}; difference {sim['difference_bytes']:+,} bytes ({rel:+.2f}%)",
        *(f"  {line}" for line in sim.get("routing", ())),
    ])


def render(report, *, explain: bool = False) -> str:
    """The breakdown: its non-zero terms and the loop's convention (the one that moves the peak most often);
    ``explain``: every term and every convention."""
    from trainmath.render import human_bytes, table

    s, lay = report.setup, report.layout
    peak = report.peak_bytes
    lines = [f"{report.model}: training memory per GPU",
             f"  micro-batch {s.micro_batch} × seq {s.seq}, {s.precision}, {s.optimizer} ({s.optimizer_impl}), "
             f"recompute {s.recompute}, attention {s.attention}, profile {s.profile}, "
             f"grad lifetime {s.grad_lifetime}, device {s.device}",
             f"  {lay.describe()}  ({lay.ranks} GPU{'' if lay.ranks == 1 else 's'})", ""]
    rows = []
    for node in report.breakdown.children:
        if not node.value and not explain:
            continue
        share = f"{100 * node.value / peak:.1f}%" if peak else "-"
        rows.append([node.name, f"{node.value:,}", human_bytes(node.value), share, node.note])
        if node.name == "activations_bytes" and len(node.children) > 1:
            for c in node.children:
                rows.append([f"  {c.name}", f"{c.value:,}", human_bytes(c.value), "", ""])
    rows.append(["peak_bytes", f"{peak:,}", human_bytes(peak), "100.0%", report.breakdown.note])
    lines.append(f"  peak at {report.stages[report.stage].phase!r} (stage {report.stage}); --timeline prints "
                 f"every event")
    m = report.stages[report.stage]
    fwd = [e for e in m.timeline if e.kind.in_forward]
    if fwd:  # what this rank has saved for backward when its forward ends (activations and, last stage, the head)
        end = fwd[-1].live
        kept = end.activations_bytes.value + end.logits_bytes
        lines.append(f"  saved for backward on this rank at {fwd[-1].name!r}: {kept:,} bytes ({human_bytes(kept)}): "
                     f"activations and the head's saved tensors and logits")
    lines.append("")
    lines.append(table(["term", "bytes", "GiB (2**30)", "share", ""], rows, align="lrrrl"))
    if len(report.stages) > 1:
        lines.append("")
        srows = [[m.stage, f"{m.layers.start}-{m.layers.stop - 1}", m.in_flight, m.phase,
                  f"{m.breakdown.value:,}", human_bytes(m.breakdown.value)] for m in report.stages]
        lines.append(table(["stage", "layers", "in flight", "peak event", "peak bytes", "GiB"], srows))
    lines.append("")
    lines.append("outside peak_bytes (not tensors; measured at run time): CUDA context, allocator cached-free memory")
    if explain:
        lines.extend(f"convention: {c}" for c in report.conventions)
    else:
        loop = [c for c in report.conventions if c.startswith("the loop keeps")]
        lines.extend(f"convention: {c}" for c in loop)
        lines.append(f"{len(report.conventions) - len(loop)} more conventions and the zero terms: --explain")
    return "\n".join(lines)


def render_timeline(report) -> str:
    """The peak stage's timeline: one row per event, the peak marked."""
    from trainmath.render import human_bytes, table

    m = report.stages[report.stage]
    rows = [[e.name, f"{e.bytes:,}", human_bytes(e.bytes), "<- peak" if e.name == m.phase else ""]
            for e in m.timeline]
    head = f"{report.model}: bytes live at each event of one step (stage {m.stage}, {report.setup.grad_lifetime})"
    return head + "\n" + table(["event", "bytes", "GiB (2**30)", ""], rows, align="lrrl")


def render_host(host) -> str:
    """The host RAM line of an offloaded job and its terms."""
    from trainmath.render import human_bytes

    terms = ", ".join(f"{n.name.removesuffix('_bytes')} {human_bytes(n.value)}" for n in host.per_rank.children
                      if n.value)
    return (f"host RAM per node: {host.host_bytes:,} bytes ({human_bytes(host.host_bytes)}) = {host.ranks_per_node} "
            f"rank{'s' if host.ranks_per_node > 1 else ''} x {human_bytes(host.per_rank.value)} ({terms})\n"
            + "\n".join(f"  {c}" for c in host.conventions))


def render_fit(v) -> str:
    """The verdict line (GPU and, with offload, host), and when it does not fit, one line per lever re-run."""
    from trainmath.render import human_bytes

    cap = f"{v.gpu.name} ({human_bytes(v.capacity_bytes)} = {v.capacity_bytes:,} bytes usable; GiB = 2**30 bytes, " \
          f"the datasheet's 'GB' read as GiB)"
    host = []
    if v.host is not None:
        h = v.host
        host = [(f"host RAM fits: margin {human_bytes(h.margin_bytes)} ({h.margin_bytes:,} bytes)" if h.fits else
                 f"host RAM does NOT fit: short by {human_bytes(-h.margin_bytes)} ({-h.margin_bytes:,} bytes)"),
                h.rule]
    if v.fits:
        return "\n".join([f"fits {cap}: margin {human_bytes(v.margin_bytes)} ({v.margin_bytes:,} bytes)", v.rule,
                          *host])
    if v.gpu_fits:
        lines = [f"does NOT fit: the host RAM is exceeded (the GPU fits {cap}: margin "
                 f"{human_bytes(v.margin_bytes)})", v.rule, *host]
    else:
        lines = [f"does NOT fit {cap}: short by {human_bytes(-v.margin_bytes)} ({-v.margin_bytes:,} bytes)", v.rule,
                 *host]
    good = [lv for lv in v.levers if lv.fits]
    lines.append("would fit with: " + (", ".join(f"{lv.name} ({human_bytes(lv.peak_bytes)})" for lv in good)
                                       if good else "none of the single levers below"))
    unbuilt: dict[str, list[str]] = {}  # reason -> the levers it stops: one line per reason, in lever order
    rows: list[str | None] = []  # None: the place of the next reason's line
    for lv in v.levers:
        if lv.peak_bytes is None:
            if lv.reason not in unbuilt:
                rows.append(None)
            unbuilt.setdefault(lv.reason, []).append(lv.name)
        else:
            rows.append(f"  {lv.name}: peak {human_bytes(lv.peak_bytes)} -> {'fits' if lv.fits else 'does not fit'}"
                        + (f" ({lv.reason})" if lv.reason else ""))
    reasons = iter(unbuilt.items())
    for row in rows:
        if row is None:
            reason, names = next(reasons)
            row = f"  {', '.join(names)}: cannot be built here: {reason}"
        lines.append(row)
    return "\n".join(lines)
