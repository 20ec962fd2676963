"""The layout planner (``trainmath plan``): search DP×TP×PP×CP×EP, ZeRO, recompute, micro-batch and virtual
stages for the fastest layouts that fit; a fine-tune's layouts with ``--peft`` (``plan.peft``). Pure calculator."""

from trainmath.plan.peft import plan_job as plan
from trainmath.plan.search import PlanResult, Rejected, reason_category

__all__ = ["PlanResult", "Rejected", "plan", "reason_category"]
