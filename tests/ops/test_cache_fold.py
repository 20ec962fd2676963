"""The inference cache as a fold over the op lists (``trainmath.ops.cache``): every mixer op names what the cache
keeps of it, with the window and the sharding rules, and one rank's share follows those rules (the bytes against
transformers' real cache objects are ``tests/infer/test_cache_oracle.py``)."""

import pytest

from trainmath.errors import TrainmathError
from trainmath.ops.cache import cache_fold, grows
from trainmath.ops.emit import layer_ops
from trainmath.ops.ir import Degrees
from trainmath.sources import catalog_index, load_spec

ALL = sorted(catalog_index())
KINDS = {"attention": ["kv", "kv"], "mla": ["latent"] * 2 + ["expanded"] * 2, "linear_attention": ["conv", "state"],
         "mamba": ["conv", "state"]}


@pytest.mark.parametrize("model", ALL)
def test_every_mixer_op_names_its_cache(model):
    spec = load_spec(model)
    for layer, _ in spec.layer_groups():
        ops = layer_ops(spec, layer, batch=2, seq=100)
        mixer = next((b for b in layer.blocks if b.kind in KINDS), None)
        assert [t.kind for op in ops for t in op.cache] == (KINDS[mixer.kind] if mixer else []), layer.label
        for op in ops:
            if op.kind == "attention":  # the cache and the FLOPs read one op: its window, its key/value tokens
                assert op.window == getattr(mixer.dims, "sliding_window", None)
                q, k, v = op.inputs[:3]
                tokens = [next(a.size for a in t.axes if a.shard == "seq") for t in op.cache]
                assert tokens == [k.axes[1].size] * len(op.cache) == [100] * len(op.cache)
                if mixer.kind == "attention":  # the heads of the key attention reads: h_kv, or h where Falcon's new
                    # decoder architecture broadcasts them before the cache (as FalconAttention caches num_heads)
                    assert [t.axes[1].size for t in op.cache] == [k.axes[2].size] * 2
                    assert k.axes[2].size in (mixer.dims.kv_heads, mixer.dims.heads)
                    assert op.cache[1].axes[3].size == v.axes[3].size
            if op.kind == "scan":  # the recurrent state's heads are the heads the chunks run over
                heads = op.inputs[0].axes[1 if op.kernel == "chunk_gated_delta_rule" else 2]
                assert op.cache[0].axes[1] == heads
        assert grows(ops) == (mixer is not None and mixer.kind in ("attention", "mla")
                              and getattr(mixer.dims, "sliding_window", None) is None)


def _elements(spec, layer, tp, **kw):
    return {t.name: n for t, n in cache_fold(layer_ops(spec, layer, batch=3, seq=1000), Degrees(tp=tp), **kw)}


def test_kv_heads_fewer_than_ranks_are_replicated():
    """Qwen3-0.6B has 8 K/V heads: at tp 8 each rank holds one, at tp 16 still one (replicated on two ranks)."""
    spec = load_spec("Qwen/Qwen3-0.6B")
    layer = spec.layers[0]
    hd = 128
    for tp, heads in ((1, 8), (2, 4), (8, 1), (16, 1)):
        assert _elements(spec, layer, tp) == {"keys": 3 * heads * 1000 * hd, "values": 3 * heads * 1000 * hd}


def test_sliding_window_caps_tokens_by_convention():
    spec = load_spec("google/gemma-3-1b-it")
    sliding = next(layer for layer, _ in spec.layer_groups()
                   if layer.blocks[0].kind == "attention" and layer.blocks[0].dims.sliding_window)
    w, kv, hd = sliding.blocks[0].dims.sliding_window, sliding.blocks[0].dims.kv_heads, sliding.blocks[0].dims.head_dim
    assert w < 1000
    assert _elements(spec, sliding, 1)["keys"] == 3 * kv * (w - 1) * hd
    assert _elements(spec, sliding, 1, sliding="window")["keys"] == 3 * kv * w * hd


def test_mla_latent_is_whole_on_every_rank_expanded_is_per_head():
    spec = load_spec("deepseek-ai/DeepSeek-V3")
    layer = spec.layers[0]
    d = layer.blocks[0].dims
    for tp in (1, 8):
        assert _elements(spec, layer, tp) == {"latent_kv": 3 * 1000 * d.kv_lora_rank,
                                              "rope_keys": 3 * 1000 * d.qk_rope_head_dim}
        assert _elements(spec, layer, tp, mla="expanded") == {"keys": 3 * 1000 * d.heads // tp * d.qk_head_dim,
                                                              "values": 3 * 1000 * d.heads // tp * d.v_head_dim}


@pytest.mark.parametrize("model, kind", [("Qwen/Qwen3-Next-80B-A3B-Thinking", "linear_attention"),
                                         ("nvidia/Nemotron-H-56B-Base-8K", "mamba")])
def test_scan_states_divide_heads_and_channels(model, kind):
    spec = load_spec(model)
    layer = next(layer for layer, _ in spec.layer_groups() if any(b.kind == kind for b in layer.blocks))
    d = next(b.dims for b in layer.blocks if b.kind == kind)
    if kind == "linear_attention":
        channels = 2 * d.key_heads * d.key_head_dim + d.value_heads * d.value_head_dim
        state = d.value_heads * d.key_head_dim * d.value_head_dim
    else:
        channels = d.heads * d.head_dim + 2 * d.groups * d.state_size
        state = d.heads * d.head_dim * d.state_size
    for tp in (1, 2):
        assert _elements(spec, layer, tp) == {"conv_state": 3 * channels // tp * d.conv_kernel,
                                              "recurrent_state": 3 * state // tp}
    assert _elements(spec, layer, 1, conv="kernel-1")["conv_state"] == 3 * channels * (d.conv_kernel - 1)


def test_unknown_conventions_are_one_line():
    spec = load_spec("Qwen/Qwen3-0.6B")
    ops = layer_ops(spec, spec.layers[0], batch=1, seq=8)
    for kw, msg in ((dict(mla="dense"), "mla cache 'dense' is not one of latent, expanded"),
                    (dict(sliding="all"), "sliding tokens 'all' is not one of window-1, window"),
                    (dict(conv="k"), "conv tokens 'k' is not one of kernel, kernel-1")):
        with pytest.raises(TrainmathError, match=msg):
            cache_fold(ops, **kw)
