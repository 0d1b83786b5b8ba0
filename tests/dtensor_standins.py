"""Stand-ins for HyperParallel's placements and device mesh (hyper_parallel is not installable here).

They have the interface gradmon reads (duck-typed, as HyperParallel's ``placement_types`` and
``DeviceMesh`` define it): ``is_shard()/is_replicate()/is_partial()``, ``dim``, ``reduce_op``;
``mesh_shape``, ``mesh_dim_names``, ``get_group(dim)`` returning this rank's group name. A stand-in
DTensor parameter is a real MindSpore ``Parameter`` holding the local shard, with ``placements`` and
``device_mesh`` attached (:func:`dtensor_param`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Shard:
    def __init__(self, dim: int) -> None:
        self.dim = dim

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"


class Replicate:
    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return True

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False

    def __repr__(self) -> str:
        return "Replicate()"


class Partial:
    def __init__(self, reduce_op: str = "sum") -> None:
        self.reduce_op = reduce_op

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    def __repr__(self) -> str:
        return f"Partial(reduce_op={self.reduce_op!r})"


class Mesh:
    """A device mesh as one rank sees it: ``groups[i]`` is its group along mesh dim ``i`` (None: none)."""

    def __init__(self, shape: Sequence[int], names: Sequence[str] | None, groups: Sequence[Any]) -> None:
        self.mesh_shape = tuple(shape)
        self.mesh_dim_names = tuple(names) if names else None
        self._groups = list(groups)

    def get_group(self, mesh_dim: int | str | None = None) -> Any:
        if isinstance(mesh_dim, str):
            mesh_dim = self.mesh_dim_names.index(mesh_dim)
        group = self._groups[mesh_dim or 0]
        if group is None:
            raise RuntimeError("DeviceMesh process groups not initialized!")
        return group


def dtensor_param(value: Any, name: str, placements: Sequence[Any] | None, mesh: Mesh | None) -> Any:
    """A real MindSpore Parameter holding ``value`` (the local shard), with a DTensor layout attached."""
    import numpy as np
    from mindspore import Parameter, Tensor

    param = Parameter(Tensor(np.ascontiguousarray(value, dtype=np.float32)), name=name)
    if placements is not None:
        param.placements = tuple(placements)
        param.device_mesh = mesh
    return param


class HsdpCell:
    """A cell as ``hyper_parallel.hsdp`` leaves it, for what gradmon reads:
    ``hsdp_scheduler.hsdp_state.hsdp_params``, each with ``param``, ``sharded``, ``shard_size`` and
    ``sharded_group_info.group_name``. ``slices`` maps a parameter name to ``(shards, group)`` for the
    parameters hsdp sliced on dim 0; the parameters are marked as hsdp marks them."""

    def __init__(self, params: Sequence[Any], slices: dict[str, tuple[int, str]]) -> None:
        from types import SimpleNamespace

        hsdp_params = []
        for param in params:
            shards, group = slices.get(param.name, (1, None))
            param.has_hsdp_param = True
            if shards > 1:
                param.hsdp_effective_shard_size = shards
            hsdp_params.append(SimpleNamespace(param=param, sharded=shards > 1, shard_size=shards,
                                               sharded_group_info=SimpleNamespace(group_name=group)))
        self.hsdp_scheduler = SimpleNamespace(hsdp_state=SimpleNamespace(hsdp_params=hsdp_params))

    def cells_and_names(self):
        yield "", self
