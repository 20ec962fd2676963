"""The collectives cost model: pure Python, no torch.

The "math twin" of :mod:`trainmath.runtime`: every runtime collective has a function here with the same name
(``all_reduce``, ``reduce_scatter``, ``all_gather``, ``broadcast``, ``reduce``, ``all_to_all``, ``send_recv``,
``scatter``, ``gather``) that returns the time an α–β–γ model predicts, plus the nccl-tests bus-bandwidth
factors, the ring schedule the runtime follows, and the arithmetic of the ``comm layout`` table.
:mod:`trainmath.comm.twolevel` prices the same collectives on a two-level topology (node fabric + network).
"""

from trainmath.comm.busbw import OPS, algbw_bytes_per_s, busbw_bytes_per_s, busbw_factor
from trainmath.comm.cost import (
    ALGORITHMS,
    Link,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    fit_link,
    gather,
    predict_time_s,
    reduce,
    reduce_scatter,
    scatter,
    send_recv,
)
from trainmath.comm.ring import (
    chunk_bounds,
    ring_all_gather_schedule,
    ring_all_reduce_bytes_sent_per_rank,
    ring_bytes_sent,
    ring_reduce_scatter_schedule,
)
from trainmath.comm.sizes import format_size, parse_size, parse_size_range
from trainmath.comm.twolevel import Group, Topology

__all__ = [
    "ALGORITHMS",
    "Group",
    "Topology",
    "OPS",
    "Link",
    "algbw_bytes_per_s",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "busbw_bytes_per_s",
    "busbw_factor",
    "chunk_bounds",
    "fit_link",
    "format_size",
    "gather",
    "parse_size",
    "parse_size_range",
    "predict_time_s",
    "reduce",
    "reduce_scatter",
    "ring_all_gather_schedule",
    "ring_all_reduce_bytes_sent_per_rank",
    "ring_bytes_sent",
    "ring_reduce_scatter_schedule",
    "scatter",
    "send_recv",
]
