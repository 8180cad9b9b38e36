"""Dimension names across views, and the deterministic default names the recorder gives.

A view (reshape, flatten, transpose, slice) records no op, but the op that later reads the view
names its dimensions after the view's names, so views keep names wherever the dimension survives:
  * a dimension kept whole keeps its name (size-1 dimensions are ignored when matching);
  * dimensions merged into one get the name they were split from, if the recorder saw that split
    (heads x head-dim merged back into the attention output "o"), else their names joined by "*"
    ("k*p*q" for a flattened feature map);
  * a dimension split in two gets back the names it was merged from, if known, else "<name>_1",
    "<name>_2", ...;
  * new size-1 dimensions are called "one", "one_2", ...
Names within one tensor (and one op) are kept unique by suffixing "_2", "_3", ...
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def fresh(name: str, taken: Iterable[str]) -> str:
    """`name`, or `name_2`, `name_3`, ... if it is taken."""
    used = set(taken)
    if name not in used:
        return name
    k = 2
    while f"{name}_{k}" in used:
        k += 1
    return f"{name}_{k}"


def unique(names: Sequence[str]) -> tuple[str, ...]:
    """The names with repeats renamed (the first occurrence keeps its name)."""
    out: list[str] = []
    for n in names:
        out.append(fresh(n, out))
    return tuple(out)


def default_feature_name(path: str) -> str:
    """Default name of a layer's output-feature dimension: its module's attribute name ("qkv",
    "fc1"); an index into a Sequential is prefixed with the container's name ("classifier.0" ->
    "classifier_0")."""
    parts = [p for p in path.split(".") if p]
    if not parts:
        return "k"
    tail = [parts.pop()]
    while tail[0].isdigit() and parts:
        tail.insert(0, parts.pop())
    return "_".join(tail)


class ViewNames:
    """Remembers merges and splits so that reshaping back restores the original names."""

    def __init__(self) -> None:
        self._merged: dict[tuple[str, ...], str] = {}  # component names -> merged name
        self._parts: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}  # merged -> components, sizes

    def register(self, parts: tuple[str, ...], sizes: tuple[int, ...], merged: str) -> None:
        """Declare that dimensions `parts` (of `sizes`) together are dimension `merged`."""
        self._merged[parts] = merged
        self._parts[merged] = (parts, sizes)

    def parts(self, name: str) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
        return self._parts.get(name)

    def reshape(self, names: tuple[str, ...], shape: tuple[int, ...], new_shape: tuple[int, ...]) -> tuple[str, ...]:
        """Names of `new_shape` when a tensor (`names`, `shape`) is viewed as it."""
        if math.prod(shape) != math.prod(new_shape):
            raise ValueError(f"cannot view shape {shape} as {new_shape}")
        old = [(n, s) for n, s in zip(names, shape, strict=True) if s != 1]
        new_idx = [j for j, s in enumerate(new_shape) if s != 1]
        out: list[str | None] = [None] * len(new_shape)
        i = k = 0
        while i < len(old) and k < len(new_idx):
            group_old = [old[i]]
            group_new = [new_idx[k]]
            po, pn = old[i][1], new_shape[new_idx[k]]
            i, k = i + 1, k + 1
            while po != pn:
                if po < pn:
                    group_old.append(old[i])
                    po *= old[i][1]
                    i += 1
                else:
                    group_new.append(new_idx[k])
                    pn *= new_shape[new_idx[k]]
                    k += 1
            for j, name in zip(group_new, self._group_names(group_old, [new_shape[j] for j in group_new]), strict=True):
                out[j] = name
        ones = iter([n for n, s in zip(names, shape, strict=True) if s == 1])
        for j, s in enumerate(new_shape):
            if out[j] is None and s == 1:
                out[j] = next(ones, "one")
        return unique([n or "one" for n in out])

    def _group_names(self, old: list[tuple[str, int]], new_sizes: list[int]) -> list[str]:
        old_names = tuple(n for n, _ in old)
        if len(old) == 1 and len(new_sizes) == 1:
            return [old_names[0]]
        if len(new_sizes) == 1:
            merged = self._merged.get(old_names) or "*".join(old_names)
            self.register(old_names, tuple(s for _, s in old), merged)
            return [merged]
        if len(old) == 1:
            known = self._parts.get(old_names[0])
            if known and list(known[1]) == new_sizes:
                return list(known[0])
            parts = tuple(f"{old_names[0]}_{t}" for t in range(1, len(new_sizes) + 1))
            self.register(parts, tuple(new_sizes), old_names[0])
            return list(parts)
        base = "*".join(old_names)
        return [f"{base}_{t}" for t in range(1, len(new_sizes) + 1)]
