"""Command-line entry point: ``trainmath COMMAND ...``.

Each command lives in its own module exposing ``register(subparsers)``; the module's top level imports only
the standard library and the pure calculator, so ``trainmath params`` starts fast. Heavy imports (torch,
huggingface_hub, matplotlib) happen inside the command that needs them.

A ``TrainmathError`` (bad input, impossible layout) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from trainmath.errors import TrainmathError

# Order here is the order in --help.
_COMMANDS = ("params", "models", "plot", "flops", "memory", "infer", "check_checkpoint", "comm")


def build_parser() -> argparse.ArgumentParser:
    from importlib import import_module

    parser = argparse.ArgumentParser(
        prog="trainmath",
        description="Exact arithmetic of LLM training and serving, and a torch.distributed runtime to check it.",
    )
    from trainmath import __version__

    parser.add_argument("--version", action="version", version=f"trainmath {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMANDS:
        import_module(f"trainmath.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TrainmathError as e:
        print(f"trainmath: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `trainmath ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
