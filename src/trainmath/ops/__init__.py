"""What each block computes, described once: op lists that every per-op quantity folds over.

- ``ir``: ``Tensor`` (full-size axes, each with its sharding rule; compares by identity, views keep their base),
  ``Op`` (kind, inputs, outputs, what it saves for backward, kernel, weight, an attention op's window, a scan's
  chunk, what the inference cache keeps of it) and ``Degrees`` (the only reader of
  parallel degrees).
- ``context``: ``Ctx``, the run an op list is emitted for (micro-batch, sequence, ``Precision``, attention kernel,
  expert path, router and family switches, the scans' chunks; ``shapes_only`` for the folds that read shapes).
- ``kernels``: one module per op kind (linears and casts, norms, attention and its variants, MLPs, routers,
  routed experts, MLA, scans), never naming a family.
- ``style``: ``Style``, the columns of a family's table row that emitters read. The families themselves (their
  rows and layer emitters) are ``trainmath.families``, the only place that names one.
- ``emit``: one layer's (or the head's) op list for the shape folds, from the spec's family.
- ``model``: the ops around the layers (embedding, the rotary tables every layer shares, final norm, LM head and
  loss), driven by the family's ``Style`` row.
- ``fold``: saved bytes (distinct storages) and the per-layer tree, on one rank of a layout.
- ``flops``: every GEMM (m, k, n per rank): the linears, attention cores, depthwise convs and chunked scans, which
  ``trainmath.flops.count_flops`` reads.
- ``cache``: what the inference cache keeps (K/V, MLA latent, conv and recurrent states) per rank, which
  ``trainmath.infer.kv`` stores in a cache format.

``trainmath.memory.activations.activation_bytes`` folds each layer type's op list; the oracle tests in
``tests/activations`` compare the folds with what transformers' own code saves, exactly.
"""
