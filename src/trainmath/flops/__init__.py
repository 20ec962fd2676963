"""FLOPs per GEMM of a training step (``count_flops``), with the 6N + attention closed form beside it."""

from trainmath.flops.closed_form import ClosedForm, closed_form_flops
from trainmath.flops.model import FlopsReport, count_flops
from trainmath.ops.gemm import Gemm

__all__ = ["ClosedForm", "FlopsReport", "Gemm", "closed_form_flops", "count_flops"]
