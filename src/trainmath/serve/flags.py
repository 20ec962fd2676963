"""The page's and the API's fields: the flags of ``trainmath report``, shared by ``app`` and ``page``."""

from __future__ import annotations


def parser():
    """The flags of ``trainmath report`` (without MODEL and -o), raising instead of exiting."""
    from trainmath.report.options import RaisingParser, add_plan_flags, add_serving_flags, add_training_flags

    p = RaisingParser(prog="trainmath serve", add_help=False)
    add_training_flags(p)
    add_serving_flags(p)
    add_plan_flags(p)
    from trainmath.adapters import add_peft_args

    add_peft_args(p)
    return p
