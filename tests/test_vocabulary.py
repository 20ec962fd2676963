"""One vocabulary: one ``Precision`` class, one list of attention words, and each command's kernels and aliases
drawn from it (``trainmath.vocabulary``). Read from the source with ``ast``, so a second definition anywhere fails."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainmath.errors import TrainmathError
from trainmath.vocabulary import (
    ATTENTION,
    ATTENTION_ALIASES,
    MEMORY_ATTENTION,
    RECIPES,
    STEP_ATTENTION,
    Precision,
    attention_as,
    precision_of,
)

SRC = Path(__file__).resolve().parents[1] / "src" / "trainmath"
VOCABULARY = SRC / "vocabulary.py"
TREES = {p: ast.parse(p.read_text()) for p in sorted(SRC.rglob("*.py"))}


def test_one_precision_class():
    found = [(p.relative_to(SRC).as_posix(), n.name) for p, tree in TREES.items() for n in ast.walk(tree)
             if isinstance(n, ast.ClassDef) and n.name.endswith("Precision")]
    assert found == [("vocabulary.py", "Precision")]


def _attention_lists(tree) -> list[tuple]:
    """Every tuple, list or set literal of strings that names an attention kernel beside ``eager``."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)) and n.elts \
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.elts):
            words = {e.value for e in n.elts}
            if "eager" in words and words & {"sdpa", "flash"}:
                out.append(tuple(e.value for e in n.elts))
    return out


def test_attention_words_are_listed_once():
    """``flash|eager`` or ``sdpa|eager`` spelled as a list outside the vocabulary (a command's own choices, a
    check of its own) fails: each command names the vocabulary's lists."""
    outside = {p.relative_to(SRC).as_posix(): w for p, tree in TREES.items() if p != VOCABULARY
               if (w := _attention_lists(tree))}
    assert outside == {}
    assert sorted(_attention_lists(TREES[VOCABULARY])) == sorted([ATTENTION, MEMORY_ATTENTION, STEP_ATTENTION])


def test_each_command_models_vocabulary_words_and_states_its_aliases():
    assert set(MEMORY_ATTENTION) <= set(ATTENTION) and set(STEP_ATTENTION) <= set(ATTENTION)
    for word, alias in ATTENTION_ALIASES.items():
        assert word in ATTENTION and alias in ATTENTION
    # every word is accepted by every command: its own name, or the alias of one it models
    assert [attention_as(w, MEMORY_ATTENTION) for w in ATTENTION] == ["sdpa", "sdpa", "eager"]
    assert [attention_as(w, STEP_ATTENTION) for w in ATTENTION] == ["flash", "flash", "eager"]
    with pytest.raises(TrainmathError, match="attention must be one of flash, eager"):
        attention_as("math", STEP_ATTENTION)


def test_cli_accepts_the_old_spellings_and_the_aliases(capsys):
    from trainmath.cli import main

    base = ["memory", "qwen3-0.6b", "--micro-batch", "1", "--seq", "64", "--json"]
    outs = []
    for word in ("sdpa", "flash"):
        assert main([*base, "--attention", word]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]  # flash is read as sdpa, and the setup says sdpa
    est = ["estimate", "qwen3-0.6b", "--gpus", "8", "--gpu", "h100", "--seq", "1024", "--global-batch", "16",
           "--json"]
    outs = []
    for word in ("flash", "sdpa"):
        assert main([*est, "--attention", word]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]  # sdpa is read as flash


def test_precision_of_the_op_lists_is_a_recipe():
    assert precision_of(compute_bytes=2, weight_bytes=4) is RECIPES["amp-bf16"]
    assert precision_of(compute_bytes=2, weight_bytes=2) is RECIPES["bf16"]
    assert precision_of(compute_bytes=4, weight_bytes=4) is RECIPES["fp32"]
    assert RECIPES["amp-bf16"].autocast and not RECIPES["mixed-bf16"].autocast
    assert [p.residual_bytes for p in RECIPES.values()] == [p.weight_bytes for p in RECIPES.values()]
    assert isinstance(precision_of(compute_bytes=2, weight_bytes=2), Precision)
    with pytest.raises(TrainmathError, match="no precision recipe"):
        precision_of(compute_bytes=4, weight_bytes=2)
