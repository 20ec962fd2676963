"""Communication of one training step, by scheme: bytes, seconds, and what stays exposed.

Each item is one kind of collective repeated ``count`` times per step, on a placed group (``placement``), priced
by the two-level model (``trainmath.comm.twolevel``) at the generation's ``link_fraction`` of each link. Sizes
are nccl-tests' size column (the whole buffer S). Per micro-batch and per layer (b = micro-batch, s = seq, h =
hidden, c = compute bytes):

- ``tp``: Megatron's two all-reduces per transformer block pair in forward (after attention and after the MLP)
  and two in backward, of b·(s/cp)·h·c bytes (Shoeybi et al. 2019, §3, the f/g operators); with sequence
  parallelism each becomes a reduce-scatter + all-gather pair of the same total (Korthikanti et al. 2022, §4.2.2);
  full recompute repeats the forward's. Exposed: Megatron runs them on the compute stream.
- ``cp``: ring attention: cp − 1 steps, each passing the local K and V, b·(s/cp)·2·kv_dim·c bytes, per layer;
  backward passes K, V and their gradients (twice as much). Overlapped with the attention core; the excess is
  exposed (Liu et al. 2023, "Ring Attention", §3; Megatron-Core context parallelism).
- ``ep``: all-to-all dispatch and combine per MoE layer forward, and again backward: tokens·top_k·h·c bytes per
  rank (Lepikhin et al. 2021, GShard §2.2). Exposed.
- ``pp``: the activation b·(s/cp)·h·c (÷ tp under SP or Megatron's scatter-gather) sent forward and its gradient
  backward at each stage boundary per micro-batch; with 1F1B only the fill and drain, 2·(pp − 1) messages, are on
  the critical path (Narayanan et al. 2021, §4.1).
- ``dp`` (ZeRO 0): gradient all-reduce of the rank's gradients (grad dtype), bucketed and overlapped with the
  last micro-batch's backward: exposed = max(one bucket, total − that backward) (PyTorch DDP, Li et al. 2020
  VLDB §3.2.3; Megatron ``--overlap-grad-reduce``).
- ZeRO 1/2: gradient reduce-scatter (overlapped the same way) and the parameter all-gather after the optimizer
  step (weight dtype), overlapped with the next step's forward except one bucket (Rajbhandari et al. 2020, §5;
  Megatron distributed optimizer ``--overlap-param-gather``).
- ZeRO 3 / FSDP: per micro-batch, an all-gather of each layer's parameters in forward and again in backward, and a
  reduce-scatter of its gradients, each prefetched behind the previous layer's compute: exposed is the per-layer
  excess over that compute (Zhao et al. 2023, "PyTorch FSDP", §3.3).
Expert parameters use the expert data-parallel group (dp·cp / ep ranks) for the same schemes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trainmath.comm.twolevel import Group, Topology
from trainmath.comm.twolevel import time_s as _time_s


@lru_cache(maxsize=65536)
def time_s(op: str, size: float, group: Group, topo: Topology) -> float:
    """``trainmath.comm.twolevel.time_s`` with the ``auto`` algorithm, memoised: the planner prices the same
    collectives for thousands of candidates."""
    return _time_s(op, size, group, topo)

BUCKET_BYTES = 25 * 2**20
"""PyTorch DDP's default ``bucket_cap_mb`` (25 MiB): the part of the gradient sync that cannot hide."""


@dataclass(frozen=True, kw_only=True)
class CommItem:
    """One kind of collective in a step."""

    name: str
    """Breakdown key it is charged to (``tp_comm``, ``dp_grad_sync``, ...)."""
    op: str
    group: str
    group_size: int
    link: str
    """``intra`` (inside a node), ``inter`` (across nodes) or ``both`` (hierarchical)."""
    size_bytes: float
    """One collective's S."""
    count: int
    """How many per step."""
    time_s: float
    """All of them, end to end."""
    exposed_s: float
    """What the step waits for."""

    @property
    def bytes_per_step(self) -> float:
        return self.size_bytes * self.count

    def to_dict(self) -> dict:
        return {"name": self.name, "op": self.op, "group": self.group, "group_size": self.group_size,
                "link": self.link, "size_bytes": self.size_bytes, "count": self.count,
                "bytes_per_step": self.bytes_per_step, "time_s": self.time_s, "exposed_s": self.exposed_s}


def link_of(group: Group) -> str:
    if group.size == 1:
        return "none"
    if group.nodes == 1:
        return "intra"
    return "inter" if group.local == 1 else "both"


def item(name: str, op: str, group_name: str, group: Group, size: float, count: int, topo: Topology,
         hidden_behind_s: float | None = None, floor_s: float = 0.0) -> CommItem:
    """``count`` collectives of S = ``size``; exposed = all of them, or max(floor, total − what hides them)."""
    one = time_s(op, size, group, topo) if group.size > 1 and size > 0 else 0.0
    total = one * count
    exposed = total if hidden_behind_s is None else min(total, max(floor_s, total - hidden_behind_s))
    return CommItem(name=name, op=op, group=group_name, group_size=group.size, link=link_of(group), size_bytes=size,
                    count=count, time_s=total, exposed_s=exposed)


def bucket_floor_s(op: str, size: float, group: Group, topo: Topology) -> float:
    """The last bucket's time: what stays exposed when everything else hides behind compute."""
    if group.size == 1 or size <= 0:
        return 0.0
    return time_s(op, min(size, BUCKET_BYTES), group, topo)
