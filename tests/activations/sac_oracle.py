"""Oracle for selective checkpointing: what a decoder layer keeps after forward under ``apply_selective``.

Under non-reentrant checkpointing the autograd graph of a layer holds no saved tensors of its own (the checkpoint's
pack hook returns empty holders); what stays alive until that layer's backward is

1. the layer's inputs, held by the recompute closure: hidden states, the rotary cos/sin (one pair shared by all
   layers), and a mask tensor where the layer gets one;
2. the selective-checkpoint cache: the outputs of the ops the policy kept, stored by
   ``torch.utils.checkpoint._CachingTorchDispatchMode`` in its ``storage`` dict (detached aliases: same storages).

``measure`` runs forward with labels on a tiny model and collects both (1: forward pre-hooks on the layers, as
``test_hf_oracle._measure`` does for full recompute; 2: the ``storage`` dict of every context the applier makes,
observed by wrapping ``create_selective_checkpoint_contexts``), plus the storages packed outside the layers and
still alive (embedding, final norm, head and loss: weak references, as ``_measure``). Bytes are per distinct
storage, parameters excluded. The recompute transient is measured in backward: the storages the recomputed forward
of each layer packs (``torch.utils.checkpoint._recomputation_hook`` observed the same way), minus those already
counted (cache entries and inputs) and that the checkpoint stores (``torch.utils.checkpoint`` keeps a recomputed
tensor only for a holder of the forward still alive: a node that cannot reach the loss died after forward), the
largest over layers. Layer inputs are the floating, complex (DeepSeek-V2's freqs_cis) and bool (masks) tensors.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint as ckpt
from torch.multiprocessing.reductions import StorageWeakRef

from trainmath.runtime.checkpointing import apply_selective, decoder_layers


@dataclass
class Kept:
    """One kept storage: where it comes from (``input`` or the op that made it, with its call index in the
    layer), its shape and dtype, and its bytes."""

    layer: int
    source: str
    shape: tuple
    dtype: str
    nbytes: int


@dataclass
class Measurement:
    total_bytes: int = 0
    """Every distinct non-parameter storage held after forward (layers + the rest)."""
    cache_bytes: list = field(default_factory=list)
    """Per layer: bytes of the selective-checkpoint cache (distinct storages)."""
    input_bytes: int = 0
    """The layers' inputs (distinct storages over all layers: cos/sin are counted once)."""
    outside_bytes: int = 0
    """Storages packed for backward outside the layers and still alive (not also a layer input or cache entry)."""
    transient_bytes: list = field(default_factory=list)
    """Per layer, in backward order: new storages its recompute stores for the layer's backward."""
    packed_bytes: list = field(default_factory=list)
    """Per layer, in backward order: new storages its recompute packs, stored or not (the count before the
    stored-holder rule: a node that cannot reach the loss died after forward with its holders, and what its
    recomputed op packs is dropped with that op)."""
    fresh: list = field(default_factory=list)
    """Per layer, in backward order: (shape, dtype, bytes) of each of those storages, in pack order."""
    kept: list = field(default_factory=list)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int64: "i64", torch.bool: "bool", torch.complex64: "c64"}


def measure(model, mode: str, ids, **apply_kw) -> Measurement:
    """Forward (with labels) and backward of ``model`` under ``apply_selective``; ``mode`` fp32, bf16 or autocast
    (CPU autocast to bf16)."""
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    apply_selective(model, **apply_kw)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    layers = decoder_layers(model)
    index = {id(layer): i for i, layer in enumerate(layers)}
    current = []  # the layer whose forward is running (pre-hooks run outside the checkpoint)
    inputs: dict[int, tuple] = {}  # storage ptr → (layer, tensor), strong: the closure holds them anyway
    caches: list[tuple[int, dict]] = []
    packed: dict[int, list] = {}

    def pre(module, args, kwargs):
        current.append(index[id(module)])
        for t in _tensors((args, kwargs)):
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:  # not the position ids (int64)
                ptr = t.untyped_storage().data_ptr()
                if ptr not in params:
                    inputs.setdefault(ptr, (current[-1], t))

    def post(module, args, kwargs, out):
        current.pop()

    real = ckpt.create_selective_checkpoint_contexts

    def observed(policy, *a, **k):
        caching, cached = real(policy, *a, **k)
        if torch.is_grad_enabled() and current:
            caches.append((current[-1], caching.storage))
        return caching, cached

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            packed.setdefault(st.data_ptr(), []).append((weakref.ref(t), st.nbytes()))
        return t

    hooks = [h for layer in layers for h in (layer.register_forward_pre_hook(pre, with_kwargs=True),
                                             layer.register_forward_hook(post, with_kwargs=True))]
    ckpt.create_selective_checkpoint_contexts = observed
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
                out = model(input_ids=ids, labels=ids, use_cache=False)
    finally:
        ckpt.create_selective_checkpoint_contexts = real
        for h in hooks:
            h.remove()
    gc.collect()

    m = Measurement()
    counted: dict[int, StorageWeakRef] = {}  # ptr → the storage, to tell it from a later one at the same address
    for ptr, (layer, t) in inputs.items():
        counted[ptr] = StorageWeakRef(t.untyped_storage())
        m.input_bytes += t.untyped_storage().nbytes()
        m.kept.append(Kept(layer, "input", tuple(t.shape), DTYPE.get(t.dtype, str(t.dtype)),
                           t.untyped_storage().nbytes()))
    m.cache_bytes = [0] * len(layers)
    for layer, storage in caches:
        for func, entries in storage.items():
            for idx, entry in sorted(entries.items()):
                if not isinstance(entry, (tuple, list)):
                    entry = (entry,)
                for w in entry:
                    t = getattr(w, "val", None)
                    if not isinstance(t, torch.Tensor):
                        continue  # _RECOMPUTE markers, non-tensor outputs
                    ptr = t.untyped_storage().data_ptr()
                    if ptr in counted or ptr in params:
                        continue
                    counted[ptr] = StorageWeakRef(t.untyped_storage())
                    n = t.untyped_storage().nbytes()
                    m.cache_bytes[layer] += n
                    m.kept.append(Kept(layer, f"{func.__name__}#{idx}", tuple(t.shape),
                                       DTYPE.get(t.dtype, str(t.dtype)), n))
    for ptr, refs in packed.items():
        alive = [n for r, n in refs if r() is not None]
        if alive and ptr not in counted:
            m.outside_bytes += max(alive)
    m.total_bytes = m.input_bytes + sum(m.cache_bytes) + m.outside_bytes

    # backward: what each layer's recompute saves that is not already held
    real_hook = ckpt._recomputation_hook
    seen_now: list[dict] = []

    class Observed(real_hook):
        def __init__(self, frame_ref, gid):
            super().__init__(frame_ref, gid)
            inner, mine, every = self.pack_hook, {}, {}
            seen_now.append(mine)
            m.packed_bytes.append(every)
            shapes = []
            m.fresh.append(shapes)

            def pack_hook(x):
                ptr = x.untyped_storage().data_ptr()
                held = ptr in counted and not counted[ptr].expired()
                # the checkpoint stores x for backward only where the forward's node still holds its holder: a
                # node that cannot reach the loss (a router's top-k over groups) was freed with its holders when
                # forward ended, and its recomputed tensors die with the recomputed op
                frame = frame_ref()
                i = frame.recomp_counter[gid]
                stored = i < len(frame.weak_holders) and frame.weak_holders[i]() is not None
                if ptr not in params and not held:  # a storage freed during the recompute (an unstored
                    # tensor) can hand its address to the next one: a new storage there is counted again
                    seen = every.setdefault(ptr, [])
                    if not seen or seen[-1][0].expired():
                        seen.append((StorageWeakRef(x.untyped_storage()), x.untyped_storage().nbytes()))
                if stored and ptr not in params and not held and ptr not in mine:
                    mine[ptr] = x.untyped_storage().nbytes()
                    shapes.append((tuple(x.shape), DTYPE.get(x.dtype, str(x.dtype)), mine[ptr]))
                return inner(x)

            self.pack_hook = pack_hook

    ckpt._recomputation_hook = Observed
    try:
        out.loss.backward()
    finally:
        ckpt._recomputation_hook = real_hook
    m.transient_bytes = [sum(d.values()) for d in seen_now]
    m.packed_bytes = [sum(n for seen in d.values() for _, n in seen) for d in m.packed_bytes]
    return m
