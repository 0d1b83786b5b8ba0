"""Norm strategies and parallel configurations, in one process (the ranks are in test_cells_parallel_tp.py).

- the bucket plan and the strategy choice (pure);
- every refused parallel configuration's message;
- every strategy gives the same norm and per-layer norms on real gradients (GRAPH and PYNATIVE,
  with and without loss scaling, half-precision gradients);
- the per_tensor form carries ``grad_scale`` and nothing reshapes or concatenates a gradient
  before its square (read from the compiled graph);
- tied parameters count once, across pipeline stages too.
"""

from __future__ import annotations

import re
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale, global_norm, norm_strategies
from gradmon.cells.norm_plan import BUCKET_BYTES, choose_strategy, memory_bound, plan_groups
from gradmon.cells.norm_strategies import bucketed_square_sums, grad_scale_square_sums, tensor_square_sums
from gradmon.cells.parallel import (
    UnsupportedParallelError,
    check_parallel,
    pipeline_owner_mask,
    weight_stages,
)
from mindspore import Parameter, Tensor, nn, ops

from examples.models import TinyTransformer, with_loss
from tests.parity_util import graph_mode, mode  # noqa: F401 - the GRAPH/PYNATIVE fixtures


@pytest.fixture
def parallel_context():
    """Set MindSpore's auto-parallel context inside a test; reset afterwards."""
    yield ms.set_auto_parallel_context
    ms.reset_auto_parallel_context()


# ----------------------------------------------------------------------------------------- plan
def _covered(groups, sizes) -> list[int]:
    """How many times each element of each tensor is read by the plan (must be exactly once)."""
    seen = [np.zeros(s, np.int64) for s in sizes]
    for _, pieces in groups:
        for first, stop, lo, hi in pieces:
            for i in range(first, stop):
                if lo < 0:
                    seen[i] += 1
                else:
                    seen[i][lo:hi] += 1
    return [int(x.min()) if x.size else 1 for x in seen] + [int(x.max()) if x.size else 1 for x in seen]


@pytest.mark.parametrize("per_tensor", [False, True])
def test_plan_reads_every_element_once_within_the_bucket(per_tensor):
    sizes = [3, 5, 0, 20, 2, 2, 9, 1]
    classes = [0, 0, 0, 1, 1, 0, 2, 0]
    groups = plan_groups(sizes, 6, per_tensor, classes)
    assert set(_covered(groups, sizes)) == {1}
    for cls, pieces in groups:
        for first, stop, lo, hi in pieces:
            size = (hi - lo) if lo >= 0 else sum(sizes[first:stop])
            assert size <= 6
            assert {classes[i] for i in range(first, stop)} == {cls}, "a piece mixes classes"
    if per_tensor:
        assert len(groups) == len(sizes)
        assert [g[0] for g in groups] == classes
        assert groups[3][1] == ((3, 4, 0, 6), (3, 4, 6, 12), (3, 4, 12, 18), (3, 4, 18, 20))
    else:
        # 3+5 > 6: two pieces; 20 is sliced; 2 (sharded) and 2 (replicated) do not share a piece.
        assert groups[:2] == ((0, ((0, 1, -1, -1),)), (0, ((1, 2, -1, -1),)))
        assert (1, ((4, 5, -1, -1),)) in groups and (0, ((5, 6, -1, -1),)) in groups


def test_plan_merges_small_tensors_and_rejects_bad_buckets():
    assert plan_groups([1, 1, 1, 1], 2, False) == ((0, ((0, 2, -1, -1),)), (0, ((2, 4, -1, -1),)))
    with pytest.raises(ValueError, match="bucket_elems"):
        plan_groups([1], 0, False)
    with pytest.raises(ValueError, match="same length"):
        plan_groups([1, 2], 4, False, [0])


def test_auto_strategy_by_size_and_mode():
    mib = 2**20
    small, big = 1_000_000, 40_000_000
    assert choose_strategy("auto", False, small, 4 * small, False, largest_numel=small) == "flat"
    assert choose_strategy("auto", False, big, 4 * big, False, largest_numel=2**20) == "per_tensor"
    assert choose_strategy("auto", False, big, 4 * big, True, largest_numel=2**20) == "fused"
    # The fused kernel, where built, wins at every size (one launch, one read, no extra memory).
    assert choose_strategy("auto", False, small, 4 * small, True, largest_numel=small) == "fused"
    assert choose_strategy("auto", False, big, 4 * big, lambda: True, largest_numel=2**20) == "fused"
    # Asking whether the fused kernel is there may build it: never under semi_auto/auto parallel.
    assert choose_strategy("auto", True, big, 4 * big, lambda: pytest.fail("asked")) == "per_tensor"
    # A single gradient whose square alone passes the bound: only slices bound it.
    assert choose_strategy("auto", False, big, 4 * big, False, largest_numel=30 * mib) == "bucketed"
    assert choose_strategy("flat", False, big, 4 * big, False) == "flat"
    assert choose_strategy("auto", True, small, 4 * small, False) == "per_tensor"
    assert memory_bound(10 * mib) == 64 * mib and memory_bound(10_000 * mib) == 500 * mib
    assert memory_bound(0) // 4 >= BUCKET_BYTES
    with pytest.raises(ValueError, match="norm_strategy"):
        choose_strategy("fast", False, 1, 4, False)


# ------------------------------------------------------------------------------- refusals (pure)
_BASE = {"pipeline_stages": 1, "sharded": (False, False), "pynative_shard": (), "shard_group": None,
         "comm_initialized": False, "norm_strategy": "auto"}


@pytest.mark.parametrize(("parallel_mode", "changes", "match"), [
    ("hybrid_parallel", {}, r"parallel_mode='hybrid_parallel'.*supported: stand_alone and data_parallel"),
    ("stand_alone", {"sharded": (True, False)},
     r"1 parameter\(s\) are marked layerwise_parallel=True.*pass shard_group="),
    ("data_parallel", {"sharded": (True, True)}, r"2 parameter\(s\).*pass shard_group="),
    ("stand_alone", {"shard_group": "tp"}, r"shard_group='tp' is given but no parameter is marked"),
    ("data_parallel", {"shard_group": "tp", "sharded": (True, False)}, r"needs communication.*init\(\)"),
    ("stand_alone", {"pipeline_stages": 2}, r"pipeline_stages=2 in parallel_mode='stand_alone'"),
    ("semi_auto_parallel", {"norm_strategy": "flat"},
     r"norm_strategy='flat' does not give the global norm in parallel_mode='semi_auto_parallel'"),
    ("auto_parallel", {"norm_strategy": "bucketed"}, r"only 'per_tensor' \(or 'auto'"),
    ("semi_auto_parallel", {"norm_strategy": "fused"}, r"norm_strategy='fused'"),
    ("semi_auto_parallel", {"shard_group": "tp"}, r"shards parameters by strategy"),
    ("stand_alone", {"pynative_shard": ("w",)}, r"PyNative shard\(\) \(w\)"),
])
def test_refused_configurations_name_the_mode_and_what_is_supported(parallel_mode, changes, match):
    with pytest.raises(UnsupportedParallelError, match=match):
        check_parallel(parallel_mode, **{**_BASE, **changes})


@pytest.mark.parametrize(("parallel_mode", "changes"), [
    ("stand_alone", {}), ("data_parallel", {}),
    ("data_parallel", {"shard_group": "tp", "sharded": (True, False), "comm_initialized": True}),
    ("semi_auto_parallel", {"pipeline_stages": 4}), ("auto_parallel", {"norm_strategy": "per_tensor"}),
])
def test_supported_configurations_pass(parallel_mode, changes):
    check_parallel(parallel_mode, **{**_BASE, **changes})


# ------------------------------------------------------------------------ refusals (step cells)
def _sharded_net() -> nn.Cell:
    net = nn.Dense(4, 3)
    net.weight = Parameter(Tensor(np.ones((3, 4), np.float32)), name="weight", layerwise_parallel=True)
    return nn.WithLossCell(net, nn.MSELoss())


def _build(net: nn.Cell, **options) -> MonitoredTrainStep:
    return MonitoredTrainStep(net, nn.SGD(net.trainable_params(), 0.1), **options)


def test_cell_refuses_sharded_parameters_without_group():
    with pytest.raises(UnsupportedParallelError, match=r"marked layerwise_parallel=True.*pass shard_group="):
        _build(_sharded_net())


def test_cell_refuses_group_without_communication_or_sharded_parameters():
    with pytest.raises(UnsupportedParallelError, match=r"needs communication"):
        _build(_sharded_net(), shard_group="tp")
    with pytest.raises(UnsupportedParallelError, match=r"no parameter is marked layerwise_parallel"):
        _build(nn.WithLossCell(nn.Dense(4, 3), nn.MSELoss()), shard_group="tp")


def test_cell_refuses_forms_the_parallel_compiler_cannot_complete(parallel_context):
    parallel_context(parallel_mode="semi_auto_parallel")
    for strategy in ("flat", "bucketed", "fused"):
        with pytest.raises(UnsupportedParallelError, match=f"norm_strategy='{strategy}' does not give"):
            _build(nn.WithLossCell(nn.Dense(4, 3), nn.MSELoss()), norm_strategy=strategy)
    cell = _build(nn.WithLossCell(nn.Dense(4, 3), nn.MSELoss()))
    config = cell.gradmon_config()
    assert config["parallel_mode"] == "semi_auto_parallel" and config["norm_strategy"] == "per_tensor"
    assert config["norm_strategy_requested"] == "auto"


def test_cell_refuses_pipeline_outside_the_compiler_modes(parallel_context):
    parallel_context(pipeline_stages=2)
    with pytest.raises(UnsupportedParallelError, match=r"pipeline_stages=2 in parallel_mode='stand_alone'"):
        _build(nn.WithLossCell(nn.Dense(4, 3), nn.MSELoss()))


def test_fused_without_the_kernel_and_bad_options_are_refused():
    if norm_strategies.fused_available():
        pytest.skip("the fused kernel is built here")
    with pytest.raises(ValueError, match=r"norm_strategy='fused' needs the fused norm kernel"):
        _build(nn.WithLossCell(nn.Dense(4, 3), nn.MSELoss()), norm_strategy="fused")
    with pytest.raises(ValueError, match="norm_strategy must be one of"):
        _build(nn.WithLossCell(nn.Dense(4, 3), nn.MSELoss()), norm_strategy="concat")
    with pytest.raises(TypeError, match="shard_group must be the name of a communication group"):
        _build(nn.WithLossCell(nn.Dense(4, 3), nn.MSELoss()), shard_group="")


def test_functional_shard_arguments_are_checked():
    grads = (Tensor(np.ones(3, np.float32)), Tensor(np.ones(2, np.float32)))
    with pytest.raises(ValueError, match="sharded= marks hand-sharded tensors, which need shard_group"):
        global_norm(grads, sharded=(True, False))
    with pytest.raises(ValueError, match="needs sharded="):
        global_norm(grads, shard_group="tp")
    with pytest.raises(ValueError, match="sharded has 1 entries for 2 tensors"):
        global_norm(grads, shard_group="tp", sharded=(True,))
    with pytest.raises(ValueError, match="sharded marks no tensor"):
        global_norm(grads, shard_group="tp", sharded=(False, False))


# ------------------------------------------------------------------------ strategies agree
def _net() -> nn.Cell:
    ms.set_seed(3)
    return TinyTransformer(d_model=16, heads=2, layers=1, ff=32)


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    return Tensor(rng.random((8, 64), dtype=np.float32)), Tensor(rng.integers(0, 10, 8).astype(np.int32))


def _ref(net: nn.Cell, x, y) -> tuple[float, np.ndarray]:
    loss_net = with_loss(net)
    _, grads = ms.value_and_grad(loss_net, None, loss_net.trainable_params())(x, y)
    sq = np.array([float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads])
    return float(np.sqrt(sq.sum())), sq


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.usefixtures("mode")
def test_every_strategy_gives_the_same_norm_on_real_gradients(scaled, monkeypatch):
    # Tiny buckets, so the bucketed plan concatenates, slices and chains on this small model.
    monkeypatch.setattr(norm_strategies, "bucket_bytes_for", lambda _bytes: 4096)
    x, y = _batch()
    ref_norm, ref_sq = _ref(_net(), x, y)
    fused = ("fused",) if norm_strategies.fused_available() else ()
    strategies = ("flat", "bucketed", "per_tensor", *fused)
    for strategy in strategies:
        for layer_stats in (False, True):
            net = with_loss(_net())
            opt = nn.SGD(net.trainable_params(), 0.0)
            options = {"norm_strategy": strategy, "layer_stats": layer_stats, "history_size": 4}
            if scaled:
                cell = MonitoredTrainStepWithLossScale(net, opt, Tensor(np.float32(2.0**12)), **options)
            else:
                cell = MonitoredTrainStep(net, opt, **options)
            assert cell.gradmon_config()["norm_strategy"] == strategy
            norm = cell(x, y)[1]  # (loss, grad_norm, ...) from both cells
            np.testing.assert_allclose(float(norm.asnumpy()), ref_norm, rtol=2e-6, err_msg=strategy)
            if layer_stats:
                np.testing.assert_allclose(cell.layer_sq.asnumpy(), ref_sq, rtol=2e-5, atol=1e-12,
                                           err_msg=strategy)


def test_strategy_functions_cast_half_precision_before_squaring():
    # 300 squares to 90000 > float16 max: squaring in float16 would give inf.
    arrays = [np.full((40, 3), 300.0, np.float16), np.full((7,), -2.0, np.float16),
              np.full((5, 5), 0.5, np.float32)]
    grads = tuple(Tensor(a) for a in arrays)
    expected = [float((a.astype(np.float64) ** 2).sum()) for a in arrays]
    # Buckets of 50: the first tensor sliced, the next two concatenated after it (the chained path).
    plan = plan_groups([a.size for a in arrays], 50, False)
    replicated, sharded = bucketed_square_sums(grads, None, plan)
    assert sharded is None
    np.testing.assert_allclose(float(replicated.asnumpy()), sum(expected), rtol=1e-6)

    @ms.jit
    def compiled(gs):
        return bucketed_square_sums(gs, None, plan)[0]

    np.testing.assert_allclose(float(compiled(grads).asnumpy()), sum(expected), rtol=1e-6)
    marked = [float(s.asnumpy()[0]) for s in grad_scale_square_sums(grads)]
    plain = [float(s.asnumpy()) for s in tensor_square_sums(grads, Tensor(np.float32(0.5)))]
    np.testing.assert_allclose(marked, expected, rtol=1e-6)
    np.testing.assert_allclose(plain, [e / 4 for e in expected], rtol=1e-6)


def test_functional_uses_the_grad_scale_form_under_semi_auto(parallel_context):
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(5, np.float32)]
    grads = tuple(Tensor(a) for a in arrays)
    flat = float(global_norm(grads).asnumpy())
    parallel_context(parallel_mode="semi_auto_parallel")
    from gradmon.cells.norm_ops import _compiler_completes

    assert _compiler_completes()
    np.testing.assert_allclose(float(global_norm(grads).asnumpy()), flat, rtol=1e-6)
    with pytest.raises(ValueError, match="semi_auto/auto parallel completes the norm itself"):
        global_norm(grads, shard_group="tp", sharded=(True, False))


# ------------------------------------------------------------------ the compiler's pattern
_NODE = re.compile(r"^  %(\d+)\([^)]*\) = ([\w.]+)\((.*)$")
_ALLOWED_ON_THE_WAY = {"Cast", "Mul", "Square", "ReduceSum", "Depend", "Load"}


def _parse_graphs(text: str) -> list[dict]:
    """Nodes of each subgraph of a MindSpore IR dump: id -> (op, input ids, attrs, ours)."""
    graphs: list[dict] = []
    current: dict | None = None
    last = None
    for line in text.splitlines():
        if line.startswith("subgraph @"):
            current = {}
            graphs.append(current)
            continue
        if current is None:
            continue
        match = _NODE.match(line)
        if match:
            node_id, op, rest = match.groups()
            args = re.split(r" primitive_attrs: | cnode_attrs: | \{instance name", rest)[0]
            attrs = re.search(r"primitive_attrs: \{(.*?)\}", rest)
            inputs = [int(a) for a in re.findall(r"%(\d+)", args)]
            last = {"op": op.removeprefix("PrimFunc_"), "inputs": inputs,
                    "attrs": attrs.group(1) if attrs else "", "ours": False}
            current[int(node_id)] = last
        elif last is not None and line.strip().startswith("# In file") and "cells/norm_strategies.py" in line:
            last["ours"] = True
    return graphs


@pytest.mark.usefixtures("graph_mode")
def test_per_tensor_form_carries_grad_scale_and_nothing_reshapes_before_the_square(tmp_path):
    # With loss scaling and layer_stats: the unscaling Mul and the per-tensor vector are on the way too.
    ms.set_context(save_graphs=True, save_graphs_path=str(tmp_path))
    try:
        net = with_loss(_net())
        opt = nn.SGD(net.trainable_params(), 0.1)
        cell = MonitoredTrainStepWithLossScale(net, opt, Tensor(np.float32(8.0)), norm_strategy="per_tensor",
                                               layer_stats=True, history_size=0)
        cell(*_batch())
    finally:
        ms.set_context(save_graphs=False)
    dumps = sorted(Path(tmp_path).rglob("*validate*.ir"))
    assert dumps, f"no validate graph dumped under {tmp_path}"
    graphs = _parse_graphs(dumps[0].read_text(errors="replace"))
    marked = [(g, i) for g in graphs for i, n in g.items()
              if n["op"] == "ExpandDims" and "grad_scale: Bool(1)" in n["attrs"]]
    assert len(marked) == len(net.trainable_params()), "one grad_scale-marked square sum per gradient"
    for graph, node_id in marked:
        chain, current = [], graph[node_id]["inputs"][0]
        while current in graph and graph[current]["ours"]:
            chain.append(graph[current]["op"])
            current = graph[current]["inputs"][0]
        assert "Square" in chain and chain[-1] in ("Square", "Cast", "Mul"), chain
        assert set(chain) <= _ALLOWED_ON_THE_WAY, f"the gradient passes {chain} before its square sum"
        # The sum reaches a Sqrt within the compiler's search depth (it all-reduces the Sqrt's input).
        frontier, depth = {node_id}, 0
        while frontier and not any(graph[i]["op"] == "Sqrt" for i in frontier) and depth < 15:
            frontier = {i for i, n in graph.items() if set(n["inputs"]) & frontier}
            depth += 1
        assert any(graph[i]["op"] == "Sqrt" for i in frontier), "no Sqrt after the marked sums"


# ---------------------------------------------------------------------- tied parameters
class _Head(nn.Cell):
    def __init__(self, weight: Parameter) -> None:
        super().__init__()
        self.weight = weight  # the embedding table again: one Parameter held by two cells
        self.bias = Parameter(Tensor(np.zeros(6, np.float32)), name="head_bias")

    def construct(self, h):
        return ops.matmul(h, self.weight) + self.bias


class _Tied(nn.Cell):
    """An embedding table used again as the output projection: stage 0 and stage 1."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Dense(6, 4, has_bias=False)
        self.mid = nn.Dense(4, 4)
        self.head = _Head(self.embed.weight)
        self.embed.pipeline_stage = 0
        self.mid.pipeline_stage = 0
        self.head.pipeline_stage = 1

    def construct(self, x):
        return self.head(self.mid(self.embed(x)))


@pytest.mark.usefixtures("graph_mode")
def test_tied_parameter_counts_once_and_on_its_first_pipeline_stage():
    net = _Tied()
    weights = net.trainable_params()
    assert [w.name for w in weights].count(net.embed.weight.name) == 1
    stages = weight_stages(net, weights)
    assert stages[[w.name for w in weights].index(net.embed.weight.name)] == {0, 1}
    # Stage 0 counts what it holds, the tied table included; stage 1 only its own bias.
    assert pipeline_owner_mask(stages, 0) == tuple(w is not net.head.bias for w in weights)
    assert pipeline_owner_mask(stages, 1) == tuple(w is net.head.bias for w in weights)
    assert pipeline_owner_mask([set(), {2}], 1) == (True, False)  # no stage set: counted wherever it is
    step = MonitoredTrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(weights, 0.0), layer_stats=True)
    x = Tensor(np.random.default_rng(0).random((3, 6), np.float32))
    y = Tensor(np.zeros((3, 6), np.float32))
    _, norm = step(x, y)
    loss_net = nn.WithLossCell(_Tied(), nn.MSELoss())
    for p, q in zip(loss_net.trainable_params(), weights):
        p.set_data(Tensor(q.asnumpy()))
    _, grads = ms.value_and_grad(loss_net, None, loss_net.trainable_params())(x, y)
    assert len(grads) == len(weights)
    expected = float(np.sqrt(sum((g.asnumpy().astype(np.float64) ** 2).sum() for g in grads)))
    np.testing.assert_allclose(float(norm.asnumpy()), expected, rtol=1e-6)


@pytest.mark.parametrize("strategy", ["flat", "bucketed", "per_tensor"])
@pytest.mark.usefixtures("mode")
def test_uncounted_copies_leave_the_sum_but_keep_their_layer_entry(strategy):
    from gradmon.cells.norm_strategies import GlobalNorm
    from gradmon.cells.parallel import ParallelSetup

    arrays = [np.full((3, 2), 0.5, np.float32), np.full((4,), 2.0, np.float32),
              np.full((2, 2), -1.0, np.float32)]
    grads = tuple(Tensor(a) for a in arrays)
    sq = [float((a.astype(np.float64) ** 2).sum()) for a in arrays]
    setup = ParallelSetup(pipeline_stages=2, stage=1, counted=(True, False, True))
    for per_tensor in (False, True):
        cell = GlobalNorm([a.shape for a in arrays], setup, strategy, per_tensor=per_tensor, scaled=True)
        norm, vec = cell(grads, Tensor(np.float32(0.5)))
        np.testing.assert_allclose(float(norm.asnumpy()), np.sqrt((sq[0] + sq[2]) / 4), rtol=1e-6)
        if per_tensor:
            np.testing.assert_allclose(vec.asnumpy(), np.array(sq) / 4, rtol=1e-6)


@pytest.mark.usefixtures("mode")
def test_fused_slot_runs_the_kernel_where_it_is_built(monkeypatch):
    """With stand-ins for the fused kernel's primitives, ``norm_strategy="fused"`` runs their op."""
    from gradmon.cells import norm_strategies

    calls = []

    def fused_square_sum(scale, *grads):
        calls.append(len(grads))  # PYNATIVE runs this Python; GRAPH mode compiles it
        total = ops.reduce_sum(ops.square(ops.cast(grads[0], ms.float32)))
        for g in grads[1:]:
            total = total + ops.reduce_sum(ops.square(ops.cast(g, ms.float32)))
        return scale * scale * total

    def fused_square_sums(scale, *grads):
        return ops.stack([scale * scale * ops.reduce_sum(ops.square(ops.cast(g, ms.float32))) for g in grads])

    # The interface of gradmon.cells.fused_norm as norm_strategies imports it: primitives built
    # once, called as op(scale, *grads).
    monkeypatch.setattr(norm_strategies, "fused_norm_available", lambda: True)
    monkeypatch.setattr(norm_strategies, "FusedSquaredNorm", lambda: fused_square_sum)
    monkeypatch.setattr(norm_strategies, "FusedSquaredNorms", lambda: fused_square_sums)
    x, y = _batch()
    ref_norm, ref_sq = _ref(_net(), x, y)
    for layer_stats in (False, True):
        net = with_loss(_net())
        cell = MonitoredTrainStepWithLossScale(net, nn.SGD(net.trainable_params(), 0.0),
                                               Tensor(np.float32(64.0)), norm_strategy="fused",
                                               layer_stats=layer_stats)
        assert cell.gradmon_config()["norm_strategy"] == "fused"
        norm = cell(x, y)[1]
        np.testing.assert_allclose(float(norm.asnumpy()), ref_norm, rtol=2e-6)
        if layer_stats:
            np.testing.assert_allclose(cell.layer_sq.asnumpy(), ref_sq, rtol=2e-5, atol=1e-12)
    if ms.get_context("mode") == ms.PYNATIVE_MODE:
        assert calls == [len(net.trainable_params())], "one call over all gradients"
