"""Command-line entry point: ``trainmath COMMAND ...``.

Each command lives in its own module exposing ``register(subparsers)``. Only the module of the command being run
is imported (the others appear in ``--help`` through the one-line summaries below, which a test keeps equal to
the modules' own), so ``trainmath params`` pays for nothing else. A module's top level imports only the standard
library and the pure calculator; heavy imports (torch, huggingface_hub, matplotlib) happen inside the command.

A ``TrainmathError`` (bad input, impossible layout) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from trainmath.errors import TrainmathError

# command → (module, one-line summary), in --help order
COMMANDS = {
    "params": ("params", "exact parameter counts per component, per layer type, and activated per token"),
    "models": ("models", "list the bundled catalog of published configs (usable offline)"),
    "plot": ("plot", "charts: parameter shares, memory per GPU, bus bandwidth, step timeline, plan "
                     "(needs matplotlib)"),
    "flops": ("flops", "training FLOPs per GEMM: forward, backward, recompute; per token, sequence and step"),
    "memory": ("memory", "training memory per GPU: weights, grads, optimizer states, activations, transients"),
    "infer": ("infer", "inference memory and speed: weights (bf16/fp8/int8/int4/mxfp4/nvfp4), KV cache, what fits a "
                       "GPU, TTFT and TPOT"),
    "infer-plan": ("infer_plan", "serving SLO sizing: TP x EP x replicas x concurrency meeting TTFT and TPOT at a "
                                 "request rate"),
    "check-checkpoint": ("check_checkpoint", "compare a safetensors checkpoint with the ledger, tensor by tensor "
                                             "(headers only)"),
    "comm": ("comm", "run, check and benchmark torch.distributed collectives"),
    "estimate": ("estimate", "step time, MFU/HFU and memory of one training layout on a GPU cluster; GPU-hours of "
                             "a token budget"),
    "plan": ("plan", "search DP×TP×PP×CP×EP, ZeRO, recompute, micro-batch and virtual stages for the fastest "
                     "layouts that fit"),
    "report": ("report", "one self-contained HTML page: parameters, FLOPs, memory and fit, KV cache, charts"),
    "serve": ("serve", "a local web calculator over the same core (127.0.0.1 by default)"),
    "train": ("train", "train a transformers model with DDP or ZeRO-1/2/3 (torch's or ours), checkpoint, resume"),
    "verify": ("verify", "train and compare the calculator with the measurement, field by field"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that command's module is imported and registered in full."""
    from importlib import import_module

    from trainmath import __version__
    from trainmath.args import Parser

    parser = Parser(
        prog="trainmath",
        description="Exact arithmetic of LLM training and serving, and a torch.distributed runtime to check it.",
    )
    parser.add_argument("--version", action="version", version=f"trainmath {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, summary) in COMMANDS.items():
        if only is None or only == name:
            import_module(f"trainmath.cli.{module}").register(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error already printed in one line (trainmath.args.Parser)
        return e.code if isinstance(e.code, int) else 2
    try:
        return int(args.func(args) or 0)
    except TrainmathError as e:
        print(f"trainmath: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)  # 2 for bad input; 128 + signal for an interrupted launch
    except BrokenPipeError:  # `trainmath ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
