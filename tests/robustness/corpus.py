"""The bad-input corpus: every class of issue 8's "Bad input that still breaks", over every command.

A case is ``(id, argv, code, needle)``: ``argv`` may hold placeholders filled per test in a fresh folder —
``{cfg:NAME}`` (a config.json written from ``CONFIGS[NAME]``), ``{ckpt:NAME}`` (a safetensors file or folder
from ``CHECKPOINTS``), ``{out}`` (the folder where output files go). ``needle`` must appear in the one
``trainmath: error:`` line (it names the value or the flag).
"""

from __future__ import annotations

import json
import struct

from trainmath.sources import catalog_entry


def _cat(repo: str) -> dict:
    return {k: v for k, v in catalog_entry(repo).config.items() if k != "_source"}


QWEN3 = _cat("Qwen/Qwen3-0.6B")
MISTRAL = _cat("mistralai/Mistral-7B-v0.3")
GPT2 = _cat("openai-community/gpt2")
QWEN3_MOE = _cat("Qwen/Qwen3-30B-A3B")
NEMOTRON = _cat("nvidia/Nemotron-H-56B-Base-8K")
GPT_OSS = _cat("openai/gpt-oss-20b")
GEMMA3 = _cat("google/gemma-3-1b-it")
DEEPSEEK = _cat("deepseek-ai/DeepSeek-V2-Lite")
LLAMA4 = _cat("meta-llama/Llama-4-Scout-17B-16E-Instruct")

NAN, INF = float("nan"), float("inf")
DEEP = "[" * 100_000 + "]" * 100_000  # RecursionError in json.loads before the fix
HUGE = "9" * 5000  # beyond Python's 4,300-digit int() limit

# name -> config dict, or raw text (str) for what json.dumps cannot write
CONFIGS: dict[str, dict | str] = {
    # NaN / Infinity in integer fields
    **{f"qwen3_{k}_{v}": {**QWEN3, k: x} for k in ("hidden_size", "head_dim", "vocab_size",
                                                   "max_position_embeddings", "num_attention_heads",
                                                   "intermediate_size", "num_key_value_heads")
       for v, x in (("nan", NAN), ("inf", INF), ("-inf", -INF))},
    "moe_topk_nan": {**QWEN3_MOE, "num_experts_per_tok": NAN},
    "moe_experts_inf": {**QWEN3_MOE, "num_experts": INF},
    "moe_inter_nan": {**QWEN3_MOE, "moe_intermediate_size": NAN},
    "nemotron_chunk_nan": {**NEMOTRON, "chunk_size": NAN},
    "nemotron_headdim_inf": {**NEMOTRON, "mamba_head_dim": INF},
    "nemotron_state_nan": {**NEMOTRON, "ssm_state_size": NAN},
    "deepseek_kv_lora_inf": {**DEEPSEEK, "kv_lora_rank": INF},
    "gpt2_n_embd_nan": {**GPT2, "n_embd": NAN},
    "gpt2_n_positions_inf": {**GPT2, "n_positions": INF},
    # deeply nested JSON
    "deep_value": '{"model_type": "qwen3", "rope_scaling": ' + DEEP + "}",
    "deep_top": DEEP,
    # integers of thousands of digits, 1e400, absurd sizes
    "huge_hidden": json.dumps(QWEN3)[:-1] + f', "hidden_size": {HUGE}}}',
    "huge_vocab_neg": json.dumps(QWEN3)[:-1] + f', "vocab_size": -{HUGE}}}',
    "float_1e400": json.dumps(QWEN3)[:-1] + ', "intermediate_size": 1e400}',
    "layers_1e8": {**QWEN3, "num_hidden_layers": 100_000_000},
    "experts_1e9": {**QWEN3_MOE, "num_experts": 10**9},
    "hidden_1e20": {**QWEN3, "hidden_size": 10**20},
    # sliding_window
    **{f"sliding_{v}": {**MISTRAL, "sliding_window": x}
       for v, x in (("neg", -4096), ("zero", 0), ("frac", 4096.5), ("nan", NAN), ("str", "4096"), ("bool", True),
                    ("list", [4096]))},
    "gemma3_sliding_neg": {**GEMMA3, "sliding_window": -1},
    "qwen3moe_sliding_on_zero": {**QWEN3_MOE, "use_sliding_window": True, "sliding_window": 0},
    "gpt_oss_sliding_nan": {**GPT_OSS, "sliding_window": NAN},
    "llama4_chunk_neg": {**LLAMA4, "text_config": {**LLAMA4["text_config"], "attention_chunk_size": -8192}},
    # max_position_embeddings
    **{f"positions_{v}": {**QWEN3, "max_position_embeddings": x}
       for v, x in (("zero", 0), ("neg", -1), ("str", "40960"), ("frac", 0.5))},
    # unknown layer types, malformed lists
    "gemma3_layer_types": {**GEMMA3, "layer_types": ["weird_attention"] * GEMMA3["num_hidden_layers"]},
    "gpt_oss_layer_types": {**GPT_OSS, "layer_types": ["full_attention", "mamba"] * 12},
    "qwen3_layer_types_short": {**QWEN3, "layer_types": ["full_attention"]},
    "qwen3_layer_types_str": {**QWEN3, "layer_types": "full_attention"},
    "moe_mlp_only_str": {**QWEN3_MOE, "mlp_only_layers": "0,1"},
    "moe_mlp_only_nan": {**QWEN3_MOE, "mlp_only_layers": [NAN]},
    "nemotron_pattern_bad": {**NEMOTRON, "hybrid_override_pattern": "M*X-"},
    "nemotron_blocks_int": {**{k: v for k, v in NEMOTRON.items() if k != "hybrid_override_pattern"},
                            "layers_block_type": 5},
    # wrong kinds elsewhere
    "architectures_dict": {**QWEN3, "architectures": {"a": 1}},
    "rotary_str": {**QWEN3, "partial_rotary_factor": "half"},
    "rotary_nan": {**QWEN3, "partial_rotary_factor": NAN},
    "softcap_str": {**GEMMA3, "final_logit_softcapping": "thirty"},
    "tie_str": {**QWEN3, "tie_word_embeddings": "yes"},
    "model_type_int": {**QWEN3, "model_type": 5},
    "model_type_unknown": {**QWEN3, "model_type": "qwen99"},
    "llama4_no_text": {**{k: v for k, v in LLAMA4.items() if k != "text_config"}},
    "a_list": "[1, 2, 3]",
    "empty": "",
    "not_json": "{model_type: qwen3",
}

# a config one of whose keys is misspelt: accepted with a warning, refused with --strict
TYPO = {**{k: v for k, v in QWEN3.items() if k != "num_hidden_layers"}, "num_hiden_layers": 28}
CONFIGS["typo"] = TYPO


def safetensors_bytes(header: str | bytes, data: bytes = b"") -> bytes:
    raw = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(raw)) + raw + data


def _ok_header() -> str:
    return json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})


# name -> {file name: bytes} (a folder), for check-checkpoint
CHECKPOINTS: dict[str, dict[str, bytes]] = {
    "deep_header": {"model.safetensors": safetensors_bytes(DEEP)},
    "deep_in_entry": {"model.safetensors": safetensors_bytes('{"x": ' + DEEP + "}")},
    "huge_int_header": {"model.safetensors": safetensors_bytes(
        '{"x": {"dtype": "F32", "shape": [' + HUGE + '], "data_offsets": [0, 8]}}')},
    "header_len_huge": {"model.safetensors": struct.pack("<Q", 2**63) + b"{}"},
    "header_not_utf8": {"model.safetensors": safetensors_bytes(b"\xff\xfe{}")},
    "header_list": {"model.safetensors": safetensors_bytes("[]")},
    "short_file": {"model.safetensors": b"\x01\x02"},
    "bad_dtype": {"model.safetensors": safetensors_bytes(
        '{"x": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 8)},
    "neg_shape": {"model.safetensors": safetensors_bytes(
        '{"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}', b"\0" * 8)},
    "nan_shape": {"model.safetensors": safetensors_bytes(
        '{"x": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 8]}}', b"\0" * 8)},
    "deep_index": {"model.safetensors.index.json": DEEP.encode()},
    "index_huge_total": {"model.safetensors.index.json": (
        '{"metadata": {"total_size": ' + HUGE + '}, "weight_map": {"x": "a.safetensors"}}').encode()},
    "index_total_nan": {"model.safetensors.index.json":
                        b'{"metadata": {"total_size": NaN}, "weight_map": {"x": "a.safetensors"}}'},
    "index_map_list": {"model.safetensors.index.json": b'{"weight_map": ["a.safetensors"]}'},
    "mismatch": {"model.safetensors": safetensors_bytes(_ok_header(), b"\0" * 8)},  # exit 1: not the ledger
    "empty_dir": {},
}

_P = ["params"]
_F = ["flops", "--seq", "128"]
_M = ["memory", "--micro-batch", "1", "--seq", "128"]
_I = ["infer", "--batch", "1", "--context", "128"]


def _cmd(base: list[str], model: str) -> list[str]:
    return [base[0], model, *base[1:]]


def _config_cases() -> list[tuple]:
    """Every bad config through the commands that read one; each class through all six commands."""
    cases = []
    commands = {"params": _P, "flops": _F, "memory": _M, "infer": _I}
    for name in CONFIGS:
        if name == "typo":
            continue
        picks = ["params", "flops", "memory", "infer"] if not name.startswith("qwen3_") else (
            ["params", "infer"] if name.endswith("nan") else ["flops", "memory"])
        for c in picks:
            cases.append((f"{c}-{name}", _cmd(commands[c], f"{{cfg:{name}}}"), 2, ""))
        if name in ("deep_value", "huge_hidden", "sliding_neg", "qwen3_hidden_size_nan", "layers_1e8",
                    "gemma3_layer_types", "positions_zero"):
            cases.append((f"plot-{name}", ["plot", f"{{cfg:{name}}}", "-o", "{out}/p.png"], 2, ""))
            cases.append((f"check-{name}", ["check-checkpoint", "{ckpt:mismatch}", "--config", f"{{cfg:{name}}}"],
                          2, ""))
    return cases


NEEDLES = {  # the value or key each error line must name, for a sample of config cases
    "params-qwen3_hidden_size_nan": "hidden_size must be an integer in 1..1,099,511,627,776, got nan",
    "params-deep_value": "nested too deeply",
    "params-huge_hidden": "hidden_size must be an integer in 1..1,099,511,627,776, got an integer of 5,000 digits",
    "params-float_1e400": "intermediate_size must be an integer in 1..1,099,511,627,776, got inf",
    "params-layers_1e8": "num_hidden_layers must be an integer in 1..100,000, got 100000000",
    "params-experts_1e9": "num_experts must be an integer in 1..65,536",
    "infer-sliding_neg": "sliding_window must be a positive integer (tokens) or null, got -4096",
    "infer-sliding_zero": "sliding_window must be a positive integer (tokens) or null, got 0",
    "infer-sliding_frac": "got 4096.5",
    "infer-sliding_str": "got '4096'",
    "infer-sliding_nan": "sliding_window must be a positive integer (tokens) or null, got nan",
    "infer-positions_zero": "max_position_embeddings must be an integer in 1..",
    "infer-positions_str": "max_position_embeddings must be an integer in 1..1,099,511,627,776, got '40960'",
    "params-gemma3_layer_types": "layer_types has unknown types ['weird_attention']",
    "flops-gpt_oss_layer_types": "layer_types has unknown types ['mamba']",
    "params-moe_mlp_only_str": "mlp_only_layers must be a list of layer indices",
    "params-nemotron_pattern_bad": "hybrid_override_pattern has unknown symbols ['X']",
    "params-rotary_str": "partial_rotary_factor must be a number in (0, 1], got 'half'",
    "params-softcap_str": "final_logit_softcapping must be a positive finite number or null, got 'thirty'",
    "params-model_type_unknown": "model_type 'qwen99' is not supported",
    "params-deep_top": "nested too deeply",
    "params-empty": "is not valid JSON",
}

_GIANT = "1" + "0" * 5000

CLI_CASES: list[tuple] = [
    # integers of thousands of digits, 1e400, NaN on the command line
    *[(f"{c}-{flag}-{v}", [*base[:1], "qwen3-0.6b", *[a for a in base[1:]], flag, x], 2, f"argument {flag}")
      for c, base, flags in (("flops", _F, ("--seq", "--batch")), ("memory", _M, ("--seq", "--micro-batch", "--dp")),
                             ("infer", _I, ("--context", "--batch", "--tp")))
      for flag in flags for v, x in (("1e400", "1e400"), ("giant", _GIANT), ("nan", "nan"), ("float", "2.5"))],
    ("flops-seq-zero", ["flops", "qwen3-0.6b", "--seq", "0"], 2, "argument --seq: must be an integer in 1.."),
    ("flops-seq-neg", ["flops", "qwen3-0.6b", "--seq", "-8"], 2, "--seq"),
    ("flops-mamba-chunk-zero", ["flops", "nvidia/Nemotron-H-56B-Base-8K", "--seq", "64", "--mamba-chunk", "0"], 2,
     "argument --mamba-chunk"),
    ("infer-workspace-1e400", [*_cmd(_I, "qwen3-0.6b"), "--workspace", "1e400"], 2, "argument --workspace"),
    ("infer-workspace-giant-gib", [*_cmd(_I, "qwen3-0.6b"), "--workspace", "1e400000000GiB"], 2,
     "argument --workspace"),
    ("infer-workspace-digits", [*_cmd(_I, "qwen3-0.6b"), "--workspace", _GIANT + "GiB"], 2, "argument --workspace"),
    ("infer-workspace-nan", [*_cmd(_I, "qwen3-0.6b"), "--workspace", "nanGiB"], 2, "argument --workspace"),
    ("infer-workspace-neg", [*_cmd(_I, "qwen3-0.6b"), "--workspace=-1GiB"], 2, "argument --workspace"),
    ("infer-workspace-zettabyte", [*_cmd(_I, "qwen3-0.6b"), "--workspace", "9999999999TiB"], 2,
     "argument --workspace"),
    ("infer-mem-util-nan", [*_cmd(_I, "qwen3-0.6b"), "--mem-util", "nan"], 2, "argument --mem-util"),
    ("infer-group-size-giant", [*_cmd(_I, "qwen3-0.6b"), "--group-size", _GIANT], 2, "argument --group-size"),
    ("memory-zero-giant", [*_cmd(_M, "qwen3-0.6b"), "--zero", _GIANT], 2, "argument --zero"),
    ("memory-world-1e400", [*_cmd(_M, "qwen3-0.6b"), "--world-size", "1e400"], 2, "argument --world-size"),
    # sequence longer than learned positions
    ("flops-gpt2-seq-4096", ["flops", "openai-community/gpt2", "--seq", "4096"], 2,
     "--seq 4096 is longer than openai-community/gpt2's 1024 learned positions"),
    # comm: floats that are not finite, sizes without bound, empty addresses
    *[(f"comm-{sub}-timeout-{v}", ["comm", sub, *pre, "--timeout", v], 2, "argument --timeout")
      for sub, pre in (("demo", ["all_reduce"]), ("bench", []), ("check", []))
      for v in ("nan", "inf", "1e300", "0", "-1", "-inf")],
    *[(f"comm-demo-sleep-{v}", ["comm", "demo", "barrier", "--sleep", v], 2, "argument --sleep")
      for v in ("nan", "inf", "-1", "1e9")],
    *[(f"comm-bench-{flag}-{v}", ["comm", "bench", flag, v, "--link-gbps" if flag == "--alpha-us" else "--alpha-us",
                                  "10"], 2, f"argument {flag}")
      for flag in ("--alpha-us", "--link-gbps") for v in ("nan", "inf", "-1", "1e400")],
    ("comm-bench-reduce-gbps-nan", ["comm", "bench", "--reduce-gbps", "nan"], 2, "argument --reduce-gbps"),
    ("comm-demo-master-addr-empty", ["comm", "demo", "all_reduce", "--master-addr", ""], 2, "argument --master-addr"),
    ("comm-demo-master-addr-space", ["comm", "demo", "all_reduce", "--master-addr", "a b"], 2,
     "argument --master-addr"),
    ("comm-demo-master-port-big", ["comm", "demo", "all_reduce", "--master-port", "70000"], 2,
     "argument --master-port"),
    ("comm-demo-nproc-1000", ["comm", "demo", "all_reduce", "--nproc", "1000"], 2,
     "argument --nproc/--nproc-per-node: must be an integer in 1..64, got '1000'"),
    ("comm-demo-nproc-giant", ["comm", "demo", "all_reduce", "--nproc", _GIANT], 2, "argument --nproc"),
    ("comm-demo-nnodes-100000", ["comm", "demo", "all_reduce", "--nnodes", "100000"], 2, "argument --nnodes"),
    ("comm-demo-node-rank-out", ["comm", "demo", "all_reduce", "--nnodes", "2", "--node-rank", "5",
                                 "--master-port", "29999"], 2, "--node-rank must be in 0..1"),
    ("comm-demo-unknown-long", ["comm", "demo", "x" * 5000], 2, "unknown demo"),
    ("comm-layout-100000", ["comm", "layout", "--nnodes", "100000", "--nproc-per-node", "100000"], 2,
     "argument --nnodes"),
    ("comm-layout-1000x1000", ["comm", "layout", "--nnodes", "1000", "--nproc-per-node", "1000"], 2,
     "1,000,000 processes; the table lists at most 65,536"),
    ("comm-layout-subgroup-giant", ["comm", "layout", "--subgroup", _GIANT], 2, "--subgroup must be"),
    ("comm-layout-subgroup-out", ["comm", "layout", "--subgroup", "0,99"], 2, "subgroup ranks"),
    ("comm-bench-sizes-1T", ["comm", "bench", "--sizes", "1:1024G"], 2, "at most 4,294,967,296"),
    ("comm-bench-sizes-giant", ["comm", "bench", "--sizes", _GIANT], 2, "--sizes"),
    ("comm-bench-sizes-1e400", ["comm", "bench", "--sizes", "1e400"], 2, "bad size"),
    ("comm-bench-segment-giant", ["comm", "bench", "--impl", "ring", "--segment", "9" * 30], 2, "--segment"),
    ("comm-bench-iters-0", ["comm", "bench", "--iters", "0"], 2, "argument --iters"),
    ("comm-bench-factor-1", ["comm", "bench", "--factor", "1"], 2, "argument --factor"),
    # plot -o
    ("plot-o-directory", ["plot", "qwen3-0.6b", "-o", "{out}/dir.png"], 2, "is a directory"),
    ("plot-o-unwritable", ["plot", "qwen3-0.6b", "-o", "/proc/trainmath-corpus.png"], 2, "cannot write"),
    ("plot-o-no-parent", ["plot", "qwen3-0.6b", "-o", "{out}/missing/p.png"], 2, "does not exist"),
    ("plot-o-suffix", ["plot", "qwen3-0.6b", "-o", "{out}/p.txt"], 2, "--output must end in .png"),
    ("plot-o-under-file", ["plot", "qwen3-0.6b", "-o", "{out}/file/p.png"], 2, "does not exist"),
    # model names
    ("params-unknown-long-name", ["params", "q" * 5000], 2, "characters"),
    ("params-typo-strict", ["params", "{cfg:typo}", "--strict"], 2,
     "num_hiden_layers (did you mean num_hidden_layers?)"),
    # check-checkpoint
    *[(f"check-{name}", ["check-checkpoint", f"{{ckpt:{name}}}", "--config", "qwen3-0.6b"],
       1 if name == "mismatch" else 2, "") for name in CHECKPOINTS],
]
