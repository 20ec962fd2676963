"""What a launch is (``JobSpec``), validated before any worker starts; standard library only."""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A launch, validated before any worker starts."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    backend: str = "gloo"
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """0 picks a free port (single node only: other nodes must know it)."""
    timeout_s: float = 30.0
    deadline_s: float | None = None
    """Wall-clock limit for the whole job; None for none beyond the per-collective timeout."""

    def __post_init__(self) -> None:
        if not isinstance(self.nproc_per_node, int) or self.nproc_per_node < 1:
            raise TrainmathError(f"--nproc must be an integer >= 1, got {self.nproc_per_node!r}")
        if self.nnodes < 1:
            raise TrainmathError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise TrainmathError(f"--node-rank must be in 0..{self.nnodes - 1} for --nnodes {self.nnodes}, "
                                 f"got {self.node_rank}")
        if self.backend not in BACKENDS:
            raise TrainmathError(f"unknown backend {self.backend!r}; choose gloo or nccl")
        if not 0 <= self.master_port <= 65535:
            raise TrainmathError(f"--master-port must be in 0..65535, got {self.master_port}")
        if self.master_port == 0 and self.nnodes > 1:
            raise TrainmathError("--master-port is required with --nnodes > 1: every launcher must use the same port")
        if not 0 < self.timeout_s <= 86_400:  # NaN fails too; timedelta overflows near 1e14 s
            raise TrainmathError(f"--timeout must be a finite number of seconds in (0, 86400], got {self.timeout_s}")
        if self.deadline_s is not None and not 0 < self.deadline_s <= 10 * 86_400:
            raise TrainmathError(f"deadline must be a finite number of seconds in (0, 864000], got {self.deadline_s}")
        if not self.master_addr or any(c.isspace() for c in self.master_addr):
            raise TrainmathError(f"--master-addr must be a host name or address, got {self.master_addr!r}")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node
