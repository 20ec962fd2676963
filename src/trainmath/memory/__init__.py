"""Memory per GPU: training (weights, gradients, optimizer states, activations, transients) and its parts.

``training.training_memory`` is the entry point; ``optimizers`` and ``precision`` hold the per-element facts
it uses, ``states`` the ZeRO-sharded model states, ``activations`` the activation model.
"""
