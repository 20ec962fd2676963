"""A new family as ``docs/adding-a-family.md`` describes it: one module holding one ``FamilyDef``. This one is Llama
under another ``model_type`` (its config keys, blocks, emitter and TP plan are Llama's), so every figure it gives
must equal Llama's (``tests/test_adding_a_family.py``)."""

from __future__ import annotations

from trainmath.families.base import FamilyDef, TPPlan
from trainmath.families.dense import builder, prenorm_layer
from trainmath.ops.style import Style

LLAMA_COPY = FamilyDef(model_type="llama_copy",
                       build=builder(qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias="mlp_bias"),
                       layer=prenorm_layer, style=Style(), tp=TPPlan())
