"""SLO sizing: the deployments (TP × EP × replicas × concurrency per replica) that serve ``qps`` requests/s of
I + O tokens with TTFT ≤ ``ttft_slo`` and TPOT ≤ ``tpot_slo``, fewest GPUs first. Pure.

For each instance layout that holds the weights (tensor parallel over 1..8 GPUs of a node; for MoE also expert
parallel with attention data parallel over 1..``gpus_max`` GPUs), the concurrency per instance is the largest C
whose continuous-batching steady state (``infer.batching``) meets both SLOs, within the vLLM KV capacity: TPOT
grows with C, so a bisection finds it. One instance then serves X = C / e2e requests/s (Little's law: in flight
= throughput × time in the system), so ``replicas = ⌈qps / X⌉`` and GPUs = replicas × instance GPUs. The binding
constraint is what stops C from growing: the TPOT SLO, the TTFT SLO, the KV cache, or the engine's max_num_seqs.
When no layout meets the SLOs even at C = 1, the closest (the smallest worst ratio of prediction to SLO) is
reported and the caller exits 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainmath.errors import TrainmathError
from trainmath.hardware import GPU
from trainmath.infer.batching import MAX_NUM_SEQS, EngineMemory, SteadyState, steady_state, vllm_capacity
from trainmath.infer.memory import InferenceSetup, has_routed_experts
from trainmath.model.spec import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Deployment:
    tp: int
    ep: int
    instance_gpus: int
    replicas: int
    concurrency: int
    """Requests in flight per instance."""
    state: SteadyState
    binding: str
    meets: bool
    worst_ratio: float
    """max(TTFT / SLO, TPOT / SLO) at this concurrency (≤ 1 when it meets)."""

    @property
    def gpus(self) -> int:
        return self.instance_gpus * self.replicas

    @property
    def requests_per_s(self) -> float:
        return self.concurrency / self.state.e2e_s

    def cost_per_million_output_tokens(self, price_per_gpu_hour: float, qps: float) -> float:
        return self.gpus * price_per_gpu_hour / 3600 / (qps * self.state.output) * 1e6

    def to_dict(self, price: float | None, qps: float) -> dict:
        return {"tp": self.tp, "ep": self.ep, "instance_gpus": self.instance_gpus, "replicas": self.replicas,
                "gpus": self.gpus, "concurrency_per_instance": self.concurrency, "ttft_s": self.state.ttft_s,
                "tpot_s": self.state.tpot_s, "e2e_s": self.state.e2e_s,
                "requests_per_s_per_instance": self.requests_per_s, "binding": self.binding, "meets": self.meets,
                "worst_slo_ratio": self.worst_ratio,
                "cost_per_1m_output_tokens": None if price is None else
                self.cost_per_million_output_tokens(price, qps)}


def layouts(spec: ModelSpec, gpu: GPU, gpus_max: int) -> list[tuple[int, int, int]]:
    """(tp, ep, instance GPUs) to try: TP within a node; for MoE, EP with attention data parallel."""
    from trainmath.infer.weights import validate_tp

    out = []
    for tp in (1, 2, 4, 8, 16):
        if tp > min(gpus_max, gpu.gpus_per_node):
            break
        try:
            validate_tp(spec, tp)
        except TrainmathError:
            continue
        out.append((tp, 1, tp))
    if has_routed_experts(spec):
        g = 2
        while g <= gpus_max:
            out.append((1, g, g))
            g *= 2
    return out


def plan(spec: ModelSpec, setup: InferenceSetup, gpu: GPU, *, qps: float, input: int, output: int,
         ttft_slo: float, tpot_slo: float, gpus_max: int = 64, engine: EngineMemory | None = None,
         top: int = 5) -> tuple[list[Deployment], Deployment | None]:
    """(deployments meeting both SLOs, fewest GPUs first; the closest one when none does)."""
    for what, v in (("--qps", qps), ("--ttft-slo", ttft_slo), ("--tpot-slo", tpot_slo)):
        if not (math.isfinite(v) and v > 0):
            raise TrainmathError(f"{what} must be a positive finite number, got {v}")
    engine = engine or EngineMemory()
    found, closest = [], None
    for tp, ep, g in layouts(spec, gpu, gpus_max):
        s = replace(setup, tp=tp, ep=ep, gpus=g, batch=1)
        cap = vllm_capacity(spec, s, gpu, request_tokens=input + output, engine=engine)
        if cap.max_concurrency < 1:
            continue
        limit = min(int(cap.max_concurrency), MAX_NUM_SEQS * s.replicas)

        def at(c: int) -> SteadyState:
            return steady_state(spec, s, gpu, concurrency=c, input=input, output=output,
                                budget=engine.max_num_batched_tokens, eff=None)

        def ratio(st: SteadyState) -> float:
            return max(st.ttft_s / ttft_slo, st.tpot_s / tpot_slo)

        one = at(1)
        if ratio(one) > 1:
            d = Deployment(tp=tp, ep=ep, instance_gpus=g, replicas=1, concurrency=1, state=one,
                           binding="TTFT SLO" if one.ttft_s / ttft_slo >= one.tpot_s / tpot_slo else "TPOT SLO",
                           meets=False, worst_ratio=ratio(one))
            if closest is None or d.worst_ratio < closest.worst_ratio:
                closest = d
            continue
        lo, hi = 1, limit + 1  # at(lo) meets; hi does not or is past the limit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ratio(at(mid)) <= 1 else (lo, mid)
        st = at(lo)
        if lo == limit:
            binding = "KV cache" if limit == int(cap.max_concurrency) else "max_num_seqs"
        else:
            nxt = at(lo + 1)
            binding = "TPOT SLO" if nxt.tpot_s > tpot_slo else "TTFT SLO"
        x = lo / st.e2e_s
        replicas = max(1, math.ceil(qps / x))
        # at the needed load an instance runs fewer requests in flight: Little's law with its share of the qps
        found.append(Deployment(tp=tp, ep=ep, instance_gpus=g, replicas=replicas, concurrency=lo, state=st,
                                binding=binding, meets=True, worst_ratio=ratio(st)))
    found.sort(key=lambda d: (d.gpus, d.state.tpot_s))
    return found[:top], (None if found else closest)
