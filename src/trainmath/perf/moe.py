"""Mixture-of-experts terms of the step: the grouped expert GEMMs at their per-expert token counts, the token
permutation and router, the load imbalance, and the fixed cost per local expert of each MoE layer.

Megatron-Core's all-to-all token dispatcher (``megatron/core/transformer/moe/token_dispatcher.py``,
``MoEAlltoAllTokenDispatcher``) runs, per MoE layer and micro-batch, forward:

    router (GEMM h → experts, softmax, top-k) → permute (gather each token top_k times, grouped by expert)
    → all-to-all dispatch over the EP group → sort the received chunks by local expert
    → grouped GEMMs (fc1, activation, fc2) → sort back → all-to-all combine → unpermute (weighted sum of top_k)

and the same in reverse in backward. Each term here is one small function; ``trainmath.perf.compute`` calls
:func:`expert_gemm_time_s` for the routed experts and :func:`dispatch_memory_s` for the permutations and router,
``trainmath.perf.step`` scales the EP all-to-all by the imbalance and adds :func:`overhead_s` (per local expert).

Conventions (printed with every estimate, :func:`moe_text`):

- **Load imbalance** ``moe_imbalance`` = tokens routed to the busiest EP rank / the mean (1.0: balanced, as the
  Megatron-Bridge benchmarks force it, "token distribution is force-balanced and dropless"). The busiest rank sets
  the pace: its expert GEMMs, its received-token permutations and its all-to-all carry ``moe_imbalance`` × the
  mean. A capacity factor ``c`` with token dropping bounds it at ``c`` (GShard, Lepikhin et al. 2021 §2.2).
- **Grouped GEMM**: one kernel over the rank's experts (Megatron-Core ``GroupedMLP`` / TE ``GroupedLinear``);
  its efficiency in the token dimension is m / (m + ``GROUPED_GEMM_HALF_TOKENS``) with m the tokens per local
  expert, fitted to DeepGEMM's published grouped-GEMM table (``benchmarks/moe_gemm_fit.py``); the other two
  dimensions use the generation's dense curve.
"""

from __future__ import annotations

from trainmath.hardware import GPU, Efficiency

GROUPED_GEMM_HALF_TOKENS = 112
"""Tokens per expert at which a grouped GEMM reaches half its large-m efficiency: fitted (grid 16–512 by 16, least
squares on the ratio to the largest-m figure of each (n, k) shape) to the 10 M-grouped FP8 figures of DeepGEMM's
README (H800; tests/perf/published_grouped_gemm.json, ``benchmarks/moe_gemm_fit.py``). Taken for every
generation and for BF16 too (an assumption: no BF16 or Blackwell grouped-GEMM table was found with its shapes)."""

PERMUTE_PASSES = 6
"""Copies of the routed tokens (tokens · top_k · hidden elements) that one forward reads or writes in permutations:
permute writes them (1), sorting the received chunks by local expert reads and writes them (2), sorting back
reads and writes them (2), unpermute reads them (1) — derived from Megatron-Core's ``moe_utils.permute``,
``sort_chunks_by_idxs`` and ``unpermute``; the unrouted input read by permute and the output written by unpermute
add 2 copies of tokens · hidden. Backward moves the same again."""

ROUTER_BYTES_PER_LOGIT = 16
"""HBM bytes per router logit (tokens · experts) forward, FP32: write the logits (4), softmax reads them and writes
the probabilities (4 + 4), top-k reads those (4) — derived; backward twice that."""

OVERHEAD: dict[str, float] = {"hopper": 0.000215, "blackwell": 0.000205}
"""Per GPU generation: seconds per *local expert* per MoE layer per micro-batch per pass (forward, backward,
recompute) that the expert computation costs besides its FLOPs and bytes. Transformer Engine's ``GroupedLinear``
(Megatron-Core's ``TEGroupedMLP``) splits its input by a host list of per-expert token counts and runs one GEMM
per local expert for fprop, dgrad and wgrad, with a per-expert weight cast under FP8
(NVIDIA/TransformerEngine ``transformer_engine/pytorch/module/grouped_linear.py``@3ea1356: ``num_gemms =
len(m_splits)``, ``torch.split(inp, m_splits)``, ``general_grouped_gemm(..., m_splits=m_splits)`` three times,
``for i in range(num_gemms): module.get_weight_workspace(...)``): launches and small-GEMM tails that grow with
the experts a rank holds (experts / ep), not with its tokens. Megatron-Core's DeepSeek-V3 GB200 report says the
same (NVIDIA/Megatron-LM ``docs/discussions/deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md``
@b6bf017: the MXFP8 grouped GEMM is "multi-stream + cuBLAS"; after CUDA Graphs "only the routed experts part still
has some CPU overhead"; "a large EP can reduce the number of local experts, thereby reducing quantization and
other overheads"). Fitted by ``benchmarks/moe_fit.py`` on the MoE runs of tests/perf/published_runs_more.json
(never per run; two sources for each generation), whose ranks hold 2 to 32 experts: more (ep 1 on a 128-expert
model holds 128) is an extrapolation. Taken for torchtitan's runs too (one ``grouped_mm`` kernel: an assumption the
leave-one-source-out error measures)."""


def grouped_efficiency(tokens_per_expert: float) -> float:
    """The grouped GEMM's efficiency factor in the token dimension: m / (m + GROUPED_GEMM_HALF_TOKENS)."""
    m = max(tokens_per_expert, 0.0)
    return m / (m + GROUPED_GEMM_HALF_TOKENS)


def expert_gemm_time_s(m: float, k: float, n: float, experts: int, flops: float, gpu: GPU, eff: Efficiency,
                       dtype: str = "bf16", element_bytes: int = 2, out_bytes: int | None = None,
                       imbalance: float = 1.0) -> float:
    """Seconds of one grouped GEMM over ``experts`` local experts of (m, k) @ (k, n) each, ``flops`` in total
    (mean tokens), on the busiest EP rank (``imbalance`` × the mean tokens). Roofline as
    ``compute.gemm_time_s``: the slower of compute at ``gemm_peak_fraction`` · grouped_efficiency(m) · u(k) · u(n)
    (u(d) = d / (d + gemm_half_dim)) and streaming every expert's weights once plus the tokens' inputs and outputs
    through HBM."""
    if flops <= 0:
        return 0.0
    m_busy = m * imbalance
    h = eff.gemm_half_dim
    shape = grouped_efficiency(m_busy) * (k / (k + h)) * (n / (n + h))
    compute = flops * imbalance / (gpu.peak_flops_per_s(dtype) * eff.gemm_peak_fraction * shape)
    out = element_bytes if out_bytes is None else out_bytes
    memory = experts * ((m_busy * k + k * n) * element_bytes + m_busy * n * out) / (
        gpu.hbm_bytes_per_s * eff.hbm_fraction)
    return max(compute, memory)


def dispatch_bytes(tokens: float, top_k: int, hidden: int, experts: int, element_bytes: int,
                   imbalance: float = 1.0) -> float:
    """HBM bytes one forward of one MoE layer moves in permutations and routing on the busiest rank (see
    ``PERMUTE_PASSES``, ``ROUTER_BYTES_PER_LOGIT``): the received copies scale with ``imbalance``, the local
    permute/unpermute and the router do not."""
    routed = tokens * top_k * hidden * element_bytes
    local = 2 * routed + 2 * tokens * hidden * element_bytes  # permute write + unpermute read; input + output
    received = (PERMUTE_PASSES - 2) * routed * imbalance  # the two sorts by local expert
    return local + received + ROUTER_BYTES_PER_LOGIT * tokens * experts


CLAMP_HALF_COPIES = (8, 10)
"""(forward, backward) copies of one half of the routed experts' fc1 output (routed rows · f elements) that a
clamped activation (``MoEDims.activation_clamp``, gpt-oss) moves as Megatron-Core runs it:
``weighted_bias_quick_geglu_impl`` clamps in eager PyTorch before its fused kernel, ``x_glu, x_linear =
input.chunk(2, -1)``, ``torch.cat((x_glu.clamp(min=None, max=clamp_value), x_linear.clamp(min=-clamp_value,
max=clamp_value)), -1)`` (NVIDIA/Megatron-LM ``megatron/core/fusions/fused_bias_geglu.py``
@1fb2a0cab0f1d042d12dca011b5015d21f7308fd), with ``activation_func_clamp_value`` 7.0 and
``bias_activation_fusion=True`` in Megatron-Bridge's ``GPTOSSProvider``
(``src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py``@12bc34a8ee308a638d4bfd29401085944d4a468e). Derived:
forward, each clamp reads and writes its half (2 + 2), the cat reads both and writes the joined tensor (2 + 2);
backward, the cat's gradient goes out as views (0), each clamp's backward reads its gradient and its saved input and
writes the gradient (3 + 3), the chunk's backward joins the two halves' gradients (2 + 2)."""


def clamp_bytes(routed_tokens: float, top_k: int, expert_intermediate: int, element_bytes: int,
                imbalance: float = 1.0) -> tuple[float, float]:
    """(forward, backward) HBM bytes of one MoE layer's activation clamp on the busiest rank
    (``CLAMP_HALF_COPIES``): ``routed_tokens`` · top-k · ``imbalance`` rows of ``expert_intermediate`` (this rank's
    share of f) per half."""
    half = routed_tokens * top_k * imbalance * expert_intermediate * element_bytes
    return CLAMP_HALF_COPIES[0] * half, CLAMP_HALF_COPIES[1] * half


def dispatch_memory_s(nbytes: float, gpu: GPU, eff: Efficiency) -> float:
    """``dispatch_bytes`` at ``hbm_fraction`` of the HBM bandwidth."""
    return nbytes / (gpu.hbm_bytes_per_s * eff.hbm_fraction)


def overhead_s(generation: str, moe_layers: int, micro_batches: int, passes: int, local_experts: int) -> float:
    """The fitted per-expert overhead of a step (``OVERHEAD``): e · local experts · MoE layers · micro-batches ·
    passes."""
    return OVERHEAD.get(generation, 0.0) * local_experts * moe_layers * micro_batches * passes


LINKS = {"none": "no link (ep 1: every expert on every rank, no all-to-all)", "intra": "NVLink (inside one node)",
         "inter": "the NICs (one rank per node)",
         "both": "NVLink inside each node and the NICs across nodes"}
"""How ``trainmath.perf.comm.link_of``'s answer reads in the conventions line."""


def moe_text(generation: str, imbalance: float, link: str, ep: int, per_node: int) -> str:
    """The MoE conventions line of an estimate; ``link`` is ``comm.link_of`` of the placed EP group."""
    ep_link = LINKS["none"] if link == "none" else f"{LINKS.get(link, link)}: ep {ep}, {per_node} per node"
    e = OVERHEAD.get(generation, 0.0)
    over = (f"{1e3 * e:.3f} ms per local expert per MoE layer per micro-batch per pass ({generation}, fitted on "
            f"published MoE runs)" if e else f"none ({generation}: no MoE runs fitted)")
    return (f"MoE: load imbalance {imbalance:g} (busiest EP rank's routed tokens / the mean; 1 = balanced) on the "
            f"expert GEMMs, received-token permutations and all-to-all; grouped GEMM efficiency m/(m + "
            f"{GROUPED_GEMM_HALF_TOKENS}) in tokens per expert (DeepGEMM's table); EP all-to-all dispatch and "
            f"combine, forward and backward, on {ep_link}; permutation + router memory-bound; per-expert overhead "
            f"{over}")


DISPATCHERS = ("alltoall", "deepep")
"""EP token dispatchers (``Job.ep_dispatcher``): ``alltoall`` sends each (token, expert) pair to its rank;
``deepep`` (DeepEP's internode kernels) sends a token once per destination node over RDMA and forwards it over
NVLink to that node's ranks (``deepseek-ai/DeepEP csrc/kernels/internode.cu``: the RDMA send count per node is
``total_count += (is_token_in_rank_uint64 != 0)``, one per token whichever of the node's ranks receive it)."""


def deepep_node_share(experts: int, top_k: int, nodes: int) -> float:
    """Cross-node bytes of DeepEP's dispatch over a plain all-to-all's, experts spread evenly over ``nodes``
    and each token's top-k drawn uniformly without replacement: a plain all-to-all sends k·(N − 1)/N copies of a
    token off its node, DeepEP (N − 1)·P(a given node holds at least one of its experts) copies, with
    P = 1 − C(E − E/N, k) / C(E, k)."""
    if nodes <= 1 or top_k <= 0 or experts <= 0:
        return 1.0
    per_node = experts / nodes
    miss = 1.0
    for i in range(top_k):  # C(E − E/N, k) / C(E, k) as a product
        miss *= max(0.0, (experts - per_node - i) / (experts - i))
    return nodes * (1.0 - miss) / top_k


DEEPEP_NIC_FRACTION: dict[str, float] = {"hopper": 0.86}
"""Per GPU generation: the fraction of the NIC's line rate DeepEP's internode dispatch and combine reach, which
prices the cross-node part of a ``deepep`` all-to-all instead of the generation's ``link_fraction`` (NCCL's).
Derived from deepseek-ai/DeepEP ``README.md``@0aaa6744c890c5af051f622252975c4393795000 ("Normal kernels with NVLink
and RDMA forwarding": H800, one CX7 400 Gb/s NIC per GPU, "~50 GB/s maximum bandwidth"; EP 32, four nodes:
dispatch 58 GB/s, combine 57 GB/s "Bottleneck bandwidth (RDMA)"). Its test counts a token's copies to every
node it reaches, its own node's too (``tests/test_internode.py``@058d696b6a96f22826f12c98131944e80585fa82:
``num_rdma_token_sent = rdma_idx.ne(-1).sum()`` over the token's distinct nodes, ``rdma_send_bytes / t``), and
at EP 32 the README's top-4 groups leave all four nodes open, so the NIC carries 3/4 of that count: 43.5 and
42.75 GB/s, 0.87 and 0.855 of 50 GB/s; their mean, 0.86. Only Hopper: no Blackwell figure with its NIC is in the
README."""

OVERLAP_COMM_SMS = 20
"""SMs the communication kernels hold while the combined-1F1B overlap (``Job.ep_overlap``) runs them beside the
other micro-batch's compute: Megatron-MoE-ModelZoo reserves 20 for it (yanring/Megatron-MoE-ModelZoo
``model_configs/benchmarking/Qwen3-235B-A22B.yaml``@1ed4179f72e4873bc246501a976ed21628e99582: "# !Used for 1F1B
overlap", ``NVTE_FWD_LAYERNORM_SM_MARGIN: 20``, ``NVTE_BWD_LAYERNORM_SM_MARGIN: 20``); DeepEP's
normal kernels take a set SM count (``README.md``@0aaa674: "they support SM (Streaming Multiprocessors) number
control", ``Buffer.set_num_sms(24)`` in its example)."""

SMS: dict[str, int] = {"hopper": 132}
"""SMs per GPU, per generation: "The H100 SXM5 GPU has 132 SMs" (NVIDIA, "NVIDIA Hopper Architecture In-Depth"
and the H100 Tensor Core GPU Architecture whitepaper). Generations without an entry pay no overlap contention."""


def overlap_sm_share(generation: str) -> float:
    """The share of the SMs the overlapped all-to-all's kernels take from the compute beside them
    (``OVERLAP_COMM_SMS`` / ``SMS``); 0 where the generation's SM count is not recorded. While the two run
    together, compute progresses at 1 − share of its rate (an assumption: the GEMMs scale with the SMs they
    hold)."""
    sms = SMS.get(generation)
    return OVERLAP_COMM_SMS / sms if sms else 0.0
