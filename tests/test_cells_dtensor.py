"""HyperParallel DTensor layouts: the placement rules, their refusals, and the norm over 2 msrun ranks.

The rules are pure logic (gradmon.cells.dtensor_layout) tested on stand-in parameters
(tests/dtensor_standins.py); a numpy simulation runs each rank's schedule in lock step over a 2x2
mesh to check that every rank gets the whole model's norm. One msrun job (tests/dtensor_train.py)
runs the real collectives on a tensor-parallel and an FSDP layout.
"""

from __future__ import annotations

import itertools
import json
import math
from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import DTensorLayout, MonitoredTrainStep, clip_by_global_norm, global_norm
from gradmon.cells.dtensor_layout import (
    MeshDim,
    ParamNormPlan,
    mesh_dims,
    placement_kind,
    plan_parameter,
)
from gradmon.cells.parallel import UnsupportedParallelError, check_parallel
from mindspore import Parameter, Tensor, nn, ops

from tests.dtensor_standins import HsdpCell, Mesh, Partial, Replicate, Shard, dtensor_param
from tests.msrun_util import ROOT, run_msrun

TP = (MeshDim("tp", 2, "g_tp"),)


def stand_in(name, shape, placements, mesh):
    return SimpleNamespace(name=name, shape=tuple(shape), placements=placements, device_mesh=mesh)


# --------------------------------------------------------------------------------- placement rules
def test_placements_are_read_through_their_methods():
    assert placement_kind(Shard(1)) == ("shard", 1)
    assert placement_kind(Replicate()) == ("replicate", None)
    assert placement_kind(Partial()) == ("partial", "sum")
    assert placement_kind(Partial("avg")) == ("partial", "avg")
    with pytest.raises(ValueError, match="unknown placement 'S0'"):
        placement_kind("S0")


def test_one_parameter_plans():
    partial = {"tp": "partial"}
    assert plan_parameter("w", (Shard(0),), TP, 2, {}) == ParamNormPlan("w", "(S(0))", (), ("g_tp",))
    assert plan_parameter("w", (Shard(1),), TP, 2, {}).sum_squares_over == ("g_tp",)
    # Replicated: summed before squaring while a partial sum, counted once when reduced.
    assert plan_parameter("b", (Replicate(),), TP, 1, partial) == ParamNormPlan(
        "b", "(R)", (("g_tp", "sum", 2),), ())
    assert plan_parameter("b", (Replicate(),), TP, 1, {"tp": "reduced"}) == ParamNormPlan("b", "(R)")
    assert plan_parameter("p", (Partial("avg"),), TP, 1, {}).reduce_before == (("g_tp", "avg", 2),)
    # A plain parameter is replicated over every mesh dim.
    assert plan_parameter("x", None, TP, 1, partial).reduce_before == (("g_tp", "sum", 2),)
    # A mesh dim of one rank needs nothing, not even a replicate_grads entry.
    one = (MeshDim("dp", 1, None), MeshDim("tp", 2, "g_tp"))
    assert plan_parameter("w", (Replicate(), Shard(0)), one, 2, {}) == ParamNormPlan(
        "w", "(R, S(0))", (), ("g_tp",))


def test_mesh_dims_read_names_sizes_and_groups():
    class Group:
        group_name = "2-0-1"

    assert mesh_dims(Mesh((1, 2), ("dp", "tp"), [None, Group()])) == (
        MeshDim("dp", 1, None), MeshDim("tp", 2, "2-0-1"))
    assert mesh_dims(Mesh((2,), None, ["g"])) == (MeshDim("dim_0", 2, "g"),)
    assert mesh_dims(Mesh((2,), ("tp",), [None])) == (MeshDim("tp", 2, None),)  # no process groups


def test_layout_buckets_config_and_plain_parameters():
    mesh = Mesh((2,), ("tp",), ["g_tp"])
    params = [stand_in("w_in", (4, 4), (Replicate(),), mesh), stand_in("w_col", (4, 2), (Shard(1),), mesh),
              stand_in("w_row", (2, 4), (Shard(0),), mesh), stand_in("b_out", (3,), None, None)]
    layout = DTensorLayout.from_params(params, replicate_grads="partial")
    partial_sum = (("g_tp", "sum", 2),)
    # (groups for the squares, ((reductions before squaring, parameter indices), ...)), ...
    assert layout.buckets == (((), ((partial_sum, (0, 3)),)), (("g_tp",), (((), (1, 2)),)))
    assert layout.all_reduce_count == 2  # one for the partial sums, one for the shards' squares
    assert layout.communicates
    assert layout.as_config() == {
        "parallel_layout": "dtensor", "mesh": {"tp": 2}, "dtensor_params": 3, "plain_params": 1,
        "placements": {"(R)": 1, "(S(1))": 1, "(S(0))": 1, "plain": 1},
        "replicate_grads": {"tp": "partial"}, "norm_all_reduces": 2}
    assert not DTensorLayout.from_params(params, replicate_grads="reduced").plans[0].reduce_before
    # No DTensor parameter: nothing to reduce, the plain norm.
    assert not DTensorLayout.from_params([stand_in("w", (2,), None, None)]).communicates


def test_hsdp_slices_are_read_from_the_hsdp_cell():
    """hsdp's hook sums over every dim a parameter is not sharded on; its dim-0 slices add its group."""
    mesh = Mesh((2,), ("tp",), ["g_tp"])
    params = [stand_in("w_col", (2, 4), (Shard(1),), mesh), stand_in("b_out", (3,), (Replicate(),), mesh),
              stand_in("w_out", (4, 3), None, None)]
    cell = HsdpCell(params, {"w_col": (2, "hsdp_g"), "w_out": (4, "hsdp_w")})
    layout = DTensorLayout.from_params(params, network=cell)  # no replicate_grads needed: hsdp reduced them
    assert layout.plans == (ParamNormPlan("w_col", "(S(1))+hsdp(2)", (), ("g_tp", "hsdp_g")),
                            ParamNormPlan("b_out", "(R)"),
                            ParamNormPlan("w_out", "plain+hsdp(4)", (), ("hsdp_w",)))
    # Marked by hsdp but not sliced: replicated dims are reduced even without network=.
    assert DTensorLayout.from_params(params[1:2]).plans == (ParamNormPlan("b_out", "(R)"),)
    message = r"network=object holds no cell that hyper_parallel.hsdp was applied to \(no hsdp_scheduler"
    with pytest.raises(UnsupportedParallelError, match=message):
        DTensorLayout.from_params(params, network=object())


# ------------------------------------------------------------- the rules give the whole norm (simulated)
def _group_name(name, coord, dim, shape):
    ranks = [np.ravel_multi_index((*coord[:dim], i, *coord[dim + 1:]), shape) for i in range(shape[dim])]
    return f"{name}:" + "-".join(map(str, ranks))


def _local(full, placements, coord, shape, states, weights):
    """This rank's gradient: slices on sharded dims, a share of the value where it is a partial sum."""
    local = full
    for dim, size in enumerate(shape):
        kind, arg = placement_kind(placements[dim]) if placements is not None else ("replicate", None)
        share = weights[dim][coord[dim]]  # shares along a dim sum to 1
        if kind == "shard":
            local = np.array_split(local, size, axis=arg)[coord[dim]]
        elif kind == "partial":
            local = local * (share * size if arg == "avg" else share)
        elif states.get(MESH_NAMES[dim]) == "partial":
            local = local * share
    return local


def _rank_schedule(layout, grads):
    """dtensor_square_sum's schedule in numpy; each all-reduce yields (group, value) to the driver."""
    total = 0.0
    for over, inner in layout.buckets:
        local = 0.0
        for before, indices in inner:
            flat = np.concatenate([grads[i].ravel() for i in indices])
            for group, op, size in before:
                flat = yield group, flat
                if op == "avg":
                    flat = flat / size
            local += float((flat ** 2).sum())
        for group in over:
            local = yield group, local
        total += local
    return total


def _run_lock_step(schedules):
    """Run every rank's schedule; an all-reduce sums the values of the ranks naming the same group."""
    results, sends = {}, {r: None for r in schedules}
    while len(results) < len(schedules):
        asks = {}
        for rank, gen in schedules.items():
            if rank in results:
                continue
            try:
                asks[rank] = gen.send(sends[rank])
            except StopIteration as done:
                results[rank] = done.value
        sums: dict = {}
        for group, value in asks.values():
            sums[group] = sums.get(group, 0) + value
        sends = {rank: sums[group] for rank, (group, _) in asks.items()}
    return results


MESH_NAMES = ("dp", "tp")
SPECS = [((8, 6), (Shard(0), Shard(1))), ((8, 6), (Replicate(), Shard(0))), ((6,), (Shard(0), Replicate())),
         ((5, 3), (Replicate(), Replicate())), ((4,), None), ((8, 3), (Shard(0), Shard(0))),
         ((4, 6), (Partial(), Shard(1))), ((2, 2), (Replicate(), Partial("avg")))]


@pytest.mark.parametrize("states", [{"dp": "reduced", "tp": "partial"}, {"dp": "partial", "tp": "partial"},
                                    {"dp": "reduced", "tp": "reduced"}])
def test_every_rank_gets_the_whole_norm_on_a_2x2_mesh(states):
    rng = np.random.default_rng(3)
    shape = (2, 2)
    full = [rng.normal(size=s) for s, _ in SPECS]
    truth = math.sqrt(sum(float((g ** 2).sum()) for g in full))
    weights = [rng.dirichlet([1.0] * n) for n in shape]  # uneven shares, like 0.731 / 0.269

    def layout_and_grads(coord, claimed):
        mesh = Mesh(shape, MESH_NAMES, [_group_name(n, coord, d, shape) for d, n in enumerate(MESH_NAMES)])
        grads = [_local(g, p, coord, shape, states, weights) for g, (_, p) in zip(full, SPECS)]
        params = [stand_in(f"p{i}", g.shape, p, mesh if p is not None else None)
                  for i, (g, (_, p)) in enumerate(zip(grads, SPECS))]
        return DTensorLayout.from_params(params, replicate_grads=claimed), grads

    coords = list(itertools.product(*map(range, shape)))
    runs = {r: _rank_schedule(*layout_and_grads(c, states)) for r, c in enumerate(coords)}
    norms = {r: math.sqrt(v) for r, v in _run_lock_step(runs).items()}
    assert norms == pytest.approx(dict.fromkeys(range(4), truth), rel=1e-12)
    # The same gradients with the replicated state claimed wrong give a wrong norm (the test can fail).
    wrong = {k: "reduced" if v == "partial" else "partial" for k, v in states.items()}
    runs = {r: _rank_schedule(*layout_and_grads(c, wrong)) for r, c in enumerate(coords)}
    assert all(abs(math.sqrt(v) - truth) > 1e-3 * truth for v in _run_lock_step(runs).values())


# ----------------------------------------------------------------------------------------- refusals
REFUSED = [
    ("replicated_needs_state", [stand_in("b", (3,), (Replicate(),), Mesh((2,), ("tp",), ["g"]))], None,
     "parameter 'b' is replicated (R) on mesh dim 'tp' (2 ranks), and gradmon cannot tell whether its "
     "gradient there is already summed or still a per-rank partial sum: pass "
     "replicate_grads={'tp': 'partial'}"),
    ("plain_needs_state", [stand_in("w", (2, 2), (Shard(0),), Mesh((2,), ("tp",), ["g"])),
                           stand_in("x", (3,), None, None)], None,
     "parameter 'x' is replicated (a plain parameter) on mesh dim 'tp'"),
    ("partial_max", [stand_in("p", (3,), (Partial("max"),), Mesh((2,), ("tp",), ["g"]))], None,
     "parameter 'p' is Partial(reduce_op='max') on mesh dim 'tp': gradmon completes only sum and avg partial "
     "sums; reduce it first (DTensor.reduce_partial() or redistribute to Replicate)"),
    ("unknown_placement", [stand_in("q", (3,), ("S0",), Mesh((2,), ("tp",), ["g"]))], None,
     "parameter 'q': unknown placement 'S0' (expected Shard(dim), Replicate() or Partial(op)); gradmon "
     "cannot tell how its gradient is split"),
    ("placement_count", [stand_in("w", (2, 2), (Shard(0), Shard(1)), Mesh((2,), ("tp",), ["g"]))], None,
     "parameter 'w' has 2 placements for a 1-dim device mesh (tp): one placement per mesh dim is needed"),
    ("shard_dim_range", [stand_in("w", (4,), (Shard(1),), Mesh((2,), ("tp",), ["g"]))], None,
     "parameter 'w' is Shard(1) on mesh dim 'tp' but has 1 dims"),
    ("no_groups", [stand_in("w", (4,), (Shard(0),), Mesh((2,), ("tp",), [None]))], None,
     "parameter 'w' is sharded on mesh dim 'tp' (2 ranks), but its DeviceMesh has no communication group "
     "for that dim: build the mesh with its process groups (hyper_parallel.init_device_mesh"),
    ("two_groups_one_name", [stand_in("a", (4,), (Shard(0),), Mesh((2,), ("tp",), ["g1"])),
                             stand_in("b", (4,), (Shard(0),), Mesh((2,), ("tp",), ["g2"]))], None,
     "mesh dim 'tp' is 2 ranks in group 'g1' for one parameter and 2 ranks in group 'g2' for 'b': gradmon "
     "needs one group per mesh dim name"),
    ("hsdp_sliced", [SimpleNamespace(name="w", shape=(2, 4), placements=None, device_mesh=None,
                                     hsdp_effective_shard_size=2)], None,
     "parameters sliced on dim 0 by hyper_parallel.hsdp (w (2 shards)) hold a 1/N slice whose group is "
     "recorded on hsdp's own state, not in their placements, so their norm would be this rank's part: pass "
     "network=<the cell hsdp() was applied to> to DTensorLayout.from_params"),
]


@pytest.mark.parametrize("params,states,message", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_layouts_gradmon_cannot_get_right_are_refused(params, states, message):
    with pytest.raises(UnsupportedParallelError) as err:
        DTensorLayout.from_params(params, replicate_grads=states)
    assert message in str(err.value)


def test_replicate_grads_is_checked():
    params = [stand_in("b", (3,), (Replicate(),), Mesh((2,), ("tp",), ["g"]))]
    with pytest.raises(ValueError, match=r"replicate_grads\['tp'\] must be one of \('partial', 'reduced'\)"):
        DTensorLayout.from_params(params, replicate_grads="summed")
    with pytest.raises(ValueError, match="replicate_grads names mesh dim 'dp', which no parameter's mesh has "
                                         r"\(mesh dims: tp\)"):
        DTensorLayout.from_params(params, replicate_grads={"dp": "partial", "tp": "reduced"})
    with pytest.raises(ValueError, match="needs at least one parameter"):
        DTensorLayout.from_params([])


def _local_mesh_params():
    """Stand-in DTensor parameters on a 1-rank mesh (nothing to communicate) and their gradients."""
    mesh = Mesh((1,), ("tp",), [None])
    params = [dtensor_param(np.ones((2, 3)), "w", (Shard(0),), mesh),
              dtensor_param(np.ones(4), "b", None, None)]
    grads = (Tensor(np.full((2, 3), 2.0, np.float32)), Tensor(np.arange(4, dtype=np.float32)))
    return params, grads


def test_functional_arguments_are_checked():
    params, grads = _local_mesh_params()
    layout = DTensorLayout.from_params(params)
    with pytest.raises(ValueError, match="pass layout= or params=, not both"):
        global_norm(grads, layout=layout, params=params)
    with pytest.raises(ValueError, match="the layout has 2 parameters for 1 gradients"):
        global_norm(grads[:1], layout=layout)
    with pytest.raises(ValueError, match="a DTensorLayout already names every parameter's mesh groups"):
        global_norm(grads, "tp", (True, False), layout=layout)
    with pytest.raises(TypeError, match=r"layout must be a DTensorLayout \(DTensorLayout.from_params"):
        global_norm(grads, layout={"tp": 2})


def test_functional_form_eager_jit_and_dtensor_gradients():
    params, grads = _local_mesh_params()
    layout = DTensorLayout.from_params(params)
    want = math.sqrt(6 * 4.0 + 0 + 1 + 4 + 9)
    assert float(global_norm(grads, layout=layout).asnumpy()) == pytest.approx(want, rel=1e-6)
    assert float(global_norm(grads, params=params).asnumpy()) == pytest.approx(want, rel=1e-6)

    @ms.jit
    def jitted(g):
        return global_norm(g, layout=layout)

    assert float(jitted(grads).asnumpy()) == pytest.approx(want, rel=1e-6)
    clipped, norm = clip_by_global_norm(grads, 1.0, layout=layout)
    assert float(norm.asnumpy()) == pytest.approx(want, rel=1e-6)
    assert float(global_norm(clipped).asnumpy()) == pytest.approx(1.0, rel=1e-5)

    class GradDTensor:  # a gradient that is itself a DTensor: its local tensor is squared
        placements, device_mesh = (Shard(0),), Mesh((1,), ("tp",), [None])

        def __init__(self, local):
            self.local = local

        def to_local(self):
            return self.local

    wrapped = (GradDTensor(grads[0]), grads[1])
    assert float(global_norm(wrapped, layout=layout).asnumpy()) == pytest.approx(want, rel=1e-6)
    # Without a layout, DTensor gradients are planned from their own placements, never squared as is.
    assert float(global_norm(wrapped).asnumpy()) == pytest.approx(want, rel=1e-6)
    GradDTensor.placements, GradDTensor.device_mesh = (Replicate(),), Mesh((2,), ("tp",), ["g"])
    with pytest.raises(UnsupportedParallelError, match=r"is replicated \(R\) on mesh dim 'tp'"):
        global_norm(wrapped)


@pytest.mark.skipif(not __import__("importlib").util.find_spec("hyper_parallel"),
                    reason="hyper_parallel is not installed (not on the package index: "
                           "github.com/mindspore-ai/hyper-parallel)")
def test_hyper_parallel_placements_are_read():
    from hyper_parallel.core.placement_types import Partial as HPPartial
    from hyper_parallel.core.placement_types import Replicate as HPReplicate
    from hyper_parallel.core.placement_types import Shard as HPShard

    assert placement_kind(HPShard(1)) == ("shard", 1)
    assert placement_kind(HPReplicate()) == ("replicate", None)
    assert placement_kind(HPPartial("avg")) == ("partial", "avg")


# ------------------------------------------------------------------------ MonitoredTrainStep refuses
class _Net(nn.Cell):
    def __init__(self, weight: Parameter) -> None:
        super().__init__()
        self.w = weight

    def construct(self, x):
        return ops.reduce_sum(ops.matmul(x, self.w))


def test_monitored_train_step_refuses_dtensor_parameters_naming_the_functional_form():
    weight = dtensor_param(np.ones((4, 2)), "w", (Shard(0),), Mesh((2,), ("tp",), ["g"]))
    net = _Net(weight)
    with pytest.raises(UnsupportedParallelError) as err:
        MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.1))
    assert str(err.value).startswith(
        "parameters carrying HyperParallel DTensor layouts (w) hold this rank's local shard, and replicated "
        "ones a partial sum under shard_module alone: MonitoredTrainStep does not compute their norm "
        "(HyperParallel trains in PyNative loops); use the functional form in the training loop: "
        "gradmon.cells.clip_by_global_norm(grads, max_norm, layout=DTensorLayout.from_params(params, "
        "replicate_grads=...)) or gradmon.cells.global_norm(grads, layout=...)")

    sliced = Parameter(Tensor(np.ones((2, 2), np.float32)), name="v")
    sliced.hsdp_effective_shard_size = 2
    net = _Net(sliced)
    message = (r"parameters sliced on dim 0 by hyper_parallel.hsdp \(v\) hold a 1/N slice .* "
               r"MonitoredTrainStep does not compute their norm; .*gradmon.cells.clip_by_global_norm")
    with pytest.raises(UnsupportedParallelError, match=message):
        MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.1))


def test_check_parallel_refuses_dtensor_names_first_three():
    with pytest.raises(UnsupportedParallelError, match=r"layouts \(a, b, c, \.\.\.\)"):
        check_parallel("stand_alone", pipeline_stages=1, sharded=(), pynative_shard=(), shard_group=None,
                       comm_initialized=False, norm_strategy="auto", dtensor=["a", "b", "c", "d"])


# ------------------------------------------------------------------------- 2 msrun ranks, real collectives
@pytest.mark.slow
@pytest.mark.distributed
def test_dtensor_norms_equal_the_unsharded_reference_on_every_rank(tmp_path):
    run_msrun(ROOT / "tests" / "dtensor_train.py", [str(tmp_path / "dt")], tmp_path, timeout=600)
    ranks = [json.loads((tmp_path / f"dt.rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    reference = ranks[0]["reference"]  # float64 numpy, the unsharded model on the whole batch
    assert ranks[1]["reference"] == reference
    np.testing.assert_allclose(ranks[0]["unsharded_f32"], reference, rtol=1e-6)
    assert reference[2] > 5.0 > max(reference[:2])  # the clip engages on the third batch only
    for kind in ("tp", "fsdp", "hsdp"):
        for rank, run in enumerate(r[kind] for r in ranks):
            for step, (ref, got) in enumerate(zip(reference, run)):
                print(f"{kind} rank {rank} step {step}: reference {ref:.6f} dtensor {got['norm']:.6f} "
                      f"(jit {got['norm_jit']:.6f}) per-rank without layout {got['naive']:.6f}")
                for key in ("norm", "norm_jit", "clip_norm"):
                    assert got[key] == pytest.approx(ref, rel=1e-6), (kind, rank, step, key)
                assert got["clipped_norm"] == pytest.approx(min(ref, 5.0), rel=1e-5)
                assert abs(got["naive"] - ref) > 0.05 * ref  # without the layout: this rank's partial norm
    assert ranks[0]["tp_config"] == {
        "parallel_layout": "dtensor", "mesh": {"tp": 2}, "dtensor_params": 8, "plain_params": 0,
        "placements": {"(R)": 5, "(S(1))": 1, "(S(0))": 2}, "replicate_grads": {"tp": "partial"},
        "norm_all_reduces": 2}
    assert ranks[0]["fsdp_config"]["placements"] == {"(S(0))": 8}
    assert ranks[0]["fsdp_config"]["norm_all_reduces"] == 1
    assert ranks[0]["hsdp_config"]["placements"] == {"plain+hsdp(2)": 8}
