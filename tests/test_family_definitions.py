"""One definition per family: no code outside ``trainmath/families/`` compares a ``model_type`` (read with ``ast``),
and every spec carries its family's definition."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainmath import families
from trainmath.errors import TrainmathError
from trainmath.sources import catalog_index, load_spec

SRC = Path(__file__).resolve().parents[1] / "src" / "trainmath"
COMPARE = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def _names_model_type(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "model_type") or \
        (isinstance(node, ast.Name) and node.id == "model_type")


def model_type_comparisons(source: str) -> list[int]:
    """Line numbers of the comparisons in ``source`` with ``model_type`` (a name or an attribute) on either side."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, COMPARE) for op in node.ops) \
                and any(_names_model_type(n) for n in (node.left, *node.comparators)):
            lines.append(node.lineno)
    return lines


def test_the_checker_sees_a_comparison():
    """Pinned: each spelling the rule forbids is found, a lookup by name is not."""
    assert model_type_comparisons('if spec.model_type == "gpt2": pass') == [1]
    assert model_type_comparisons('x = model_type in ("a", "b")\ny = cfg.model_type != "qwen3"') == [1, 2]
    assert model_type_comparisons("fam = families.get(spec.model_type)") == []


def test_no_model_type_comparison_outside_the_families():
    found = [f"{p.relative_to(SRC)}:{line}" for p in sorted(SRC.rglob("*.py"))
             if "families" not in p.relative_to(SRC).parts
             for line in model_type_comparisons(p.read_text())]
    assert found == []


@pytest.mark.parametrize("model", sorted(catalog_index()))
def test_every_spec_carries_its_family(model):
    spec = load_spec(model)
    assert spec.family is families.get(spec.model_type)
    assert spec.family.build is not None


def test_a_family_is_defined_once():
    with pytest.raises(TrainmathError, match="defined twice"):
        families.register(families.FamilyDef(model_type="llama"))
    assert all(f.model_type == m for m, f in families.REGISTRY.items())


def _calls(source: str, names: tuple[str, ...]) -> list[int]:
    """Line numbers of calls to a function or method named one of ``names``."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and ((isinstance(node.func, ast.Name) and node.func.id in names)
                 or (isinstance(node.func, ast.Attribute) and node.func.attr in names))]


def test_one_program_per_layer():
    """``ops.program`` is the only module that builds a ``Ctx`` or calls a family's emitter (``FamilyDef.layer``,
    ``shape_emitter``); the folds ask it for programs."""
    assert _calls("ctx = Ctx(b=1)\nspec.family.layer(prog, ctx, layer, style)", ("Ctx", "layer")) == [1, 2]
    found = [f"{p.relative_to(SRC)}:{line}" for p in sorted(SRC.rglob("*.py"))
             if p.relative_to(SRC).as_posix() not in ("ops/program.py", "families/__init__.py")
             for line in _calls(p.read_text(), ("Ctx", "layer", "shape_emitter"))]
    assert found == []
