"""The parallel configuration a monitored step runs in, and whether its global norm can be right.

Read once at construction (:func:`read_parallel_setup`). Every configuration whose norm gradmon
does not compute correctly is refused here with :class:`UnsupportedParallelError`, naming the mode
and what is supported: no configuration falls back to a per-rank norm silently.

What is handled:

- ``stand_alone`` / ``data_parallel``: the norm of the gradients after the data-parallel reduction.
  Parameters marked ``layerwise_parallel=True`` (hand-sharded, e.g. Megatron-style tensor
  parallel; MindSpore's gradient reducer skips them) need ``shard_group``: their squares are
  all-reduced over that group and added to the replicated parameters' squares, counted once.
- ``semi_auto_parallel`` / ``auto_parallel`` (with pipeline stages and the parallel optimizer):
  the per-tensor ``grad_scale`` form, which MindSpore's parallel compiler completes (division by
  each parameter's replica count, all-reduce within the stage, all-reduce between stages). A
  parameter used by cells of several pipeline stages (tied embeddings) counts on its first stage.

Refused here and computed by the functional form instead: HyperParallel DTensor parameters
(``placements`` + ``device_mesh``; :mod:`gradmon.cells.dtensor_layout`), which train in PyNative loops.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .dtensor_layout import hsdp_sliced, is_dtensor
from .errors import UnsupportedParallelError
from .norm_plan import NORM_STRATEGIES

STAND_ALONE = "stand_alone"
DATA_PARALLEL = "data_parallel"
HYBRID_PARALLEL = "hybrid_parallel"
SEMI_AUTO = "semi_auto_parallel"
AUTO = "auto_parallel"
COMPILER_MODES = (SEMI_AUTO, AUTO)
SUPPORTED_MODES = (STAND_ALONE, DATA_PARALLEL, SEMI_AUTO, AUTO)
SUPPORTED = ("supported: stand_alone and data_parallel (hand-sharded parameters marked "
             "layerwise_parallel=True with shard_group=<their communication group>), semi_auto_parallel and "
             "auto_parallel "
             "(norm_strategy='per_tensor' or 'auto'; pipeline stages and the parallel optimizer included)")


DTENSOR_FUNCTIONAL = ("use the functional form in the training loop: "
                      "gradmon.cells.clip_by_global_norm(grads, max_norm, "
                      "layout=DTensorLayout.from_params(params, replicate_grads=...)) or "
                      "gradmon.cells.global_norm(grads, layout=...), which all-reduce over the mesh groups "
                      "the placements name")


@dataclass(frozen=True)
class ParallelSetup:
    """What the norm needs to know about the parallel configuration (one per step cell)."""

    mode: str = STAND_ALONE
    device_num: int = 1
    pipeline_stages: int = 1
    stage: int = 0
    optimizer_parallel: bool = False
    shard_group: str | None = None
    sharded: tuple[bool, ...] = ()  # per weight: hand-sharded (layerwise_parallel)
    counted: tuple[bool, ...] = ()  # per weight: counted in this rank's sum (tied copies count once)

    @property
    def compiler_completes(self) -> bool:
        """The parallel compiler inserts the norm's reductions (semi_auto/auto parallel)."""
        return self.mode in COMPILER_MODES

    def as_config(self) -> dict:
        """The fields ``gradmon_config()`` reports."""
        return {"parallel_mode": self.mode, "device_num": self.device_num,
                "pipeline_stages": self.pipeline_stages, "optimizer_parallel": self.optimizer_parallel,
                "shard_group": self.shard_group, "sharded_params": sum(self.sharded)}


def check_parallel(mode: str, *, pipeline_stages: int, sharded: Sequence[bool],
                   pynative_shard: Sequence[str], shard_group: str | None, comm_initialized: bool,
                   norm_strategy: str, dtensor: Sequence[str] = (), hsdp_sliced: Sequence[str] = ()) -> None:
    """Raise :class:`UnsupportedParallelError` unless the norm is computed right in this configuration.

    Pure: every input is given. ``sharded`` marks the weights with ``layerwise_parallel=True``;
    ``pynative_shard`` names the weights sharded by PyNative ``shard()``; ``dtensor`` the weights
    carrying HyperParallel DTensor placements, ``hsdp_sliced`` those ``hyper_parallel.hsdp`` sliced.
    """
    if norm_strategy not in NORM_STRATEGIES:
        raise ValueError(f"norm_strategy must be one of {NORM_STRATEGIES}, got {norm_strategy!r}")
    if dtensor:
        raise UnsupportedParallelError(
            f"parameters carrying HyperParallel DTensor layouts ({', '.join(dtensor[:3])}"
            f"{', ...' if len(dtensor) > 3 else ''}) hold this rank's local shard, and replicated ones a "
            "partial sum under shard_module alone: MonitoredTrainStep does not compute their norm "
            f"(HyperParallel trains in PyNative loops); {DTENSOR_FUNCTIONAL}")
    if hsdp_sliced:
        raise UnsupportedParallelError(
            f"parameters sliced on dim 0 by hyper_parallel.hsdp ({', '.join(hsdp_sliced[:3])}) hold a 1/N "
            "slice whose group their placements do not record: MonitoredTrainStep does not compute their "
            "norm; " + DTENSOR_FUNCTIONAL + " (with network=<the cell hsdp() was applied to>, where hsdp "
            "keeps the groups)")
    if mode not in SUPPORTED_MODES:
        raise UnsupportedParallelError(
            f"gradmon cannot compute a correct global gradient norm in parallel_mode={mode!r}: the layout "
            f"of its hand-split parameters is not known to the step cell; {SUPPORTED}")
    if pynative_shard:
        raise UnsupportedParallelError(
            f"parameters sharded by PyNative shard() ({', '.join(pynative_shard[:3])}) hold slices whose "
            f"layout the step cell cannot see: their norm would be this rank's partial one; {SUPPORTED}")
    n_sharded = sum(bool(s) for s in sharded)
    if mode in COMPILER_MODES:
        if shard_group is not None or n_sharded:
            raise UnsupportedParallelError(
                f"parallel_mode={mode!r} shards parameters by strategy, and the compiler completes their "
                "norm; layerwise_parallel parameters / shard_group are for hand-written sharding in "
                "stand_alone or data_parallel mode")
        if norm_strategy not in ("auto", "per_tensor"):
            raise UnsupportedParallelError(
                f"norm_strategy={norm_strategy!r} does not give the global norm in parallel_mode={mode!r}: "
                "only 'per_tensor' (or 'auto', which picks it) has the per-tensor grad_scale form that "
                "MindSpore's parallel compiler completes with the cross-device reductions")
        return
    if pipeline_stages > 1:
        raise UnsupportedParallelError(
            f"pipeline_stages={pipeline_stages} in parallel_mode={mode!r}: MindSpore runs pipeline stages "
            "only under semi_auto_parallel/auto_parallel, where gradmon's norm covers them")
    if n_sharded and shard_group is None:
        raise UnsupportedParallelError(
            f"{n_sharded} parameter(s) are marked layerwise_parallel=True (hand-sharded), so each rank holds "
            "only a slice of them and its norm would be partial: pass shard_group='<name of the "
            "communication group they are split across>' (e.g. the group given to create_group, or "
            "'hccl_world_group'/'nccl_world_group' when sharded across every rank)")
    if shard_group is not None:
        if not n_sharded:
            raise UnsupportedParallelError(
                f"shard_group={shard_group!r} is given but no parameter is marked layerwise_parallel=True: "
                "mark the hand-sharded parameters, or drop shard_group")
        if not comm_initialized:
            raise UnsupportedParallelError(
                f"shard_group={shard_group!r} needs communication: call mindspore.communication.init() "
                "(and create_group for a custom group) before building the step cell")


def pipeline_owner_mask(stages_of_weights: Sequence[Iterable[int]], stage: int) -> tuple[bool, ...]:
    """Per weight: whether this pipeline ``stage`` counts it in the norm.

    ``stages_of_weights[i]``: the stages of the cells using weight ``i`` (empty: no stage set).
    A weight on several stages (a tied embedding) counts on the lowest one only; a weight with no
    stage counts wherever it is.
    """
    return tuple(not (s := set(stages)) or min(s) == stage for stages in stages_of_weights)


def weight_stages(network, weights: Sequence) -> list[set[int]]:
    """Per weight, the ``pipeline_stage`` values of the cells holding it (a cell inherits its parent's)."""
    by_id: dict[int, set[int]] = {id(w): set() for w in weights}

    def walk(cell, inherited: int | None) -> None:
        stage = getattr(cell, "_pipeline_stage", None)
        stage = inherited if stage is None else stage
        for param in cell._params.values():  # the cell's own parameters (tied ones appear in each holder)
            if param is not None and id(param) in by_id and stage is not None:
                by_id[id(param)].add(int(stage))
        for child in cell._cells.values():
            if child is not None:
                walk(child, stage)

    walk(network, None)
    return [by_id[id(w)] for w in weights]


def read_parallel_setup(network, weights: Sequence, shard_group: str | None,
                        norm_strategy: str) -> ParallelSetup:
    """Read MindSpore's parallel context, check it (:func:`check_parallel`) and describe it."""
    import mindspore as ms
    from mindspore.communication import GlobalComm

    mode = str(ms.get_auto_parallel_context("parallel_mode"))
    stages = int(ms.get_auto_parallel_context("pipeline_stages") or 1)
    sharded = tuple(bool(getattr(w, "layerwise_parallel", False)) for w in weights)
    pynative_shard = [w.name for w in weights if getattr(w.param_info, "is_in_pynative_shard", False)]
    initialized = bool(GlobalComm.INITED)
    check_parallel(mode, pipeline_stages=stages, sharded=sharded, pynative_shard=pynative_shard,
                   shard_group=shard_group, comm_initialized=initialized, norm_strategy=norm_strategy,
                   dtensor=[w.name for w in weights if is_dtensor(w)],
                   hsdp_sliced=[w.name for w in weights if hsdp_sliced(w) > 1])
    device_num = 1
    rank = 0
    if initialized:
        from mindspore.communication import get_group_size, get_rank

        device_num, rank = int(get_group_size()), int(get_rank())
    stage = rank // max(1, device_num // stages) if stages > 1 else 0
    counted = (pipeline_owner_mask(weight_stages(network, weights), stage) if stages > 1
               else (True,) * len(weights))
    return ParallelSetup(mode=mode, device_num=device_num, pipeline_stages=stages, stage=stage,
                         optimizer_parallel=bool(ms.get_auto_parallel_context("enable_parallel_optimizer")),
                         shard_group=shard_group, sharded=sharded, counted=counted)
