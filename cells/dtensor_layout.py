"""HyperParallel DTensor layouts: which reductions give the true global norm (pure logic).

HyperParallel (``hyper_parallel``: ``shard_module``, ``hsdp``) keeps a parameter's layout on the
parameter (a ``ParameterDTensor``: ``.placements``, one placement per mesh dim, and ``.device_mesh``)
while its gradient arrives as a plain tensor holding this rank's local part. Squaring that local part
gives a per-rank norm. This module maps each parameter's placements and mesh to a
:class:`ParamNormPlan`: the mesh groups its gradient is all-reduced over *before* squaring (the dims
where the gradient is still a partial sum) and the groups its local sum of squares is all-reduced over
*after* (the dims it is sharded on). Dims it is replicated on contribute nothing: each rank of such a
dim holds the same values, so they count once.

Detection is duck-typed (``hyper_parallel`` is not a dependency): a placement is read through its
``is_shard()`` / ``is_replicate()`` / ``is_partial()`` methods and ``dim`` / ``reduce_op``
attributes, a mesh through ``mesh_shape``, ``mesh_dim_names`` and ``get_group(dim)`` (a group name,
or an object with ``group_name``). What gradmon cannot get right is refused with
:class:`~gradmon.cells.errors.UnsupportedParallelError`, saying what to do.

Where a gradient is still a partial sum cannot be read from the parameter: HyperParallel's
``shard_module`` alone leaves the gradients of replicated parameters as per-rank partial sums (the loss
is seeded with ``1/repeat`` on every rank), while ``hsdp`` or a data-parallel all-reduce sums them.
So a replicated mesh dim of more than one rank needs ``replicate_grads``: ``"partial"`` (gradmon sums
the gradient over that dim before squaring) or ``"reduced"`` (already summed; counted once).

``hyper_parallel.hsdp`` (MindSpore's FSDP in HyperParallel) marks the parameters it manages
(``has_hsdp_param``) and its gradient hook sums their gradients over every mesh dim they are not
sharded on, so those dims count as reduced. It slices a parameter on dim 0 without changing its
placements (``hsdp_effective_shard_size`` > 1, the group on hsdp's own state): such parameters need
``network=`` (the cell ``hsdp`` was applied to), where their sharded groups are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import UnsupportedParallelError

__all__ = ["PARTIAL", "REDUCED", "DTensorLayout", "MeshDim", "ParamNormPlan", "hsdp_params_of", "hsdp_sliced",
           "is_dtensor", "mesh_dims", "placement_kind", "plan_parameter"]

PARTIAL = "partial"  # the gradient on this mesh dim is a per-rank partial sum: sum it before squaring
REDUCED = "reduced"  # already summed over this mesh dim (hsdp, a data-parallel all-reduce): count once
GRAD_STATES = (PARTIAL, REDUCED)
PARTIAL_OPS = ("sum", "avg")  # Partial reductions gradmon can complete (all-reduce sum, then / size for avg)

_HOW_REPLICATE = ("pass replicate_grads={{{dim!r}: 'partial'}} when nothing has summed these gradients over "
                  "that dim yet (HyperParallel's shard_module alone: replicated parameters' gradients come "
                  "back as per-rank partial sums; gradmon then sums them before squaring), or "
                  "replicate_grads={{{dim!r}: 'reduced'}} when hsdp or a data-parallel all-reduce has summed "
                  "them (counted once)")


@dataclass(frozen=True)
class MeshDim:
    """One dim of a device mesh: its name, its size and this rank's communication group along it."""

    name: str
    size: int
    group: str | None  # None: the mesh has no process group for it (refused when a reduction needs it)


@dataclass(frozen=True)
class ParamNormPlan:
    """How one parameter's gradient enters the global norm.

    ``reduce_before``: ``(group, op, size)`` per mesh dim where the gradient is a partial sum; it is
    all-reduced (sum; ``avg`` then divides by ``size``) before squaring. ``sum_squares_over``: the groups
    (sharded dims) its local sum of squares is all-reduced over. Both empty: a replicated parameter,
    whose local sum of squares is already the whole one.
    """

    name: str
    placements: str  # as HyperParallel prints them, e.g. "(S(0), R)"; "plain" for a non-DTensor parameter
    reduce_before: tuple[tuple[str, str, int], ...] = ()
    sum_squares_over: tuple[str, ...] = ()


def is_dtensor(obj: Any) -> bool:
    """Whether ``obj`` carries a DTensor layout (non-None ``placements`` and ``device_mesh``)."""
    return getattr(obj, "placements", None) is not None and getattr(obj, "device_mesh", None) is not None


def placement_kind(placement: Any) -> tuple[str, Any]:
    """``("shard", tensor_dim)``, ``("replicate", None)`` or ``("partial", reduce_op)`` of one placement.

    Read through HyperParallel's ``is_shard()``/``is_replicate()``/``is_partial()`` (torch's DTensor
    placements have the same methods); ``ValueError`` for anything else.
    """
    def asks(method: str) -> bool:
        fn = getattr(placement, method, None)
        return bool(fn()) if callable(fn) else False

    if asks("is_shard"):
        dim = getattr(placement, "dim", None)
        if not isinstance(dim, int):
            raise ValueError(f"shard placement {placement!r} has no integer dim")
        return "shard", dim
    if asks("is_replicate"):
        return "replicate", None
    if asks("is_partial"):
        return "partial", str(getattr(placement, "reduce_op", "sum"))
    raise ValueError(f"unknown placement {placement!r} (expected Shard(dim), Replicate() or Partial(op))")


def _placement_str(kind: str, arg: Any) -> str:
    return {"shard": f"S({arg})", "replicate": "R", "partial": f"P({arg})"}[kind]


def mesh_dims(mesh: Any) -> tuple[MeshDim, ...]:
    """The dims of a (duck-typed) HyperParallel ``DeviceMesh``: names, sizes, this rank's groups."""
    shape = tuple(int(s) for s in mesh.mesh_shape)
    names = getattr(mesh, "mesh_dim_names", None) or tuple(f"dim_{i}" for i in range(len(shape)))
    dims = []
    for i, (name, size) in enumerate(zip(names, shape)):
        group = None
        if size > 1:
            try:
                got = mesh.get_group(i)
            except Exception:  # no process groups on this mesh: refused where a reduction needs one
                got = None
            group = getattr(got, "group_name", got)
            group = str(group) if group is not None else None
        dims.append(MeshDim(str(name), size, group))
    return tuple(dims)


def _need_group(name: str, dim: MeshDim, why: str) -> str:
    if dim.group is None:
        raise UnsupportedParallelError(
            f"parameter {name!r} {why} mesh dim {dim.name!r} ({dim.size} ranks), but its DeviceMesh has no "
            "communication group for that dim: build the mesh with its process groups "
            "(hyper_parallel.init_device_mesh, or DeviceMesh(...) without _init_backend=False)")
    return dim.group


def plan_parameter(name: str, placements: Sequence[Any] | None, dims: Sequence[MeshDim], ndim: int,
                   replicate_grads: Mapping[str, str], hsdp: tuple[bool, str | None, int] = (False, None, 1),
                   ) -> ParamNormPlan:
    """The plan of one parameter (pure: every input given).

    ``placements`` None: a plain parameter, replicated over every dim of ``dims``. ``ndim``: the
    parameter's number of dimensions. ``replicate_grads``: mesh dim name → ``"partial"``/``"reduced"``.
    ``hsdp``: ``(managed, sharded_group, shards)`` when ``hyper_parallel.hsdp`` manages the parameter:
    its gradient hook sums the gradient over every mesh dim the parameter is not sharded on (so those
    count as reduced), and a parameter it sliced on dim 0 is also summed over its sharded group.
    """
    managed, hsdp_group, hsdp_shards = hsdp
    if managed:
        replicate_grads = {d.name: REDUCED for d in dims}
    if placements is None:
        kinds = [("replicate", None)] * len(dims)
        shown = "plain"
    else:
        placements = tuple(placements)
        if len(placements) != len(dims):
            raise UnsupportedParallelError(
                f"parameter {name!r} has {len(placements)} placements for a {len(dims)}-dim device mesh "
                f"({', '.join(d.name for d in dims)}): one placement per mesh dim is needed")
        try:
            kinds = [placement_kind(p) for p in placements]
        except ValueError as exc:
            raise UnsupportedParallelError(f"parameter {name!r}: {exc}; gradmon cannot tell how its "
                                           "gradient is split, so its norm would be wrong") from None
        shown = "(" + ", ".join(_placement_str(k, a) for k, a in kinds) + ")"
    reduce_before: list[tuple[str, str, int]] = []
    sum_over: list[str] = []
    for (kind, arg), dim in zip(kinds, dims):
        if dim.size == 1:
            continue  # one rank along this dim: its local part is the whole
        if kind == "shard":
            if not -ndim <= arg < ndim:
                raise UnsupportedParallelError(
                    f"parameter {name!r} is Shard({arg}) on mesh dim {dim.name!r} but has {ndim} dims")
            sum_over.append(_need_group(name, dim, "is sharded on"))
        elif kind == "partial":
            if arg not in PARTIAL_OPS:
                raise UnsupportedParallelError(
                    f"parameter {name!r} is Partial(reduce_op={arg!r}) on mesh dim {dim.name!r}: gradmon "
                    f"completes only {' and '.join(PARTIAL_OPS)} partial sums; reduce it first "
                    "(DTensor.reduce_partial() or redistribute to Replicate) and pass the reduced gradient")
            reduce_before.append((_need_group(name, dim, "is a partial sum on"), arg, dim.size))
        else:
            state = replicate_grads.get(dim.name)
            if state is None:
                what = "a plain parameter" if placements is None else "R"
                raise UnsupportedParallelError(
                    f"parameter {name!r} is replicated ({what}) "
                    f"on mesh dim {dim.name!r} ({dim.size} ranks), and gradmon cannot tell whether its "
                    "gradient there is already summed or still a per-rank partial sum: "
                    + _HOW_REPLICATE.format(dim=dim.name))
            if state == PARTIAL:
                reduce_before.append((_need_group(name, dim, "has a partial-sum gradient on"), "sum",
                                      dim.size))
    if hsdp_shards > 1:
        if hsdp_group is None:
            raise UnsupportedParallelError(
                f"parameter {name!r} is sliced by hyper_parallel.hsdp, whose state names no sharded group")
        sum_over.append(hsdp_group)
        shown += f"+hsdp({hsdp_shards})"
    return ParamNormPlan(name, shown, tuple(reduce_before), tuple(sum_over))


def _grad_states(replicate_grads: str | Mapping[str, str] | None, names: Iterable[str]) -> dict[str, str]:
    names = tuple(dict.fromkeys(names))
    if replicate_grads is None:
        return {}
    if isinstance(replicate_grads, str):
        replicate_grads = {n: replicate_grads for n in names}
    states = dict(replicate_grads)
    for dim, state in states.items():
        if state not in GRAD_STATES:
            raise ValueError(f"replicate_grads[{dim!r}] must be one of {GRAD_STATES}, got {state!r}")
        if dim not in names:
            raise ValueError(f"replicate_grads names mesh dim {dim!r}, which no parameter's mesh has "
                             f"(mesh dims: {', '.join(names) or 'none'})")
    return states


@dataclass(frozen=True)
class DTensorLayout:
    """The norm plans of a model's parameters, built once (:meth:`from_params`) and passed to
    :func:`gradmon.cells.global_norm` / :func:`gradmon.cells.clip_by_global_norm` as ``layout=``.

    ``buckets`` is the constant schedule the norm runs: per set of groups to all-reduce the sums of
    squares over, the parameters (by index) of each set of before-squaring reductions.
    """

    plans: tuple[ParamNormPlan, ...]
    dims: tuple[MeshDim, ...] = ()  # every mesh dim seen (for the header)
    replicate_grads: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_params(cls, params: Sequence[Any], *, replicate_grads: str | Mapping[str, str] | None = None,
                    network: Any = None) -> DTensorLayout:
        """Read the layouts of ``params`` (in the order of their gradients).

        ``replicate_grads``: ``"partial"`` / ``"reduced"`` for every mesh dim, or a mapping per mesh dim
        name (``{"dp": "reduced", "tp": "partial"}``); needed when a parameter is replicated over a dim
        of more than one rank (see the module docstring). Parameters without placements are replicated
        over the mesh dims of the DTensor parameters (they must agree on each dim's group).
        ``network``: the cell ``hyper_parallel.hsdp`` was applied to (or one holding it), needed when
        hsdp sliced parameters on dim 0: their sharded groups are read from hsdp's state there.
        Raises :class:`UnsupportedParallelError` for what it cannot get right, saying what to do.
        """
        params = tuple(params)
        if not params:
            raise ValueError("DTensorLayout.from_params needs at least one parameter")
        names = [str(getattr(p, "name", f"#{i}")) for i, p in enumerate(params)]
        by_id = hsdp_params_of(network) if network is not None else {}
        refuse_hsdp_slices([p for p in params if id(p) not in by_id],
                           [n for n, p in zip(names, params) if id(p) not in by_id])
        meshes = [mesh_dims(p.device_mesh) if is_dtensor(p) else None for p in params]
        seen: dict[str, MeshDim] = {}
        for name, dims in zip(names, meshes):
            for dim in dims or ():
                known = seen.setdefault(dim.name, dim)
                if (known.size, known.group) != (dim.size, dim.group):
                    raise UnsupportedParallelError(
                        f"mesh dim {dim.name!r} is {known.size} ranks in group {known.group!r} for one "
                        f"parameter and {dim.size} ranks in group {dim.group!r} for {name!r}: gradmon "
                        "needs one group per mesh dim name (name the dims of different meshes apart)")
        states = _grad_states(replicate_grads, seen)
        world = tuple(seen.values())  # a plain parameter is replicated over every dim
        plans = tuple(plan_parameter(name, p.placements if dims is not None else None,
                                     dims if dims is not None else world, _ndim(p), states,
                                     _hsdp_state(p, by_id.get(id(p))))
                      for name, p, dims in zip(names, params, meshes))
        return cls(plans, world, tuple(sorted(states.items())))

    @property
    def dtensor_count(self) -> int:
        return sum(p.placements != "plain" for p in self.plans)

    @property
    def communicates(self) -> bool:
        """Whether any reduction is needed (False: the plain, local norm is the global one)."""
        return any(p.reduce_before or p.sum_squares_over for p in self.plans)

    @property
    def buckets(self) -> tuple[tuple[tuple[str, ...], tuple[tuple[tuple[tuple[str, str, int], ...],
                                                                   tuple[int, ...]], ...]], ...]:
        """``((sum_squares_over, ((reduce_before, indices), ...)), ...)``, in first-seen order."""
        outer: dict[tuple[str, ...], dict[tuple, list[int]]] = {}
        for i, plan in enumerate(self.plans):
            outer.setdefault(plan.sum_squares_over, {}).setdefault(plan.reduce_before, []).append(i)
        return tuple((over, tuple((before, tuple(idx)) for before, idx in inner.items()))
                     for over, inner in outer.items())

    def as_config(self) -> dict[str, Any]:
        """The layout for the run-log header: mesh, placements counted, replicated-gradient states."""
        counts: dict[str, int] = {}
        for plan in self.plans:
            counts[plan.placements] = counts.get(plan.placements, 0) + 1
        return {"parallel_layout": "dtensor",
                "mesh": {d.name: d.size for d in self.dims},
                "dtensor_params": self.dtensor_count,
                "plain_params": len(self.plans) - self.dtensor_count,
                "placements": counts,
                "replicate_grads": dict(self.replicate_grads),
                "norm_all_reduces": self.all_reduce_count}

    @property
    def all_reduce_count(self) -> int:
        """Collectives one norm runs: one per before-squaring group of each bucket, one per sum-of-squares
        group of each set."""
        return sum(len(over) + sum(len(before) for before, _ in inner) for over, inner in self.buckets)


def _ndim(param: Any) -> int:
    shape = getattr(param, "local_shape", None) or getattr(param, "shape", ())
    return len(tuple(shape))


def hsdp_sliced(param: Any) -> int:
    """The dim-0 shard count ``hyper_parallel.hsdp`` gave ``param`` (1: not sliced by hsdp)."""
    size = getattr(param, "hsdp_effective_shard_size", 1)
    return size if isinstance(size, int) and size > 1 else 1


def hsdp_params_of(network: Any) -> dict[int, Any]:
    """``id(parameter) -> hsdp's per-parameter state`` for every cell in ``network`` that
    ``hyper_parallel.hsdp`` was applied to (``cell.hsdp_scheduler.hsdp_state.hsdp_params``)."""
    walk = getattr(network, "cells_and_names", None)
    cells = walk() if callable(walk) else [("", network)]
    found: dict[int, Any] = {}
    for _, cell in cells:
        state = getattr(getattr(cell, "hsdp_scheduler", None), "hsdp_state", None)
        for hsdp_param in getattr(state, "hsdp_params", ()) or ():
            found[id(hsdp_param.param)] = hsdp_param
    if not found:
        raise UnsupportedParallelError(
            f"network={type(network).__name__} holds no cell that hyper_parallel.hsdp was applied to "
            "(no hsdp_scheduler.hsdp_state.hsdp_params): pass the cell given to hsdp(), or one holding it")
    return found


def _hsdp_state(param: Any, hsdp_param: Any) -> tuple[bool, str | None, int]:
    if hsdp_param is None:
        return bool(getattr(param, "has_hsdp_param", False)), None, 1
    shards = int(getattr(hsdp_param, "shard_size", 1)) if getattr(hsdp_param, "sharded", False) else 1
    group = getattr(getattr(hsdp_param, "sharded_group_info", None), "group_name", None)
    return True, group, shards


def refuse_hsdp_slices(params: Sequence[Any], names: Sequence[str]) -> None:
    """Refuse parameters that ``hyper_parallel.hsdp`` sliced on dim 0 without recording it in placements."""
    sliced = [f"{n} ({hsdp_sliced(p)} shards)" for n, p in zip(names, params) if hsdp_sliced(p) > 1]
    if sliced:
        raise UnsupportedParallelError(
            f"parameters sliced on dim 0 by hyper_parallel.hsdp ({', '.join(sliced[:3])}) hold a 1/N slice "
            "whose group is recorded on hsdp's own state, not in their placements, so their norm would be "
            "this rank's part: pass network=<the cell hsdp() was applied to> to DTensorLayout.from_params")
