"""Continuous batching at a fixed concurrency, and the KV capacity a vLLM engine computes. Pure.

**KV capacity (``--engine vllm``).** vLLM profiles the model once and gives the cache what is left of
``gpu_memory_utilization`` × the device memory (vllm/v1/worker/gpu_worker.py ``determine_available_memory``):

    available = ⌈memory · gpu_memory_utilization⌉ − weights − activation peak − non-torch − CUDA graphs

then cuts it into blocks of ``block_size`` (16) tokens of every layer's cache and logs, in
vllm/v1/core/kv_cache_utils.py ``_report_kv_cache_config`` (vllm-project/vllm@001cabc1be16a59a70d720ed61a13b678c060a18):
``"Maximum concurrency for %s tokens per request: %.2fx"`` with the request length written with thousands
separators, the concurrency being the blocks held / the blocks one request of ``max_model_len`` tokens needs
(``get_max_concurrency_for_kv_cache_config``). Here the request length is I + O. The activation peak of the
profile run (``max_num_batched_tokens`` tokens through the widest layer, and the sampler's fp32 logits for
``max_num_seqs`` sequences), the non-torch memory (CUDA context, NCCL buffers) and the CUDA-graph pool are
assumptions, printed with the result.

**Continuous batching** (``vllm bench serve --max-concurrency C``): C requests are in flight; a finished one is
replaced at once. In the steady state every step decodes the running requests and prefills arriving prompts in
chunks, within a budget of ``max_num_batched_tokens`` tokens per step (decodes first, as vLLM's scheduler does).
A request spends L = O − 1 + p steps in flight, p = ⌈I / (M − d)⌉ of them prefilling; the mean step holds
d = C · (O − 1) / L decoding sequences at the mean context I + O/2 and C · I / L prefill tokens at the mean prefix
I/2. TPOT is that step's time (prefills interleaved), TTFT half a step (a prompt arrives mid-step) plus the p
steps that carry its chunks beside the decodes, e2e = TTFT +
(O − 1)·TPOT, and the output throughput C · O / e2e. Past the KV capacity only that many run; the rest queue, and
a request's time in the system grows by C / capacity (Little's law).

A prompt also waits for the prompts that arrived before it: the prefill budget is a server whose service time per
prompt is S = p · (chunk step) / k, k = ⌊chunk / I⌋ whole prompts fitting one step (at least 1); prompts arrive
at λ = running / e2e (each finished request is replaced at once), utilisation ρ = λ·S, and the mean wait is the
M/D/1 (Pollaczek–Khinchine) one, ρ·S / (2(1 − ρ)), added to the TTFT (ρ capped at 0.95). Clients with a fixed
concurrency arrive more regularly than Poisson, so this bounds the wait from above; it is what NIM's and
AIPerf's TTFT ("includes queueing in the server") measure below the KV capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainmath.errors import TrainmathError
from trainmath.hardware import GPU
from trainmath.infer.memory import InferenceSetup
from trainmath.infer.speed import Efficiency, Part, Step, step
from trainmath.model.spec import ModelSpec

BLOCK_TOKENS = 16
"""vLLM's default ``block_size`` on CUDA."""
MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs``: the sampler warm-up of the profile run uses this many sequences."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineMemory:
    """Assumptions of the vLLM memory profile, each printed."""

    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 8192
    non_torch_bytes: int = 1 << 30
    """CUDA context, NCCL and cuBLAS workspaces: vLLM measures this; 1 GiB assumed."""
    cuda_graph_bytes: int = 1 << 30
    """CUDA-graph pool: vLLM estimates it at start-up; 1 GiB assumed."""

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise TrainmathError(f"gpu memory utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_num_batched_tokens < 1:
            raise TrainmathError(f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Capacity:
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    available_bytes: int
    request_tokens: int
    request_bytes: int
    """Cache one request of ``request_tokens`` holds on one rank, in whole blocks."""
    max_concurrency: float
    engine: EngineMemory

    def log_line(self) -> str:
        return f"Maximum concurrency for {self.request_tokens:,} tokens per request: {self.max_concurrency:.2f}x"

    def conventions(self) -> list[str]:
        e = self.engine
        return [f"vLLM memory profile: gpu_memory_utilization {e.gpu_memory_utilization}, blocks of {BLOCK_TOKENS} "
                f"tokens, activation peak of a {e.max_num_batched_tokens:,}-token profile run "
                f"{self.activation_bytes:,} bytes (widest layer in and out, bf16, + fp32 logits of {MAX_NUM_SEQS} "
                f"sequences), non-torch {e.non_torch_bytes:,} bytes and CUDA graphs {e.cuda_graph_bytes:,} bytes "
                f"(assumed)"]

    def to_dict(self) -> dict:
        return {"requested_bytes": self.requested_bytes, "weights_bytes": self.weights_bytes,
                "activation_peak_bytes": self.activation_bytes, "non_torch_bytes": self.engine.non_torch_bytes,
                "cuda_graph_bytes": self.engine.cuda_graph_bytes, "kv_cache_available_bytes": self.available_bytes,
                "request_tokens": self.request_tokens, "request_cache_bytes": self.request_bytes,
                "max_concurrency": self.max_concurrency, "log_line": self.log_line()}


def activation_peak(spec: ModelSpec, setup: InferenceSetup, tokens: int) -> int:
    """Bytes of the profile run's largest live activations on one rank: ``tokens`` rows through the widest
    column-parallel output of any layer (its input and output, bf16), plus fp32 logits of ``MAX_NUM_SEQS``."""
    widest = spec.hidden_size
    for layer in spec.layers:
        for t in layer.tensors:
            if len(t.shape) == 2 and not t.experts:
                widest = max(widest, t.shape[0] // setup.tp)
    return tokens * (spec.hidden_size + widest) * 2 + MAX_NUM_SEQS * spec.vocab_size * 4


def vllm_capacity(spec: ModelSpec, setup: InferenceSetup, gpu: GPU, *, request_tokens: int,
                  engine: EngineMemory) -> Capacity:
    """The KV capacity of a vLLM engine in requests of ``request_tokens`` (module docstring)."""
    from trainmath.infer.kv import cache_tree
    from trainmath.infer.weights import weights_tree

    requested = math.ceil(gpu.memory_bytes * engine.gpu_memory_utilization)
    weights = weights_tree(spec, fmt=setup.weights, tp=setup.tp, ep=setup.ep, gpus=setup.ranks).value
    act = activation_peak(spec, setup, engine.max_num_batched_tokens)
    available = requested - weights - act - engine.non_torch_bytes - engine.cuda_graph_bytes
    blocks_tokens = -(-request_tokens // BLOCK_TOKENS) * BLOCK_TOKENS
    per_request = cache_tree(spec, batch=1, context=blocks_tokens, fmt=replace(setup.cache, sliding_tokens="window"),
                             tp=setup.tp).value
    conc = max(available, 0) / per_request * setup.replicas if per_request else float("inf")
    return Capacity(requested_bytes=requested, weights_bytes=weights, activation_bytes=act,
                    available_bytes=available, request_tokens=request_tokens, request_bytes=per_request,
                    max_concurrency=conc, engine=engine)


@dataclass(frozen=True, kw_only=True, slots=True)
class SteadyState:
    concurrency: int
    running: int
    """Requests the cache holds at once (≤ concurrency; the rest queue)."""
    input: int
    output: int
    budget: int
    prefill_steps: int
    decoding: float
    """Mean decoding sequences per step."""
    prefill_tokens: float
    """Mean prefill tokens per step."""
    step: Step
    floor: Step
    chunk_step: Step
    """A step that carries one of the prompt's chunks beside the mean decodes."""
    chunk_tokens: int = 1
    """Prefill tokens a step has room for beside the decodes."""

    @property
    def tpot_s(self) -> float:
        return self.step.time_s

    @property
    def queue_factor(self) -> float:
        return self.concurrency / self.running

    @property
    def prefill_wait_s(self) -> float:
        """Mean wait for the prompts ahead in the prefill budget (module docstring)."""
        return prefill_wait(self.prefill_steps * self.chunk_step.time_s, max(1, self.chunk_tokens // self.input),
                            self.running, 0.5 * self.tpot_s + self.prefill_steps * self.chunk_step.time_s
                            + (self.output - 1) * self.tpot_s)

    @property
    def ttft_s(self) -> float:
        first = 0.5 * self.tpot_s + self.prefill_steps * self.chunk_step.time_s  # arrives mid-step, then its chunks
        first += self.prefill_wait_s
        return first + (self.queue_factor - 1) * (first + (self.output - 1) * self.tpot_s)

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + (self.output - 1) * self.tpot_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.concurrency * self.output / self.e2e_s

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.tpot_s

    def to_dict(self) -> dict:
        return {"concurrency": self.concurrency, "running": self.running, "queued": self.concurrency - self.running,
                "input": self.input, "output": self.output, "max_num_batched_tokens": self.budget,
                "prefill_steps_per_request": self.prefill_steps, "decoding_per_step": self.decoding,
                "prefill_tokens_per_step": self.prefill_tokens, "prefill_wait_s": self.prefill_wait_s,
                "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "e2e_s": self.e2e_s, "output_tokens_per_s": self.output_tokens_per_s,
                "prefill_tokens_per_s": self.prefill_tokens_per_s, "tpot_bound": self.step.bound,
                "step": self.step.to_dict(), "floor": {"tpot_s": self.floor.time_s}}


def prefill_wait(prompt_s: float, per_step: int, running: int, e2e_s: float) -> float:
    """M/D/1 mean wait of a prompt whose prefill takes ``prompt_s`` (``per_step`` of them share a step) when
    ``running`` requests each take ``e2e_s``: ρ·S / (2(1 − ρ)), S = prompt_s / per_step, ρ = S·running / e2e_s."""
    service = prompt_s / per_step
    rho = min(service * running / e2e_s, 0.95)
    return rho * service / (2 * (1 - rho))


def steady_state(spec: ModelSpec, setup: InferenceSetup, gpu: GPU, *, concurrency: int, input: int, output: int,
                 budget: int = 8192, capacity: float | None = None, eff: Efficiency | None = None) -> SteadyState:
    """Continuous batching of ``concurrency`` requests of ``input`` + ``output`` tokens (module docstring)."""
    from trainmath.infer.speed import FLOOR

    if concurrency < 1 or input < 1 or output < 1:
        raise TrainmathError(f"concurrency ({concurrency}), --input ({input}) and --output ({output}) must be "
                             "positive")
    eff = eff or Efficiency.of(gpu)
    running = concurrency if capacity is None else max(1, min(concurrency, int(capacity)))
    d = 0.0
    for _ in range(20):  # fixed point: the decodes take budget from the prefill chunks
        chunk = max(budget - math.ceil(d), 1)
        p = -(-input // chunk)
        life = output - 1 + p
        d = running * (output - 1) / life
    prefill = running * input / life
    n_dec = max(round(d), 1 if output > 1 else 0)
    per_chunk = min(input, chunk)  # prefill tokens arrive as chunks of whole prompts or of budget-sized pieces
    n_pre = max(1, round(prefill / per_chunk))
    parts = (Part(n=n_dec, t=1, c=input + output // 2),
             Part(n=n_pre, t=max(round(prefill / n_pre), 1), c=0 if p == 1 else input // 2))
    s = step(spec, replace(setup, batch=running), gpu, parts, eff)
    f = step(spec, replace(setup, batch=running), gpu, parts, FLOOR)
    mine = Part(n=1, t=min(input, chunk), c=0 if p == 1 else input // 2)
    c = step(spec, replace(setup, batch=running), gpu, (parts[0], mine), eff)
    return SteadyState(concurrency=concurrency, running=running, input=input, output=output, budget=budget,
                       prefill_steps=p, decoding=d, prefill_tokens=prefill, step=s, floor=f,
                       chunk_step=c, chunk_tokens=chunk)
