"""Typed result trees whose totals are sums.

A ``Node`` has a name, an exact integer value, a unit and children; a parent's value is always the sum of its
children's (``Node.of`` builds it that way; ``check_sums`` verifies a whole tree). Conversion to GiB, B or M
happens only when rendering.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Node:
    name: str
    value: int
    unit: str
    children: tuple[Node, ...] = ()
    note: str = ""

    @classmethod
    def of(cls, name: str, children: tuple[Node, ...] | list[Node], unit: str, note: str = "") -> Node:
        """A parent whose value is the sum of its children."""
        children = tuple(children)
        return cls(name=name, value=sum(c.value for c in children), unit=unit, children=children, note=note)

    def child(self, name: str) -> Node:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(name)

    def flat(self) -> dict[str, int]:
        """name → value for the direct children."""
        return {c.name: c.value for c in self.children}

    def walk(self, depth: int = 0):
        yield depth, self
        for c in self.children:
            yield from c.walk(depth + 1)

    def to_dict(self) -> dict:
        out: dict = {"name": self.name, "value": self.value, "unit": self.unit}
        if self.note:
            out["note"] = self.note
        if self.children:
            out["children"] = [c.to_dict() for c in self.children]
        return out


def scaled(node: Node, k: int, name: str | None = None, note: str | None = None) -> Node:
    """``node`` with every value multiplied by k (k equal copies: layers of one type, micro-batches)."""
    return Node(name=name or node.name, value=node.value * k, unit=node.unit, note=node.note if note is None else note,
                children=tuple(scaled(c, k) for c in node.children))


def check_sums(node: Node) -> list[str]:
    """Every node whose value differs from the sum of its children (empty when the tree is consistent)."""
    bad = []
    for _, n in node.walk():
        if n.children and n.value != sum(c.value for c in n.children):
            bad.append(f"{n.name}: {n.value} != {sum(c.value for c in n.children)}")
    return bad
