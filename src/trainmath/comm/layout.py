"""The process table of ``trainmath comm layout``: which process is which rank on which node and GPU.

A torchrun-style launch over ``nnodes`` nodes with ``nproc_per_node`` processes each numbers processes node by
node: global rank = node · nproc_per_node + local rank, and each process drives local GPU = local rank.
A subgroup renumbers its members 0..k-1 in the order of their global ranks (``torch.distributed.new_group``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError


@dataclass(frozen=True, kw_only=True)
class ProcessRow:
    process_id: int
    """The process's index in the whole job (equal to its global rank)."""
    rank: int
    """Rank in the group the table describes (the global rank for the default group)."""
    node: int
    """Node index (torchrun's node rank / GROUP_RANK)."""
    local_gpu: int
    """Local rank on its node, which is the GPU index it drives."""


def world_table(nnodes: int, nproc_per_node: int) -> list[ProcessRow]:
    """One row per process of the default group (world)."""
    if nnodes < 1 or nproc_per_node < 1:
        raise TrainmathError(f"need nnodes >= 1 and nproc-per-node >= 1, got {nnodes} and {nproc_per_node}")
    return [
        ProcessRow(process_id=p, rank=p, node=p // nproc_per_node, local_gpu=p % nproc_per_node)
        for p in range(nnodes * nproc_per_node)
    ]


def subgroup_table(world: list[ProcessRow], ranks: list[int]) -> list[ProcessRow]:
    """Rows of the subgroup made of global ``ranks``, renumbered 0..k-1 by ascending global rank."""
    members = sorted(set(ranks))
    if not members or members[0] < 0 or members[-1] >= len(world):
        raise TrainmathError(f"subgroup ranks {ranks} must be non-empty and within 0..{len(world) - 1}")
    return [
        ProcessRow(process_id=g, rank=i, node=world[g].node, local_gpu=world[g].local_gpu)
        for i, g in enumerate(members)
    ]


def even_ranks(world_size: int) -> list[int]:
    """The blog series' example subgroup: ranks 0, 2, 4, ..."""
    return list(range(0, world_size, 2))
