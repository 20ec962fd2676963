"""Collectives on a two-level topology: GPUs inside a node on one fabric (NVLink, PCIe), nodes on a network.

Each level is an α–β link per GPU and direction (:class:`trainmath.comm.cost.Link`). A group of ``n`` ranks has
``local`` of them on each node it spans (``nodes = n / local``); the layout's placement decides both (TP inside a
node first, then CP/EP, then DP/PP across nodes: ``trainmath.perf.placement``). The functions are the math twins of
the runtime's collectives, named like them, and take the same size convention (nccl-tests' size column, S bytes).

Algorithms (``algorithm=``):

- ``ring``: one flat ring over all n ranks; when the group spans nodes every ring step waits for the network, so
  the ring runs at the inter-node link (NCCL builds one ring per NIC, so each GPU's ring uses its own NIC: the
  per-GPU bandwidth ``nics_per_gpu · nic_gbps``). Thakur et al. 2005 §4; Patarasuk & Yuan 2009.
- ``tree``: all-reduce as NCCL's double binary tree (NVIDIA, "Massively Scale Your Deep Learning Training with
  NCCL 2.4", 2019: a chain inside each node, two binary trees across the nodes, after Sanders, Speck & Träff 2009),
  costed as NCCL's own tuning model does (``src/graph/tuning.cc``): 2·((local − 1)·α_intra + ⌈log2 nodes⌉·α_inter)
  + 2·S·β — latency logarithmic in the nodes, bandwidth near the ring's (:func:`tree_all_reduce_s`). Broadcast and
  reduce: the two-tree algorithms of Sanders, Speck & Träff, "Two-tree algorithms for full bandwidth broadcast,
  reduction and scan", Parallel Computing 35(12), 2009, at their optimal block count:
  S·β + 2⌈log2 n⌉α + √(8⌈log2 n⌉·α·β·S) when the message is large enough to cut (:func:`two_tree_broadcast_s`).
- ``hierarchical``: intra-node reduce-scatter, inter-node collective on S/local among the ranks with the same
  local index (one per node, in parallel on their own NICs: a rail-optimised network), intra-node all-gather
  (the 2D/hierarchical all-reduce of Jia et al. 2018, "Highly scalable deep learning training system with
  mixed-precision", §3.3; NCCL's CollNet/NVLS-tree likewise).
- ``sharp``: NVLink SHARP (NVSwitch gen 3+): the switch reduces, each GPU sends S and receives S once:
  α + S·β for an all-reduce inside a node (NVIDIA, "NVLink SHARP" in the H100 whitepaper; NCCL NVLS).
- ``auto`` (default): the fastest applicable, as NCCL's tuner picks per size.

Every time is a sum and max of terms each increasing in α and β, and ``auto`` is a minimum of such: a slower link
never makes a collective faster (a property test checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainmath.comm import cost
from trainmath.comm.cost import Link
from trainmath.errors import TrainmathError

TWO_LEVEL_ALGORITHMS = ("auto", "ring", "tree", "hierarchical", "sharp")
TWO_LEVEL_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "send_recv",
                 "scatter", "gather")


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Two levels of links, per GPU and direction."""

    intra: Link
    """Inside a node (NVLink through NVSwitch, or PCIe)."""
    inter: Link
    """Between nodes: the GPU's share of the scale-out NICs."""
    gpus_per_node: int
    in_switch_reduction: bool = False
    """NVLink SHARP: the intra-node switch reduces (enables ``sharp``)."""

    @classmethod
    def of_gpu(cls, gpu, link_fraction: float = 1.0) -> Topology:
        """The topology of ``gpu``'s reference node (``trainmath.hardware.GPU``), links at ``link_fraction`` of
        their datasheet bandwidth (NCCL's achieved busbw is below line rate)."""
        return cls(intra=Link(alpha_s=gpu.intra_node_latency_s,
                              bandwidth_bytes_per_s=gpu.interconnect_bytes_per_s * link_fraction),
                   inter=Link(alpha_s=gpu.inter_node_latency_s,
                              bandwidth_bytes_per_s=gpu.inter_node_bytes_per_s * link_fraction),
                   gpus_per_node=gpu.gpus_per_node, in_switch_reduction=gpu.nvlink_sharp)


@dataclass(frozen=True, kw_only=True)
class Group:
    """A process group as placed: ``size`` ranks, ``local`` of them on each node it spans."""

    size: int
    local: int

    def __post_init__(self) -> None:
        if self.size < 1 or self.local < 1 or self.size % self.local:
            raise TrainmathError(f"a group of {self.size} ranks cannot have {self.local} per node")

    @property
    def nodes(self) -> int:
        return self.size // self.local


def _flat_link(group: Group, topo: Topology) -> Link:
    """The link a flat algorithm waits on: the network once the group leaves the node."""
    return topo.intra if group.nodes == 1 else topo.inter


def _ring(op: str, size_bytes: int, group: Group, topo: Topology) -> float:
    return cost._time(op, size_bytes, group.size, _flat_link(group, topo), "ring")


def tree_all_reduce_s(size_bytes: float, group: Group, topo: Topology) -> float:
    """Seconds for NCCL's tree all-reduce: 2·((local − 1)·α_intra + ⌈log2 nodes⌉·α_inter) + 2·S·β.

    Structure (NCCL 2.4 blog, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA 2019): inside a
    node the ranks form a chain, across nodes two complementary binary trees (Sanders et al. 2009) each carry half
    the data; the reduction goes up and the broadcast comes down, pipelined, so a chunk crosses the chain and the
    tree depth twice. Cost: NCCL's tuning model, ``ncclTopoTuneModel`` in ``src/graph/tuning.cc`` — latency
    ``2 * ((nRanks/nNodes - 1) * intraLat + log2i(nNodes) * interLat)`` and algorithm bandwidth ``busBw * .5``,
    i.e. 2·S at the link's bandwidth (every rank sends and receives S in each tree phase of its two trees).
    Assumptions: β is the network's once the group leaves the node (the intra-node link's inside one node);
    ⌈log2⌉ where NCCL's ``log2i`` floors (equal for a power-of-two node count); NCCL's base latency, protocol
    factors and size-dependent correction table are not modelled. Inside one node the chain makes it slower than
    the ring, so ``auto`` picks it only across nodes, as NCCL does.
    """
    link = _flat_link(group, topo)
    hops = (group.local - 1) * topo.intra.alpha_s + math.ceil(math.log2(group.nodes)) * topo.inter.alpha_s
    return 2 * hops + 2 * size_bytes * link.beta_s_per_byte


def two_tree_steps_s(size_bytes: float, n: int, link: Link, blocks: int) -> float:
    """Seconds for Sanders, Speck & Träff's two-tree broadcast with the message cut into ``blocks`` blocks per tree.

    Sanders et al. 2009 (Parallel Computing 35(12)): each tree carries S/2 in ``blocks`` pieces and the schedule
    takes 2h + 2k steps for height h = ⌈log2 n⌉ and k blocks, each step one message of S/(2k):
    (2h + 2k)·(α + β·S/(2k)). Reduction runs the same schedule backwards (reduction cost γ not counted).
    """
    h = math.ceil(math.log2(n))
    return (2 * h + 2 * blocks) * (link.alpha_s + link.beta_s_per_byte * size_bytes / (2 * blocks))


def two_tree_broadcast_s(size_bytes: float, n: int, link: Link) -> float:
    """Seconds for the two-tree broadcast (or reduce) at its best block count: S·β + 2hα + √(8h·α·β·S), h = ⌈log2 n⌉.

    The minimum over k ≥ 1 of :func:`two_tree_steps_s` (derived: the derivative vanishes at k* = √(h·β·S / (2α)),
    the block count Sanders et al. 2009 give; below k* = 1, a message too small to cut, it is the one-block
    schedule). For large S it approaches S·β, twice the bandwidth of one pipelined binary tree (whose inner nodes
    send every block twice, 2·S·β) — the paper's title claim.
    """
    h = math.ceil(math.log2(n))
    a, b = link.alpha_s, link.beta_s_per_byte
    if 2 * a >= h * b * size_bytes:  # k* <= 1
        return two_tree_steps_s(size_bytes, n, link, 1)
    return size_bytes * b + 2 * h * a + math.sqrt(8 * h * a * b * size_bytes)


def _tree(op: str, size_bytes: int, group: Group, topo: Topology) -> float | None:
    if op == "all_reduce":
        return tree_all_reduce_s(size_bytes, group, topo)
    if op in ("broadcast", "reduce"):
        return two_tree_broadcast_s(size_bytes, group.size, _flat_link(group, topo))
    return None


def _hierarchical(op: str, size_bytes: int, group: Group, topo: Topology) -> float | None:
    if group.nodes == 1 or group.local == 1:
        return None
    local, nodes = Group(size=group.local, local=group.local), Group(size=group.nodes, local=1)
    share = size_bytes / group.local
    if op == "all_reduce":
        return (_ring("reduce_scatter", size_bytes, local, topo) + _ring("all_reduce", share, nodes, topo)
                + _ring("all_gather", size_bytes, local, topo))
    if op == "reduce_scatter":
        return _ring("reduce_scatter", size_bytes, local, topo) + _ring("reduce_scatter", share, nodes, topo)
    if op == "all_gather":
        return _ring("all_gather", share, nodes, topo) + _ring("all_gather", size_bytes, local, topo)
    if op in ("broadcast", "reduce"):
        return time_s(op, size_bytes, nodes, topo) + time_s(op, size_bytes, local, topo)
    if op == "all_to_all":
        # Each rank sends S/n to every rank: (n - local)·S/n leave the node on its NIC while (local - 1)·S/n
        # cross NVLink, at the same time (derived; pairwise exchange, Thakur et al. 2005 §4.6).
        off = (group.size - group.local) * (topo.inter.alpha_s + size_bytes / group.size * topo.inter.beta_s_per_byte)
        on = (group.local - 1) * (topo.intra.alpha_s + size_bytes / group.size * topo.intra.beta_s_per_byte)
        return max(off, on)
    return None


def _sharp(op: str, size_bytes: int, group: Group, topo: Topology) -> float | None:
    if not topo.in_switch_reduction or group.nodes != 1 or op != "all_reduce":
        return None
    return topo.intra.alpha_s + size_bytes * topo.intra.beta_s_per_byte


_ALGORITHMS = {"ring": _ring, "tree": _tree, "hierarchical": _hierarchical, "sharp": _sharp}


def time_s(op: str, size_bytes: float, group: Group, topo: Topology, algorithm: str = "auto") -> float:
    """Seconds for ``op`` on S = ``size_bytes`` over ``group`` placed on ``topo`` with ``algorithm``."""
    if op not in TWO_LEVEL_OPS:
        raise TrainmathError(f"unknown collective {op!r}; known: {', '.join(TWO_LEVEL_OPS)}")
    if algorithm not in TWO_LEVEL_ALGORITHMS:
        raise TrainmathError(f"unknown algorithm {algorithm!r}; known: {', '.join(TWO_LEVEL_ALGORITHMS)}")
    if size_bytes < 0:
        raise TrainmathError(f"message size must be >= 0 bytes, got {size_bytes}")
    if group.size == 1:
        return 0.0
    if op == "send_recv":  # one message between neighbours: over the network if they are on different nodes
        return cost.send_recv(size_bytes, 2, _flat_link(group, topo))
    if op in ("scatter", "gather"):
        return cost._time(op, size_bytes, group.size, _flat_link(group, topo), "naive")
    if algorithm != "auto":
        t = _ALGORITHMS[algorithm](op, size_bytes, group, topo)
        if t is None:
            raise TrainmathError(f"no {algorithm!r} algorithm for {op} on {group.size} ranks ({group.local} per node)")
        return t
    times = [t for f in _ALGORITHMS.values() if (t := f(op, size_bytes, group, topo)) is not None]
    return min(times)


def all_reduce(size_bytes, group, topo, algorithm="auto"):
    """Seconds for an all-reduce of S bytes (see the module docstring for the algorithms)."""
    return time_s("all_reduce", size_bytes, group, topo, algorithm)


def reduce_scatter(size_bytes, group, topo, algorithm="auto"):
    """Seconds for a reduce-scatter of an S-byte input."""
    return time_s("reduce_scatter", size_bytes, group, topo, algorithm)


def all_gather(size_bytes, group, topo, algorithm="auto"):
    """Seconds for an all-gather into an S-byte output."""
    return time_s("all_gather", size_bytes, group, topo, algorithm)


def broadcast(size_bytes, group, topo, algorithm="auto"):
    """Seconds for a broadcast of S bytes."""
    return time_s("broadcast", size_bytes, group, topo, algorithm)


def reduce(size_bytes, group, topo, algorithm="auto"):
    """Seconds for a reduce of S bytes to one rank."""
    return time_s("reduce", size_bytes, group, topo, algorithm)


def all_to_all(size_bytes, group, topo, algorithm="auto"):
    """Seconds for an all-to-all of an S-byte buffer per rank."""
    return time_s("all_to_all", size_bytes, group, topo, algorithm)


def send_recv(size_bytes, group, topo, algorithm="auto"):
    """Seconds for one S-byte message between two ranks of ``group``."""
    return time_s("send_recv", size_bytes, group, topo, algorithm)


def scatter(size_bytes, group, topo, algorithm="auto"):
    """Seconds for a scatter of an S-byte buffer (S/n to each rank, linear from the root)."""
    return time_s("scatter", size_bytes, group, topo, algorithm)


def gather(size_bytes, group, topo, algorithm="auto"):
    """Seconds for a gather into an S-byte buffer (linear into the root)."""
    return time_s("gather", size_bytes, group, topo, algorithm)
