"""Memory per GPU: training (weights, gradients, optimizer states, activations, transients) and its parts.

``training.training_memory`` is the entry point: it builds the step's timeline (``timeline``) from the ZeRO-sharded
model states (``states``), the per-element facts of ``optimizers`` and ``precision``, the activation model
(``activations``) and the loss and wrapper buffers (``terms``). ``fit`` gives the verdict for a GPU preset and its
levers. The real modeling code on fake tensors, which checks these figures, is ``trainmath.verify.simulate``.
"""
