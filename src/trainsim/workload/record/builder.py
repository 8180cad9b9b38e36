"""The op recorder both front ends (trainsim.nn and torch.fx) write into.

A front end walks the model's forward: it tells the recorder which module is running (`at`), makes
symbolic tensors for the inputs, and calls the op constructors of `record.ops`, which append one
`OpRecord` per operator in execution order. `build` then groups the records into layers and a module
tree (record.grouping) and returns the IR Model. One recorder, two front ends: the conventions for
dimension names, FLOPs, bytes and saved tensors live in `record.ops` only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ...errors import ConfigError
from ..ir import Model, Op
from .naming import ViewNames, default_feature_name, unique
from .tensor import CONST, INPUT, PARAM, ParamRef, SymTensor


@dataclass
class OpRecord:
    """One recorded operator before it is placed in a layer.

    `op` is complete except for its name, `input_from` and `extra_params`, which depend on the layer
    it lands in and on which parameters were already counted. `sources[i]` is where `op.inputs[i]`
    comes from (a record index, INPUT or CONST). `base` is the module path of the leaf module that
    ran it, or the function's name ("add") when `module_op` is False. `scope` lists the module paths
    that were running, outermost first (the root "" excluded).
    """

    op: Op
    base: str
    module_op: bool
    scope: tuple[str, ...]
    sources: tuple[int, ...]
    weight: ParamRef | None = None
    extras: tuple[ParamRef, ...] = ()
    ends_stage: bool = False


@dataclass(frozen=True)
class ModuleInfo:
    """What the grouping needs to know about one module of the model: whether it records its own ops
    (a leaf: Linear, Conv2d, ...), whether it is a container (Sequential / ModuleList / ModuleDict)
    and its children's paths, in definition order."""

    leaf: bool
    container: bool
    children: tuple[str, ...] = ()


class GraphBuilder:
    """Records ops in execution order; `build` turns them into a Model."""

    def __init__(self, batch_dim: str, out_dims: Callable[[str], str | None] | None = None) -> None:
        self.batch_dim = batch_dim
        self.records: list[OpRecord] = []
        self.scope: tuple[str, ...] = ()
        self.leaf: str | None = None
        self.views = ViewNames()
        self._out_dims = out_dims
        self.n_inputs = 0

    # -- where we are ----------------------------------------------------------------------------------
    @contextmanager
    def at(self, scope: tuple[str, ...], leaf: str | None = None) -> Iterator[None]:
        """Record the ops of this block as run by module `scope[-1]` (`leaf`: a leaf module's path,
        whose ops are named after it)."""
        saved = self.scope, self.leaf
        self.scope, self.leaf = tuple(p for p in scope if p), leaf
        try:
            yield
        finally:
            self.scope, self.leaf = saved

    @property
    def where(self) -> str:
        """The running module's path, for error messages."""
        return self.leaf or (self.scope[-1] if self.scope else "<root>")

    def feature_name(self, requested: str | None = None) -> str:
        """Name of a new feature dimension (a Linear's outputs): the requested one, else an override
        for the running module (torch.fx `dim_names`), else its attribute name."""
        if requested:
            return requested
        path = self.leaf or (self.scope[-1] if self.scope else "")
        if self._out_dims is not None:
            override = self._out_dims(path)
            if override:
                return override
        return default_feature_name(path)

    # -- tensors ---------------------------------------------------------------------------------------
    def default_names(self, shape: Sequence[int]) -> tuple[str, ...]:
        """Names of a model input by rank: images (batch, c, hi, wi), token ids (batch, s),
        activations (batch, s, h), otherwise (batch, d1, d2, ...)."""
        rank = len(shape)
        if rank == 0:
            return ()
        rest: tuple[str, ...]
        if rank == 4:
            rest = ("c", "hi", "wi")
        elif rank == 2:
            rest = ("c",) if self.batch_dim == "n" else ("s",)
        elif rank == 3:
            rest = ("s", "h")
        else:
            rest = tuple(f"d{i}" for i in range(1, rank))
        return unique((self.batch_dim, *rest))

    def input(self, shape: Sequence[int], names: Sequence[str] | None = None) -> SymTensor:
        """A model input (images, token ids): the first op reading it is the model's first op."""
        self.n_inputs += 1
        return self._tensor(shape, names, INPUT)

    def const(self, shape: Sequence[int], names: Sequence[str] | None = None) -> SymTensor:
        """A tensor made inside forward (arange, zeros, a buffer): read by ops, produced by none. Its
        dims are "x0", "x1", ... unless named: a position table must not share the batch's name."""
        return self._tensor(shape, names or tuple(f"x{i}" for i in range(len(shape))), CONST)

    def param(self, ref: ParamRef, names: Sequence[str] | None = None) -> SymTensor:
        """A parameter read directly by forward; the op reading it counts its elements."""
        t = self._tensor(ref.shape, names or tuple(f"w{i}" for i in range(len(ref.shape))), PARAM)
        return SymTensor(t.shape, t.names, PARAM, ref)

    def _tensor(self, shape: Sequence[int], names: Sequence[str] | None, source: int) -> SymTensor:
        shape = tuple(int(s) for s in shape)
        names = tuple(names) if names is not None else self.default_names(shape)
        if len(names) != len(shape):
            raise ConfigError(f"trace.{self.where}", f"{len(names)} dimension names for a rank-{len(shape)} tensor",
                              "give one name per dimension")
        return SymTensor(shape, unique(names), source)

    # -- views (free: no op) ---------------------------------------------------------------------------
    def reshape(self, x: SymTensor, shape: Sequence[int]) -> SymTensor:
        """x.view / reshape / flatten / squeeze / unsqueeze; one -1 is inferred."""
        new = [int(s) for s in shape]
        if new.count(-1) > 1:
            raise ConfigError(f"trace.{self.where}", f"view {tuple(new)} has more than one -1", "give the sizes")
        if -1 in new:
            known = 1
            for s in new:
                known *= s if s != -1 else 1
            new[new.index(-1)] = x.numel // known if known else 0
        try:
            names = self.views.reshape(x.names, x.shape, tuple(new))
        except ValueError as exc:
            raise ConfigError(f"trace.{self.where}", str(exc), "fix the view's sizes") from None
        return x.like(tuple(new), names)

    def flatten(self, x: SymTensor, start: int = 0, end: int = -1) -> SymTensor:
        s, e = start % max(x.ndim, 1), end % max(x.ndim, 1)
        merged = 1
        for d in x.shape[s:e + 1]:
            merged *= d
        return self.reshape(x, (*x.shape[:s], merged, *x.shape[e + 1:]))

    def permute(self, x: SymTensor, order: Sequence[int]) -> SymTensor:
        """x.permute / transpose: the dimensions (and their names) reordered."""
        order = [o % x.ndim for o in order]
        return x.like(tuple(x.shape[o] for o in order), tuple(x.names[o] for o in order))

    def transpose(self, x: SymTensor, a: int, b: int) -> SymTensor:
        order = list(range(x.ndim))
        order[a % x.ndim], order[b % x.ndim] = order[b % x.ndim], order[a % x.ndim]
        return self.permute(x, order)

    def resize(self, x: SymTensor, shape: Sequence[int], kept: Sequence[int | None]) -> SymTensor:
        """A slice of x (indexing, split, chunk): `kept[j]` is the dimension of x that new dimension
        j comes from (same name, possibly smaller), or None for a new size-1 dimension."""
        names = [x.names[k] if k is not None else "one" for k in kept]
        return x.like(tuple(int(s) for s in shape), unique(names))

    # -- ops -------------------------------------------------------------------------------------------
    def record(self, op: Op, reads: Sequence[SymTensor], out_shape: Sequence[int], out_names: Sequence[str],
               weight: ParamRef | None = None, extras: Sequence[ParamRef] = (), ends_stage: bool = False,
               name: str | None = None) -> SymTensor:
        """Append one op; `reads[i]` is the tensor behind `op.inputs[i]`. Returns its output tensor."""
        if len(reads) != len(op.inputs):
            raise AssertionError(f"{op.kind} op reads {len(reads)} tensors for {len(op.inputs)} inputs")
        if any(t.is_param for t in reads):
            raise AssertionError("parameters are counted through weight/extras, not read as activations")
        module_op = self.leaf is not None and name is None
        base = self.leaf if module_op else (name or str(op.kind))
        assert base is not None
        self.records.append(OpRecord(op, base, module_op, self.scope, tuple(t.source for t in reads), weight,
                                     tuple(extras), ends_stage))
        return SymTensor(tuple(int(s) for s in out_shape), unique(tuple(out_names)), len(self.records) - 1)

    def op_kind_of(self, t: SymTensor) -> str | None:
        """Kind of the op that produced `t` (None for inputs, constants and parameters)."""
        return str(self.records[t.source].op.kind) if t.source >= 0 else None

    # -- result ----------------------------------------------------------------------------------------
    def build(self, name: str, modules: Mapping[str, ModuleInfo], *, blocks: Callable[[str], bool] | None = None,
              family: str | None = None, description: str = "", total_params: int | None = None) -> Model:
        """Group the records into layers under the model's module tree (see record.grouping)."""
        from .grouping import assemble

        if not self.records:
            raise ConfigError(f"trace.{name}", "forward recorded no operators", "check that forward uses the model's layers")
        return assemble(self, name, modules, blocks=blocks, family=family, description=description,
                        total_params=total_params)


__all__ = ["CONST", "INPUT", "PARAM", "GraphBuilder", "ModuleInfo", "OpRecord", "ParamRef", "SymTensor"]
