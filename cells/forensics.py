"""Forensics at an alarm: which layer, which data-parallel rank, which samples (``forensics=K``).

A step cell built with ``forensics=K`` keeps, for each of its last ``K`` steps, on the device:

- the per-layer squared gradient norms of that step (after the data-parallel reduction and
  loss-scale unscaling), taken from the norm's own kernel pass (``GlobalNorm(per_tensor=True)``:
  the fused kernel's per-tensor sums, or the flat form's segment sum): no extra read of the
  gradients. One column per parameter, or per group of parameters (their common name prefix) when
  a model has more than ``MAX_FORENSICS_COLUMNS`` (512) of them. With hand-sharded parameters
  (``shard_group``) the vector is taken after the norm's all-reduce over the group, so a sharded
  layer's column is the whole layer's (tests/test_forensics_combos_dp.py);
- under data parallel, every rank's own norm of that step (before the reduction), gathered with
  one ``AllGather`` of a scalar per step, so every rank holds every rank's value;
- with ``forensics_ids=B``, the step's sample ids: the step's last input is a vector of ``B``
  ids (the dataset's index column), which the cell keeps and does not pass to the network;
  all-gathered under data parallel (``B`` per rank, by rank).

With ``grad_accum_steps=N`` the per-layer and per-rank rows are written once per optimizer step
(they follow the norm, which runs on the N-th call, on the accumulated gradients; a rank's norm is
that of its N micro-batches' mean), and the sample-id ring keeps ``K x N`` rows, one per call:
an optimizer step's ids are those of all its N micro-batches, each rank's in micro-batch order.

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
class StepRing(nn.Cell):
    """``size`` rows of ``width`` values and a write counter: ``construct(row)`` writes the row of
    the next step (row ``writes % size``) and bumps the counter (one scatter, one add). Each ring
    counts its own writes, once per step, so the three rings of a cell agree on the steps (the
    sample-id ring under gradient accumulation writes once per micro-batch: see :class:`SampleIdRing`)."""

    def __init__(self, size: int, width: int, dtype: Any, name: str) -> None:
        super().__init__(auto_prefix=False)
        self.size = int(size)
        self.ring = Parameter(Tensor(np.zeros((self.size, int(width)), dtype)), name=name,
                              requires_grad=False)
        self.writes = Parameter(Tensor(np.zeros(1, np.int32)), name=name + "_steps", requires_grad=False)
        self._one = Tensor(np.ones(1, np.int32))

    def write(self, row):
        slot = ops.floor_mod(self.writes, self.size)
        ops.scatter_update(self.ring, slot, row.reshape((1, -1)))
        ops.assign_add(self.writes, self._one)
        return slot

    def construct(self, row):
        return self.write(row)

    def read(self, steps_back: int) -> np.ndarray | None:
        """The row written ``steps_back`` steps before the last (host side, two device reads)."""
        slot = ring_slot(int(self.writes.asnumpy()[0]), self.size, steps_back)
        return None if slot is None else self.ring.asnumpy()[slot]


class LayerRing(StepRing):
    """Per-layer squared norms: ``construct(per_tensor_sq)`` keeps the norm pass's per-tensor vector
    ``[n]``, summed into groups when there are more than ``max_columns`` parameters."""

    def __init__(self, size: int, names: Sequence[str], max_columns: int = MAX_COLUMNS) -> None:
        self.columns, groups = forensics_columns(names, max_columns)
        super().__init__(size, len(self.columns), np.float32, "gradmon_forensics_layers")
        self.grouped = groups is not None
        if self.grouped:
            self.group_ids = Tensor(np.asarray(groups, np.int32))

    def construct(self, per_tensor_sq):
        sq = per_tensor_sq
        if self.grouped:
            sq = ops.unsorted_segment_sum(sq, self.group_ids, len(self.columns))
        return self.write(sq)


class RankNormRing(StepRing):
    """Every data-parallel rank's own norm: ``construct(local_norm)`` gathers this rank's scalar
    from all ``world`` ranks (one ``AllGather`` of a float per step) and keeps the vector."""

    def __init__(self, size: int, world: int) -> None:
        super().__init__(size, world, np.float32, "gradmon_forensics_ranks")
        self.world = int(world)
        self.all_gather = ops.AllGather()

    def construct(self, local_norm):
        return self.write(self.all_gather(ops.cast(local_norm, ms.float32).reshape((1,))))


class SampleIdRing(StepRing):
    """The steps' sample ids: ``construct(ids)`` keeps this call's ``per_rank`` ids (every rank's
    under data parallel, gathered by rank).

    With gradient accumulation (``micro`` = N calls per optimizer step) the ring counts calls and
    each micro-batch's ids go to their own row: ``size x N`` rows for the ``size`` steps kept, plus
    N - 1 for a step under way, so it keeps whole optimizer steps exactly as long as the other
    rings (one write per optimizer step), aligned with them by ``writes // N``."""

    def __init__(self, size: int, per_rank: int, world: int = 1, micro: int = 1) -> None:
        rows = (int(size) + 1) * int(micro) - 1
        super().__init__(rows, world * per_rank, np.int32, "gradmon_forensics_ids")
        self.steps = int(size)
        self.micro = int(micro)
        self.per_rank = int(per_rank)
        self.world = int(world)
        if self.world > 1:
            self.all_gather = ops.AllGather()

    def construct(self, ids):
        ids = ops.cast(ids, ms.int32).reshape((-1,))
        if self.world > 1:
            ids = self.all_gather(ids)
        return self.write(ids)

    def read(self, steps_back: int) -> np.ndarray | None:
        """The ids of the optimizer step ``steps_back`` before the last completed one, by rank:
        ``[world, N * per_rank]`` (each rank's micro-batches in order); None when not kept."""
        calls = int(self.writes.asnumpy()[0])
        first = (calls // self.micro - 1 - int(steps_back)) * self.micro  # the step's first call
        if not 0 <= steps_back < self.steps or first < 0 or calls - first > self.size:
            return None
        rows = self.ring.asnumpy()[[(first + m) % self.size for m in range(self.micro)]]
        by_rank = rows.reshape(self.micro, self.world, self.per_rank).transpose(1, 0, 2)
        return by_rank.reshape(self.world, self.micro * self.per_rank)


def read_forensics(cell: Any, steps_back: int, top_k: int = TOP_LAYERS) -> dict[str, Any]:
    """What a step cell's rings hold for the step ``steps_back`` before the last one run (a few
    device reads), as :func:`forensics_fields` plus ``grouped``; ``{"missing": why}`` when that step
    is not (or no longer) in the ring."""
    layers: LayerRing = cell.forensics_layers
    layer_sq = layers.read(steps_back)
    if layer_sq is None:
        return {"missing": f"the step is not in the step cell's forensics ring ({steps_back} steps back, "
                           f"forensics={layers.size} kept; keep forensics=K >= log_interval)"}
    ranks = cell.forensics_ranks.read(steps_back) if cell.forensics_ranks is not None else None
    ids = cell.forensics_ids.read(steps_back) if cell.forensics_ids is not None else None
    if ids is not None:
        ids = ids.tolist()
    fields = forensics_fields(layers.columns, layer_sq.astype(np.float64).tolist(),
                              None if ranks is None else ranks.astype(np.float64).tolist(), ids, top_k)
    fields["grouped"] = layers.grouped
    return fields


def setup_forensics(cell: Any, options: Any) -> None:
    """Give a step cell its forensics switches (``forensics_on``, ``forensics_keeps_ranks``,
    ``forensics_keeps_ids``) and, when ``options.forensics > 0``, its rings: ``forensics_layers``,
    ``forensics_ranks`` (data parallel over more than one device, else None) and ``forensics_ids``
    (``forensics_ids > 0``, else None). Nothing is created with ``forensics=0``."""
    from .parallel import DATA_PARALLEL

    setup = cell.parallel_setup
    world = setup.device_num if setup.mode == DATA_PARALLEL and setup.device_num > 1 else 1
    # Compile-time switches read by construct, set whether forensics is on or not.
    cell.forensics_on = options.forensics > 0
    cell.forensics_keeps_ranks = cell.forensics_on and world > 1
    cell.forensics_keeps_ids = cell.forensics_on and options.forensics_ids > 0
    if not cell.forensics_on:
        return
    cell.forensics_layers = LayerRing(options.forensics, cell.weight_names)
    cell.forensics_ranks = RankNormRing(options.forensics, world) if cell.forensics_keeps_ranks else None
    cell.forensics_ids = (SampleIdRing(options.forensics, options.forensics_ids, world,
                                       micro=options.grad_accum_steps)
                          if cell.forensics_keeps_ids else None)
