"""The layout planner (``trainmath plan``): search DP×TP×PP×CP×EP, ZeRO, recompute, micro-batch and virtual
stages for the fastest layouts that fit. Pure calculator."""

from trainmath.plan.search import PlanResult, Rejected, plan, reason_category

__all__ = ["PlanResult", "Rejected", "plan", "reason_category"]
