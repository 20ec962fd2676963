"""Test support: what transformers' decoder layers save for backward on each rank of a real tensor-parallel run.

``run_tp(world, cases)`` starts ``world`` gloo ranks on this CPU (``torch.multiprocessing`` spawn, one process
group for every case, so transformers is imported once per rank), applies ``trainmath.runtime.tensor_parallel
.apply_tp`` to the same tiny model on each rank and returns, per case and per rank, what ``saved`` and
``step_peak`` measure. ``saved`` is the method of ``tests/activations/test_hf_oracle.py::_measure`` (distinct
non-parameter storages packed by ``saved_tensors_hooks`` and still held when the forward ends), with one change
for DTensors: a DTensor is a wrapper without storage of its own, so the storage counted is its ``_local_tensor``'s
(the bytes this rank holds), and parameters are recognised by their local storages too.

A case is ``(model_type, attn, mode, sp, vocab_parallel)``; mode is ``fp32``, ``bf16`` (``model.to(bfloat16)``)
or ``autocast`` (fp32 weights under CPU ``torch.autocast(bfloat16)``), as in the single-device oracle.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import tempfile
import weakref

B, S = 2, 16
BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, head_dim=16)
"""The tiny shapes of ``tests/activations/test_hf_oracle.py``."""


NO_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
FAMILY = {
    "gemma3_text": {**NO_IDS, "layer_types": ["sliding_attention", "full_attention"]},
    "olmo2": NO_IDS, "starcoder2": NO_IDS, "cohere": NO_IDS, "phi3": NO_IDS,
    "qwen3_moe": {"moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1},
}
"""Each family's config keys over ``BASE`` (those of ``tests/activations/test_hf_oracle.py``'s cases)."""
MOE = ("qwen3_moe",)


def tiny_config(model_type: str, **extra):
    import transformers

    return transformers.AutoConfig.for_model(model_type, **{**BASE, **FAMILY.get(model_type, {}), **extra})


def tiny_model(model_type: str, attn: str, mode: str, **extra):
    """``model_type`` may name the experts path after a colon (``qwen3_moe:eager``; default ``grouped_mm``)."""
    import torch
    import transformers

    model_type, _, experts = model_type.partition(":")
    cfg = tiny_config(model_type, **extra)
    torch.manual_seed(0)
    kw = {"experts_implementation": experts or "grouped_mm"} if model_type in MOE else {}
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, **kw)
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    return model.train()


def _storage(t):
    """The storage this rank holds for ``t``: a DTensor's local tensor's; a collective's result still in flight
    (``AsyncCollectiveTensor``, a wrapper too) its buffer's."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor

    while isinstance(t, (DTensor, AsyncCollectiveTensor)):
        t = t._local_tensor if isinstance(t, DTensor) else t.elem
    return t.untyped_storage()


def batch(vocab: int = BASE["vocab_size"], b: int = B):
    import torch

    return torch.randint(0, vocab, (b, S), generator=torch.Generator().manual_seed(1))


def saved(model, mode: str, *, vocab_parallel: bool = False, b: int = B) -> tuple[int, list, float]:
    """Bytes of distinct non-parameter storages saved for backward by one forward with labels; the list of
    ``(nbytes, shape, dtype, is_dtensor)`` of each counted storage's largest packed tensor, in packing order; and
    the loss. The graph is then run backward, so it is checked to be usable."""
    import torch
    from torch.distributed.tensor import DTensor

    from trainmath.runtime.tensor_parallel import loss_context

    params = {_storage(p).data_ptr() for p in model.parameters()}
    seen: dict[int, list] = {}

    def pack(t):
        st = _storage(t)
        if st.data_ptr() not in params:
            seen.setdefault(st.data_ptr(), []).append((weakref.ref(t), st.nbytes(), tuple(t.shape), t.dtype,
                                                       isinstance(t, DTensor)))
        return t

    ids = batch(model.config.vocab_size, b)
    with loss_context(vocab_parallel):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
                out = model(input_ids=ids, labels=ids, use_cache=False)
        gc.collect()
        total, rows = 0, []
        for refs in seen.values():
            alive = [r for r in refs if r[0]() is not None]
            if alive:
                top = max(alive, key=lambda r: r[1])
                total += top[1]
                rows.append(top[1:])
        out.loss.backward()
    return total, rows, out.loss.item()


def grad_digest(model) -> dict:
    """Squared gradient norms this rank holds, per parameter: ``whole`` for a parameter every rank holds whole
    (plain, or a replicated DTensor), which must equal the single device's on every rank; ``split`` for one each
    rank holds a slice of (a sharded DTensor; the routed experts' local slices), whose sum over the ranks must
    equal the single device's. A DTensor's gradient may have other placements than its parameter (``Partial``
    for a replicated norm weight under SP, ``Replicate`` for the vocabulary-parallel embedding): it is
    redistributed to the parameter's, as the optimizer's update does (a collective)."""
    from torch.distributed.tensor import DTensor, Replicate

    out = {"whole": {}, "split": {}}
    for name, p in model.named_parameters():
        g = p.grad
        if g is None:
            continue
        sharded = ".experts." in name
        if isinstance(p, DTensor):
            sharded = not all(isinstance(pl, Replicate) for pl in p.placements)
            g = g.redistribute(p.device_mesh, p.placements)._local_tensor  # as the optimizer's update takes it
        out["split" if sharded else "whole"][name] = float(g.double().pow(2).sum())
    return out


def step_peak(model, mode: str, *, vocab_parallel: bool = False) -> dict:
    """MemTracker's peak by kind of the second of two steps ``loss.backward(); opt.step(); opt.zero_grad()``
    (for-loop AdamW: foreach and fused AdamW take DTensor and plain parameters in one group badly)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from trainmath.runtime.tensor_parallel import loss_context

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids0 = batch(model.config.vocab_size)

    def step():
        ids = ids0.clone()
        with loss_context(vocab_parallel):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
                out = model(input_ids=ids, labels=ids, use_cache=False)
            out.loss.backward()
        opt.step()
        opt.zero_grad()

    with MemTracker() as mt:
        mt.track_external(model, opt)
        step()
        mt.reset_mod_stats()
        step()
        peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
    out = {str(getattr(k, "value", k)): v for k, v in peak.items()}
    out["buffers"] = sum(_storage(b).nbytes() for b in model.buffers())
    return out


def measure_case(case, mesh=None, *, peak=True, b=B, **extra) -> dict:
    """``saved`` (``saved``, ``rows``, ``loss``) and ``step_peak`` (``peak``) of one case (config keys ``extra``
    over ``BASE``, ``b`` sequences of ``S`` tokens for ``saved``); on ``mesh`` after ``apply_tp``, else on one
    device."""
    from trainmath.runtime.tensor_parallel import apply_tp

    model_type, attn, mode, sp, vocab_parallel = case
    res = {}
    for what in (("saved", "peak") if peak else ("saved",)):
        model = tiny_model(model_type, attn, mode, **extra)
        if mesh is not None:
            apply_tp(model, mesh, sp=sp, vocab_parallel=vocab_parallel)
        if what == "saved":
            res["saved"], rows, res["loss"] = saved(model, mode, vocab_parallel=vocab_parallel, b=b)
            res["grads"] = grad_digest(model)
            res["rows"] = [[n, list(shape), str(dtype), dt] for n, shape, dtype, dt in rows]
        else:
            res["peak"] = step_peak(model, mode, vocab_parallel=vocab_parallel)
    return res


def _worker(rank, world, port, cases, out_dir, peaks):
    import json

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        gc.freeze()  # the collections in ``saved`` then scan only what the step makes (0.5 s each otherwise)
        res = [measure_case(tuple(c), mesh, peak=p) for c, p in zip(cases, peaks)]
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def process_group(backend: str, world: int):
    """A process group of this process as rank 0 (gloo: a world of 1; fake: any world, collectives that move
    nothing, so only shapes are right) and its 1-D CPU mesh; destroyed on exit."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        store = FakeStore()
    else:
        store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=world)
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()
        from trainmath.runtime import dtensor_state

        dtensor_state.forget()  # its meshes were rank 0's (runtime.dtensor_state)


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_tp(world: int, cases, *, peak_cases=None) -> list[list[dict]]:
    """Per case, per rank: ``measure_case`` on ``world`` real gloo ranks (``step_peak`` too for the cases in
    ``peak_cases``; all when None)."""
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(world, _free_port(), [list(c) for c in cases], d,
                                              [peak_cases is None or tuple(c) in peak_cases for c in cases]),
                           nprocs=world, start_method="spawn", join=True)
        ranks = []
        for r in range(world):
            with open(os.path.join(d, f"{r}.json")) as f:
                ranks.append(json.load(f))
    return [[ranks[r][i] for r in range(world)] for i in range(len(cases))]
