"""``--precision mixed-bf16`` on one device: bf16 weights the model computes with, fp32 master weights the optimizer
updates, as Megatron-LM's ``Float16OptimizerWithFloat16Params`` runs it
(NVIDIA/Megatron-LM megatron/core/optimizer/optimizer.py@71371b4e14975a62cd584dd79920f9426cc93c18):

- at construction each bf16 parameter gets ``main_param = param.detach().clone().float()``, and the optimizer's
  parameter list holds the fp32 copies (so its states are ``zeros_like`` fp32 tensors);
- ``step()`` first runs ``_copy_model_grads_to_main_grads``: for each parameter in turn
  ``main_param.grad = model_param.grad.float()`` and then ``model_param.grad = None`` ("Safe to deallocate
  model's grad/main_grad after copying"), so the bf16 gradients go as their fp32 copies appear;
- then the inner optimizer's ``step()``, then ``_copy_main_params_to_model_params`` (bf16: a loop of
  ``model.copy_(main)``, in place);
- ``zero_grad`` clears the model's and the master copies' gradients.

Under FSDP2 the runtime's mixed-bf16 is ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` over fp32
parameters (``trainmath.runtime.train.strategies.TorchFSDP``): the sharded fp32 parameters are the master weights,
and the simulation wraps the model so (``simulate``). This module is the one-device loop only.

On one device ``amp-bf16`` is the other common loop (``torch.autocast`` over fp32 weights, no master copy:
``--backward-in-autocast`` applies there); mixed-bf16 has no autocast context.

torch is imported inside the functions: the calculator never needs it.
"""

from __future__ import annotations


class MasterWeights:
    """The fp32 master copies of a bf16 model's trainable parameters, and the three copies of the loop."""

    def __init__(self, model):
        import torch

        self.model_params = [p for p in model.parameters() if p.requires_grad]
        self.module = torch.nn.Module()  # the master copies as a module, so MemTracker tracks them as parameters
        self.module.masters = torch.nn.ParameterList(
            [torch.nn.Parameter(p.detach().clone().float()) for p in self.model_params])
        self.main_params = list(self.module.masters)

    def copy_model_grads_to_main_grads(self) -> None:
        for model_param, main_param in zip(self.model_params, self.main_params):
            if model_param.grad is not None:
                main_param.grad = model_param.grad.float()
            model_param.grad = None

    def copy_main_params_to_model_params(self) -> None:
        import torch

        with torch.no_grad():
            for model_param, main_param in zip(self.model_params, self.main_params):
                model_param.copy_(main_param)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.model_params + self.main_params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()
