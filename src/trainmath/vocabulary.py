"""Words the calculator, the runtime and the CLI share, each defined once."""

RECOMPUTE = ("none", "selective", "full")
"""Activation recompute: ``none``; ``selective`` (torchtitan's op-level selective checkpointing); ``full`` (every
layer's forward again in backward: transformers' ``gradient_checkpointing_enable()``, Megatron-LM's full)."""
