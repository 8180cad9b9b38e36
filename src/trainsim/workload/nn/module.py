"""trainsim.nn modules: a PyTorch-shaped API (no torch) whose forward records IR ops when traced.

As in torch, assigning a Module or Parameter to an attribute registers it, in assignment order, so
`named_modules()` yields torch's paths ("layer1.0.conv1") and `parameters()` counts each tensor once
(a weight assigned to two modules - tied embeddings - is one parameter).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

from .context import active
from .tensor import Tensor, unwrap


class Parameter:
    """A trainable tensor: only its shape matters."""

    def __init__(self, *shape: int) -> None:
        self.shape = tuple(int(s) for s in shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"Parameter{self.shape}"


class Module:
    """Base class: subclasses assign children in __init__ and write `forward`.

    Leaf modules (the layers in trainsim.nn.layers) set `_leaf = True` and record their op in
    `_record(ctx, *inputs)` instead of running a forward."""

    _leaf = False

    def __init__(self) -> None:
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_parameters", OrderedDict())

    def __setattr__(self, name: str, value: Any) -> None:
        mods = self.__dict__.get("_modules")
        if mods is None:
            raise AttributeError(f"cannot assign '{name}' before {type(self).__name__}.__init__ called "
                                 "Module.__init__() (call super().__init__() first)")
        params = self.__dict__["_parameters"]
        mods.pop(name, None)
        params.pop(name, None)
        if isinstance(value, Module):
            mods[name] = value
        elif isinstance(value, Parameter):
            params[name] = value
        object.__setattr__(self, name, value)

    # -- structure -------------------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._modules.items()

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """Every module once, depth first in registration order, with its dotted path ('' for self)."""
        seen: set[int] = set()

        def rec(m: Module, path: str) -> Iterator[tuple[str, Module]]:
            if id(m) in seen:
                return
            seen.add(id(m))
            yield path, m
            for name, c in m.named_children():
                yield from rec(c, f"{path}.{name}" if path else name)

        yield from rec(self, prefix)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """Every parameter once (a shared one under its first path)."""
        seen: set[int] = set()
        for path, m in self.named_modules():
            for name, p in m._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{path}.{name}" if path else name), p

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    # -- running ---------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = active(type(self).__name__)
        path = ctx.path(self)
        b = ctx.builder
        scope = (*b.scope, path) if path else b.scope
        if not self._leaf:
            with b.at(scope):
                return self.forward(*args, **kwargs)
        with b.at(scope, path or type(self).__name__.lower()):
            out = self._record(ctx, *unwrap(args), **dict(zip(kwargs, unwrap(list(kwargs.values())), strict=True)))
        return Tensor(out) if out is not None and not isinstance(out, Tensor) else out

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def _record(self, ctx: Any, *inputs: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"leaf module {type(self).__name__} records no op")

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={type(m).__name__}" for n, m in self.named_children())
        return f"{type(self).__name__}({inner})"


class _Indexed(Module):
    """Children numbered "0", "1", ... in registration order, indexable and iterable like torch's containers."""

    def append(self, m: Module) -> Any:
        setattr(self, str(len(self._modules)), m)
        return self

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class Sequential(_Indexed):
    """Children called in order; indexable like torch.nn.Sequential."""

    def __init__(self, *mods: Module | OrderedDict[str, Module]) -> None:
        super().__init__()
        if len(mods) == 1 and isinstance(mods[0], OrderedDict):
            for name, m in mods[0].items():
                setattr(self, name, m)
        else:
            for i, m in enumerate(mods):
                setattr(self, str(i), m)

    def forward(self, x: Any) -> Any:
        for m in self.children():
            x = m(x)
        return x


class ModuleList(_Indexed):
    """A list of modules registered as "0", "1", ...; has no forward of its own."""

    def __init__(self, mods: Iterable[Module] = ()) -> None:
        super().__init__()
        self.extend(mods)

    def extend(self, mods: Iterable[Module]) -> ModuleList:
        for m in mods:
            self.append(m)
        return self


CONTAINERS = (Sequential, ModuleList)
