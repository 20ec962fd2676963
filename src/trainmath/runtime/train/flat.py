"""The flat-buffer layout our ZeRO stages share, and the two collectives they need.

A *unit* (the whole model for ZeRO-1; one decoder layer, or the rest of the model, for ZeRO-2/3) is a list of
parameters. Each parameter of dim 0 size d is cut into n chunks of c = ⌈d/n⌉ rows (the last ones padded with
zeros), as FSDP2's ``Shard(0)`` does and as the calculator counts (``trainmath.layout.zero_shard_shape``).
Rank r's *shard* of the unit is its chunk of every parameter, concatenated:

    shard r = [chunk r of p₀ | chunk r of p₁ | ...]            (shard_numel elements)
    buffer  = [shard 0 | shard 1 | ... | shard n−1]            (n · shard_numel: rank-major)

So a reduce-scatter of the packed gradient buffer leaves rank r exactly its shard of the summed gradient, and an
all-gather of the shards is the packed parameter buffer: one collective per unit, lengths divisible by n (gloo's
uneven all-gather is never needed).
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

from trainmath.arith import ceil_div
from trainmath.runtime.ring import ring_all_gather, ring_reduce_scatter


class Comm:
    """Reduce-scatter and all-gather over ``group`` by our ring (``trainmath.runtime.ring``) or torch's, counting
    each call's buffer bytes (nccl-tests' size: the whole buffer) per collective."""

    def __init__(self, group: dist.ProcessGroup, impl: str = "ring"):
        self.group, self.impl = group, impl
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.bytes: Counter = Counter()
        self.calls: Counter = Counter()

    def reduce_scatter(self, shard: torch.Tensor, buffer: torch.Tensor) -> None:
        """shard ← chunk ``rank`` of Σ over ranks of ``buffer``; ``buffer`` is scratch (the ring reduces in it, so
        it keeps no copy of it: ``ring_reduce_scatter(inplace=True)``)."""
        self.bytes["reduce_scatter"] += buffer.numel() * buffer.element_size()
        self.calls["reduce_scatter"] += 1
        if self.n == 1:
            shard.copy_(buffer.view(-1))
        elif self.impl == "ring":
            ring_reduce_scatter(shard, buffer.view(-1), self.group, inplace=True)
        else:
            dist.reduce_scatter_tensor(shard, buffer.view(-1), group=self.group)

    def all_gather(self, buffer: torch.Tensor, shard: torch.Tensor) -> None:
        """buffer ← every rank's ``shard``, in rank order."""
        self.bytes["all_gather"] += buffer.numel() * buffer.element_size()
        self.calls["all_gather"] += 1
        if self.n == 1:
            buffer.view(-1).copy_(shard)
        elif self.impl == "ring":
            ring_all_gather(buffer.view(-1), shard, self.group)
        else:
            dist.all_gather_into_tensor(buffer.view(-1), shard, group=self.group)


class FlatLayout:
    """Where each parameter's chunks sit in a unit's shard (see the module docstring)."""

    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]], n: int, rank: int):
        self.n, self.rank = n, rank
        self.names = [name for name, _ in named_params]
        self.params = [p for _, p in named_params]
        self.shapes = [tuple(p.shape) for p in self.params]
        self.rows, self.cols, self.chunk_rows, self.offsets = [], [], [], []
        offset = 0
        for shape in self.shapes:
            rows = shape[0] if shape else 1
            cols = (int(torch.Size(shape).numel()) // rows) if rows else 0
            c = ceil_div(rows, n)
            self.rows.append(rows), self.cols.append(cols), self.chunk_rows.append(c), self.offsets.append(offset)
            offset += c * cols
        self.shard_numel = offset
        self.dtype = self.params[0].dtype if self.params else torch.float32

    def own_rows(self, i: int, r: int | None = None) -> tuple[int, int]:
        """Rows [a, b) of parameter i that rank r (default: this rank) holds; b − a < c at the padded end."""
        r = self.rank if r is None else r
        c = self.chunk_rows[i]
        return min(r * c, self.rows[i]), min((r + 1) * c, self.rows[i])

    def chunk(self, shard: torch.Tensor, i: int, r: int | None = None, *, padded: bool = False) -> torch.Tensor:
        """Parameter i's chunk in a shard: a (rows, cols) view; the real rows only unless ``padded``."""
        a, b = self.own_rows(i, r)
        c, cols, off = self.chunk_rows[i], self.cols[i], self.offsets[i]
        rows = c if padded else b - a
        return shard[off:off + rows * cols].view(rows, cols)

    def new_shard(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.zeros(self.shard_numel, dtype=dtype or self.dtype, device=self._device())

    def new_buffer(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """(n, shard_numel), zeroed (the padding rows must be zeros)."""
        return torch.zeros(self.n, self.shard_numel, dtype=dtype or self.dtype, device=self._device())

    def _device(self) -> torch.device:
        return self.params[0].device if self.params else torch.device("cpu")

    @torch.no_grad()
    def pack(self, tensors: list[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor:
        """Full-size tensors (one per parameter) → the rank-major buffer."""
        for i, t in enumerate(tensors):
            self.pack_one(i, t, buffer)
        return buffer

    @torch.no_grad()
    def pack_one(self, i: int, t: torch.Tensor, buffer: torch.Tensor) -> None:
        """Parameter i's full-size tensor ``t`` → its chunks in the rank-major buffer."""
        rows = t.reshape(self.rows[i], self.cols[i])
        for r in range(self.n):
            a, b = self.own_rows(i, r)
            self.chunk(buffer[r], i, r).copy_(rows[a:b])

    @torch.no_grad()
    def unpack(self, buffer: torch.Tensor, tensors: list[torch.Tensor]) -> None:
        """The rank-major buffer → full-size tensors (written in place)."""
        for i, t in enumerate(tensors):
            rows = t.view(self.rows[i], self.cols[i])
            for r in range(self.n):
                a, b = self.own_rows(i, r)
                rows[a:b].copy_(self.chunk(buffer[r], i, r))

    @torch.no_grad()
    def take_own(self, tensors: list[torch.Tensor], shard: torch.Tensor) -> torch.Tensor:
        """This rank's chunks of full-size tensors → ``shard`` (padding left as it is: zeros)."""
        for i, t in enumerate(tensors):
            a, b = self.own_rows(i)
            self.chunk(shard, i).copy_(t.reshape(self.rows[i], self.cols[i])[a:b])
        return shard

    def dtensors(self, shard: torch.Tensor, mesh) -> dict[str, torch.Tensor]:
        """Name → a DTensor ``Shard(0)`` of the full parameter whose local part is a view into ``shard``: what
        torch.distributed.checkpoint saves and loads in place, resharding across world sizes (torch.chunk's
        split, as ours)."""
        from torch.distributed.tensor import DTensor, Shard

        out = {}
        for i, name in enumerate(self.names):
            shape = torch.Size(self.shapes[i])
            local = self.chunk(shard, i).view(-1, *shape[1:]) if shape else self.chunk(shard, i).view(-1)
            stride = torch.empty(shape, device="meta").stride()
            out[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=shape, stride=stride)
        return out


def free_storage(t: torch.Tensor) -> None:
    """Release ``t``'s memory but keep the tensor (autograd and the optimizer hold it by identity)."""
    t.untyped_storage().resize_(0)


def alloc_storage(t: torch.Tensor) -> None:
    """Give a freed tensor its memory back (contents undefined until written)."""
    nbytes = t.numel() * t.element_size()
    if t.untyped_storage().size() != nbytes:
        t.untyped_storage().resize_(nbytes)
