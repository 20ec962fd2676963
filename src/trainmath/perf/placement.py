"""Where each process group of a layout sits on the nodes, which decides the link its collectives use.

Ranks are numbered node by node (torchrun), and groups are cut in Megatron-Core's ``RankGenerator`` order
tp-cp-ep-dp-pp: tensor parallel on consecutive ranks (inside a node), then context parallel, then data parallel
(expert parallel drawn from the cp·dp ranks of one tp slice, or from consecutive ranks across tp when the expert
TP is 1: Megatron-Core's expert grid etp-ep-edp-pp), pipeline parallel outermost (across nodes). A group
of ``size`` ranks ``stride`` apart has ``local`` members on each node it touches: counted exactly for the group
holding rank 0 (every group of the layout is a translate of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from trainmath.comm.twolevel import Group
from trainmath.layout import ParallelLayout


def placed_group(size: int, stride: int, gpus_per_node: int) -> Group:
    """The group {0, stride, 2·stride, ...} of ``size`` ranks: how many of them share node 0."""
    local = min(size, -(-gpus_per_node // stride))  # members i with i·stride < gpus_per_node
    local = gcd(size, max(1, local))  # uneven spans (72-GPU nodes, odd strides): the largest even split
    return Group(size=size, local=local)


@dataclass(frozen=True, kw_only=True)
class Groups:
    """The process groups one rank belongs to, as placed."""

    tp: Group
    cp: Group
    dp: Group
    """Dense data-parallel group, context parallel folded in (dp·cp ranks): gradients and ZeRO shards."""
    ep: Group
    expert_dp: Group
    """Ranks holding the same experts (``ParallelLayout.expert_zero_degree``): expert gradients and ZeRO shards."""
    pp: Group

    def to_dict(self) -> dict:
        return {k: {"size": g.size, "per_node": g.local, "nodes": g.nodes}
                for k, g in (("tp", self.tp), ("cp", self.cp), ("dp", self.dp), ("ep", self.ep),
                             ("expert_dp", self.expert_dp), ("pp", self.pp))}


def place_groups(layout: ParallelLayout, gpus_per_node: int) -> Groups:
    """Groups of ``layout`` on nodes of ``gpus_per_node`` GPUs (order tp-cp-ep-dp-pp)."""
    tp, cp, dp, ep, pp = layout.tp, layout.cp, layout.dp, layout.ep, layout.pp
    return Groups(
        tp=placed_group(tp, 1, gpus_per_node),
        cp=placed_group(cp, tp, gpus_per_node),
        dp=placed_group(dp * cp, tp, gpus_per_node),
        ep=placed_group(ep, layout.expert_tp, gpus_per_node),
        expert_dp=placed_group(layout.expert_zero_degree, layout.expert_tp * ep, gpus_per_node),
        pp=placed_group(pp, tp * cp * dp, gpus_per_node),
    )
