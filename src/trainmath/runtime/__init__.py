"""torch.distributed runtime: launcher, the primitives of Jiang Yi's blog series, ring algorithms, benchmark,
correctness check.

Imports torch (the ``runtime`` extra). The cost model these measurements are compared with is the pure
:mod:`trainmath.comm`.
"""
