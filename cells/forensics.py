"""Forensics at an alarm: which layer, which data-parallel rank, which samples (``forensics=K``).

A step cell built with ``forensics=K`` keeps, for each of its last ``K`` steps, on the device:

- the per-layer squared gradient norms of that step (after the data-parallel reduction and
  loss-scale unscaling), taken from the norm's own kernel pass (``GlobalNorm(per_tensor=True)``:
  the fused kernel's per-tensor sums, or the flat form's segment sum): no extra read of the
  gradients. One column per parameter, or per group of parameters (their common name prefix) when
  a model has more than ``MAX_FORENSICS_COLUMNS`` (512) of them;
- under data parallel, every rank's own norm of that step (before the reduction), gathered with
  one ``AllGather`` of a scalar per step, so every rank holds every rank's value;
- with ``forensics_ids=B``, the step's sample ids: the step's last input is a vector of ``B``
  ids (the dataset's index column), which the cell keeps and does not pass to the network;
  all-gathered under data parallel (``B`` per rank, by rank).

Nothing is read per step. When the alarm rule opens an incident, ``LiveMonitor`` reads the rings
once (:meth:`gradmon.cells.host_read.HostReadMixin.gradmon_forensics`) and attaches what they hold
for the alarm's step to the ``alarm`` event (docs/format.md, "Forensics"). With ``forensics=0``
(the default) none of this exists: no Parameter, no kernel, no extra output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from .layer_stats import MAX_FORENSICS_COLUMNS as MAX_COLUMNS
from .layer_stats import TOP_LAYERS, forensics_columns, forensics_fields, ring_slot


# --------------------------------------------------------------------------------------- device
class ForensicsRing(nn.Cell):
    """The per-layer (and per-rank) ring: ``construct(per_tensor_sq, local_norm)`` writes one step.

    ``per_tensor_sq``: the norm pass's per-tensor squared norms ``[n]``; ``local_norm``: this rank's
    own norm (read only when ``world > 1``). Two scatters, one all-gather of a scalar under data
    parallel, one counter bump.
    """

    def __init__(self, size: int, names: Sequence[str], world: int = 1,
                 max_columns: int = MAX_COLUMNS) -> None:
        super().__init__(auto_prefix=False)
        self.size = int(size)
        self.world = int(world)
        self.columns, groups = forensics_columns(names, max_columns)
        self.grouped = groups is not None
        if self.grouped:
            self.group_ids = Tensor(np.asarray(groups, np.int32))
        self.layer_ring = Parameter(Tensor(np.zeros((self.size, len(self.columns)), np.float32)),
                                    name="gradmon_forensics_layers", requires_grad=False)
        if self.world > 1:
            self.all_gather = ops.AllGather()
            self.rank_ring = Parameter(Tensor(np.zeros((self.size, self.world), np.float32)),
                                       name="gradmon_forensics_ranks", requires_grad=False)
        self.writes = Parameter(Tensor(np.zeros(1, np.int32)), name="gradmon_forensics_steps",
                                requires_grad=False)
        self._one = Tensor(np.ones(1, np.int32))

    def construct(self, per_tensor_sq, local_norm):
        sq = per_tensor_sq
        if self.grouped:
            sq = ops.unsorted_segment_sum(sq, self.group_ids, len(self.columns))
        slot = ops.floor_mod(self.writes, self.size)
        ops.scatter_update(self.layer_ring, slot, sq.reshape((1, -1)))
        if self.world > 1:
            ranks = self.all_gather(ops.cast(local_norm, ms.float32).reshape((1,)))
            ops.scatter_update(self.rank_ring, slot, ranks.reshape((1, -1)))
        ops.assign_add(self.writes, self._one)
        return slot


class SampleIdRing(nn.Cell):
    """The sample-id ring: ``construct(ids)`` keeps one step's ``[per_rank]`` ids (all ranks' under
    data parallel, gathered by rank)."""

    def __init__(self, size: int, per_rank: int, world: int = 1) -> None:
        super().__init__(auto_prefix=False)
        self.size = int(size)
        self.per_rank = int(per_rank)
        self.world = int(world)
        if self.world > 1:
            self.all_gather = ops.AllGather()
        self.id_ring = Parameter(Tensor(np.zeros((self.size, self.world * self.per_rank), np.int32)),
                                 name="gradmon_forensics_ids", requires_grad=False)
        self.writes = Parameter(Tensor(np.zeros(1, np.int32)), name="gradmon_forensics_id_steps",
                                requires_grad=False)
        self._one = Tensor(np.ones(1, np.int32))

    def construct(self, ids):
        ids = ops.cast(ids, ms.int32).reshape((-1,))
        if self.world > 1:
            ids = self.all_gather(ids)
        slot = ops.floor_mod(self.writes, self.size)
        ops.scatter_update(self.id_ring, slot, ids.reshape((1, -1)))
        ops.assign_add(self.writes, self._one)
        return slot


def read_forensics(ring: ForensicsRing, id_ring: SampleIdRing | None, steps_back: int,
                   top_k: int = TOP_LAYERS) -> dict[str, Any] | None:
    """What the rings hold for the step ``steps_back`` before the last one run (a few device reads),
    as :func:`forensics_fields`; None when that step is not (or no longer) in the ring."""
    total = int(ring.writes.asnumpy()[0])
    slot = ring_slot(total, ring.size, steps_back)
    if slot is None:
        return None
    layer_sq = ring.layer_ring.asnumpy()[slot].astype(np.float64)
    ranks = ring.rank_ring.asnumpy()[slot].astype(np.float64) if ring.world > 1 else None
    ids = None
    if id_ring is not None:
        id_slot = ring_slot(int(id_ring.writes.asnumpy()[0]), id_ring.size, steps_back)
        if id_slot is not None:
            ids = id_ring.id_ring.asnumpy()[id_slot].reshape(id_ring.world, id_ring.per_rank).tolist()
    fields = forensics_fields(ring.columns, layer_sq.tolist(), None if ranks is None else ranks.tolist(),
                              ids, top_k)
    fields["grouped"] = ring.grouped
    return fields


def setup_forensics(cell: Any, options: Any) -> bool:
    """Give a step cell its forensics rings (``forensics_ring``, ``forensics_id_ring``) when
    ``options.forensics > 0``; returns whether it needs each rank's own norm (data parallel over
    more than one device). Nothing is created with ``forensics=0``."""
    if options.forensics <= 0:
        return False
    from .parallel import DATA_PARALLEL

    setup = cell.parallel_setup
    world = setup.device_num if setup.mode == DATA_PARALLEL and setup.device_num > 1 else 1
    cell.forensics_ring = ForensicsRing(options.forensics, cell.weight_names, world)
    cell.forensics_id_ring = (SampleIdRing(options.forensics, options.forensics_ids, world)
                              if options.forensics_ids > 0 else None)
    return world > 1
