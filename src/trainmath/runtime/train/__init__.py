"""Training runtime: real transformers models under DDP and ZeRO-1/2/3 (torch's and ours), measured per rank.

- ``config``      what a run is (``TrainConfig``), validated before any rank starts (no torch)
- ``model``       the shrunk config → transformers model and the calculator's ``ModelSpec`` of the same config
- ``data``        synthetic or byte-level text tokens, the same sample for the same global index on any world size
- ``optim``       SGD, momentum, Adam, AdamW from their update rules, and torch.optim's
- ``flat``        the flat-buffer layout our ZeRO stages share (per-parameter dim-0 shards, rank-major)
- ``zero1``, ``zero2``, ``zero3``  our ZeRO stages from reduce-scatter and all-gather
- ``strategies``  DDP / ZeroRedundancyOptimizer / FSDP2, and ours, behind one interface
- ``checkpoint``  torch.distributed.checkpoint save (temporary name, then rename) and resume
- ``measure``     bytes of parameters, gradients and optimizer states, the step's peak and FLOPs
- ``loop``        one rank's training loop; what the CLI's ``train`` and ``verify`` run (the comparison with the
  calculator is ``trainmath.verify.train``)

Only ``config`` is importable without torch.
"""
