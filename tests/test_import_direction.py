"""The house's import directions, read from the source with ``ast`` (every import, lazy and type-only included).

Rooms stand on floors: a module may import its own room or a room on a lower floor, never a higher one. The
calculator wing (floors 0-8) imports no torch; the runtime imports the calculator only; ``verify`` compares the two
from above both; ``plot``, ``report``, ``serve`` and ``cli`` sit on top. Between modules there is no import cycle.
``KNOWN`` names the edges and cycles still to remove: a new one fails, and a removed one must leave the list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "trainmath"

FLOORS = {
    "trainmath": 0, "arith": 0, "errors": 0, "tree": 0, "catalog": 0, "vocabulary": 0, "jsonfile": 0,
    "model": 1, "hardware": 1,
    "layout": 2, "placement": 2,
    "ops": 3, "families": 4,
    "params": 5, "sources": 5, "explain": 5, "checkpoint": 5, "usable": 5, "adapters": 5,
    "adapter_params": 5, "qlora": 5,
    "flops": 6, "comm": 6, "memory": 7, "infer": 7, "perf": 8, "plan": 9,
    "runtime": 10, "verify": 11,
    "render": 12, "args": 12, "plot": 12, "report": 13, "serve": 14, "cli": 15, "__main__": 16,
}
"""Room (the first name under ``trainmath``) → floor."""
CALCULATOR_TOP = FLOORS["plan"]
"""Rooms on this floor or below are the calculator wing. ``families`` stands above ``ops`` (its emitters call the
kernels) and below every room that reads a ``ModelSpec`` built through it."""

KNOWN_UPWARD: set = set()
"""Imports from a lower floor to a higher one not yet removed."""
KNOWN_CYCLES: set = set()
"""Module cycles not yet removed."""


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(SRC.rglob("*.py")):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports: ``from pkg import sub`` is ``pkg.sub`` when that is a module, else ``pkg``
    (a package's ``__init__`` runs before any of its modules, so that alone is no edge)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            subs = {f"{base}.{a.name}" for a in node.names}
            found |= {t if t in MODULES else base for t in subs}
    return found


EDGES = {m: _imports(m, p) for m, p in MODULES.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _internal(module: str) -> set[str]:
    return {t for t in EDGES[module] if t in MODULES and t != module}


def _cycles() -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    for root in MODULES:
        if root in index:
            continue
        work = [(root, iter(sorted(_internal(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(_internal(w)))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def test_every_room_has_a_floor():
    assert sorted({_room(m) for m in MODULES} - set(FLOORS)) == []


def test_no_import_runs_upward():
    assert sorted({_room(m) for m in MODULES} - set(FLOORS)) == [], "give the new room a floor"
    upward = {(m, t) for m in MODULES for t in _internal(m) if FLOORS[_room(t)] > FLOORS[_room(m)]}
    assert upward - KNOWN_UPWARD == set()
    assert KNOWN_UPWARD - upward == set(), "removed: take it off KNOWN_UPWARD"


def test_no_import_cycles():
    assert set(_cycles()) == KNOWN_CYCLES


@pytest.mark.parametrize("module", [m for m in MODULES if FLOORS.get(_room(m), 0) <= CALCULATOR_TOP])
def test_calculator_wing_imports_no_torch_and_nothing_above_it(module):
    bad = {t for t in EDGES[module] if t.split(".")[0] in ("torch", "transformers")
           or (t in MODULES and FLOORS[_room(t)] > CALCULATOR_TOP)}
    assert bad == set()


def test_the_checker_sees_what_it_checks():
    """Pinned edges the checks rely on: a lazy import, a relative-free ``from x import module``, a torch import."""
    assert "trainmath.verify.train" in EDGES["trainmath.cli.verify"]
    assert "trainmath.ops.flops" in EDGES["trainmath.flops.model"]
    assert "torch" in EDGES["trainmath.runtime.demo"]
    assert FLOORS[_room("trainmath.verify.simulate")] > FLOORS[_room("trainmath.runtime.fsdp")]


def _words() -> dict[str, tuple]:
    from trainmath import vocabulary

    return {k: v for k, v in vars(vocabulary).items()
            if k.isupper() and isinstance(v, tuple) and all(isinstance(x, str) for x in v)}


def test_the_words_are_pinned():
    """The spellings users type: a word that changes here changes every command's choices."""
    w = _words()
    assert w["RECOMPUTE"] == ("none", "selective", "full")
    assert w["TRAIN_OPTIMIZERS"] == ("sgd", "momentum", "adam", "adamw")
    assert {"sgd", "sgd-momentum", "adam", "adamw"} <= set(w["OPTIMIZERS"])
    assert len(w) >= 13


@pytest.mark.parametrize("word", sorted(_words()))
def test_each_word_is_defined_once(word):
    """One vocabulary: each choice tuple is ``trainmath.vocabulary``'s, imported everywhere else (the recompute
    choices, the optimizers, precisions, attention, experts, ...), never spelled again in the source."""
    from trainmath import vocabulary

    spelled = repr(_words()[word]).replace("'", '"')
    found = [p for p in MODULES.values() if spelled in " ".join(p.read_text().split())]
    assert found == [Path(vocabulary.__file__).resolve()]


def test_every_optimizer_the_runtime_runs_is_one_the_calculator_counts():
    from trainmath.vocabulary import OPTIMIZERS, RECIPES, TRAIN_OPTIMIZERS, TRAIN_PRECISIONS, optimizer_name

    assert [optimizer_name(o) for o in TRAIN_OPTIMIZERS] == ["sgd", "sgd-momentum", "adam", "adamw"]
    assert {optimizer_name(o) for o in TRAIN_OPTIMIZERS} <= set(OPTIMIZERS)
    assert set(TRAIN_PRECISIONS) <= set(RECIPES)
