"""Step time and utilisation of a training job: compute from the FLOPs ledger at a per-generation efficiency,
communication by scheme on a two-level topology, the pipeline bubble and the optimizer step. Pure calculator."""

from trainmath.perf.job import Estimate, Job, job_problems
from trainmath.perf.step import BREAKDOWN, estimate

__all__ = ["BREAKDOWN", "Estimate", "Job", "estimate", "job_problems"]
