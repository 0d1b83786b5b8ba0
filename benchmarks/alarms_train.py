"""Real MindSpore training runs with faults injected at known steps, for ``python -m benchmarks.alarms``.

A *setting* is a model, an optimizer with its learning-rate schedule and a step cell
(:class:`gradmon.cells.MonitoredTrainStep`, or the loss-scale cell for the fp16 setting). Each
setting trains clean from one or more seeds; the first seed's clean run is also the trunk of the
faulty runs: at every fault step ``F`` the whole state of the train cell (weights, optimizer
moments and step counter, spike-detector state, history ring, loss-scale manager) is copied, and
after the clean run each fault is replayed from its copy: steps ``F .. F + branch - 1`` with the
fault injected, the batches otherwise the clean run's. So a faulty run is the clean run up to
``F - 1`` plus a faulty continuation, without training the prefix again.

Records come from the cell's device history ring (the rows ``LiveMonitor`` turns into step
records, through the same :func:`gradmon.monitor.records.history_rows_to_steps`), one per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HISTORY_SIZE = 1024
READ_EVERY = 512  # steps between history reads (< HISTORY_SIZE: no step is lost)


@dataclass(frozen=True)
class Setting:
    """One model / optimizer / step-cell combination of the suite."""

    name: str
    model: str  # "mlp" | "transformer"
    optimizer: str  # "momentum" | "adam" | "adamw"
    schedule: str  # "constant" | "warmup" | "warmup_cosine"
    lr: float
    spike_mode: str  # the cell's spike_mode ("detect": flags only, no defence)
    loss_scale: bool = False  # fp16 network + MonitoredTrainStepWithLossScale
    batch_size: int = 32
    warmup_steps: int = 100  # learning-rate warm-up of the "warmup*" schedules

    def describe(self) -> str:
        model = {"mlp": "MLP 60k", "transformer": "TinyTransformer 60k"}[self.model]
        opt = {"momentum": "SGD+momentum 0.9", "adam": "Adam", "adamw": "AdamW (wd 0.01)"}[self.optimizer]
        warm = f"lr {self.lr:g}, {self.warmup_steps}-step warm-up"
        sched = {"constant": f"lr {self.lr:g}", "warmup": warm,
                 "warmup_cosine": f"{warm}, cosine decay"}[self.schedule]
        scale = ", fp16 + dynamic loss scale" if self.loss_scale else ""
        return f"{model}, {opt}, {sched}{scale}, spike_mode={self.spike_mode}"


SETTINGS: tuple[Setting, ...] = (
    Setting("sgd_momentum", "mlp", "momentum", "constant", 0.1, "detect"),
    Setting("adam_warmup", "transformer", "adam", "warmup", 1e-3, "clip"),
    Setting("adamw_cosine", "transformer", "adamw", "warmup_cosine", 2e-3, "skip"),
    Setting("fp16_loss_scale", "mlp", "adam", "constant", 1e-3, "clip", loss_scale=True),
)


@dataclass(frozen=True)
class Fault:
    """A fault injected from step ``F`` on: ``kind`` "scale" (inputs times ``factor``), "lr" (the
    learning rate times ``factor``), "labels" (random labels) or "nan" (one NaN input), for
    ``length`` steps."""

    name: str
    kind: str
    factor: float = 1.0
    length: int = 1

    def describe(self) -> str:
        if self.kind == "scale":
            return f"batch inputs x{self.factor:g}"
        if self.kind == "lr":
            return f"learning rate x{self.factor:g} for {self.length} step"
        if self.kind == "labels":
            return f"random labels for {self.length} steps"
        return "one NaN input value"


FAULTS: tuple[Fault, ...] = (
    Fault("x10", "scale", 10.0),
    Fault("x100", "scale", 100.0),
    Fault("x1000", "scale", 1000.0),
    Fault("lr_spike", "lr", 100.0),
    Fault("label_burst", "labels", length=8),
    Fault("nan_batch", "nan"),
)


@dataclass
class FaultRun:
    """A faulty continuation: ``records`` are the steps ``start .. start + len - 1``."""

    fault: Fault
    start: int
    records: list[dict[str, Any]]


@dataclass
class SettingRuns:
    """Everything one setting produced."""

    setting: Setting
    clean: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # seed -> step records
    faults: list[FaultRun] = field(default_factory=list)
    warmup_detector: int = 0  # the cell's spike_warmup (detector flags before it are not counted)
    seconds: float = 0.0


def lr_schedule(setting: Setting, total: int) -> list[float] | float:
    """The per-step learning rates of ``setting`` over ``total`` steps (a constant as a float)."""
    if setting.schedule == "constant":
        return setting.lr
    warm = setting.warmup_steps
    ramp = [setting.lr * (i + 1) / warm for i in range(warm)]
    if setting.schedule == "warmup":
        return ramp + [setting.lr] * (total - warm)
    decay = [setting.lr * 0.05 + 0.5 * (setting.lr * 0.95) * (1 + math.cos(math.pi * i / (total - warm)))
             for i in range(total - warm)]
    return ramp + decay


def apply_fault(fault: Fault | None, offset: int, x: np.ndarray, y: np.ndarray,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The batch as the faulty pipeline delivers it, ``offset`` steps after the fault's first step."""
    if fault is None or not 0 <= offset < fault.length:
        return x, y
    if fault.kind == "scale":
        return x * np.float32(fault.factor), y
    if fault.kind == "nan":
        x = x.copy()
        x.flat[0] = np.nan
        return x, y
    if fault.kind == "labels":
        return x, rng.integers(0, 10, len(y)).astype(y.dtype)
    return x, y


def _assign(param: Any, value: np.ndarray) -> None:
    """Write ``value`` into ``param``'s memory. (``Parameter.set_data`` swaps the buffer: a graph
    compiled before keeps updating the old one, measured on MindSpore 2.10 CPU.)"""
    import mindspore as ms
    from mindspore import ops

    ops.assign(param, ms.Tensor(value))


class _Trainer:
    """One built step cell of a setting and the loop that feeds it."""

    def __init__(self, setting: Setting, seed: int, total_steps: int, data: tuple[np.ndarray, ...]) -> None:
        import mindspore as ms
        from gradmon.cells import MonitoredTrainStep, MonitoredTrainStepWithLossScale
        from mindspore import nn

        from examples.models import MLP, TinyTransformer, with_loss
        from examples.spike_demo import batch_order

        self.setting = setting
        self.x, self.y = data[0], data[1]
        self.plan = batch_order(len(self.x), setting.batch_size, total_steps, seed)
        ms.set_seed(seed)
        net = MLP() if setting.model == "mlp" else TinyTransformer(d_model=64, heads=4, layers=2, ff=128)
        if setting.loss_scale:
            net.to_float(ms.float16)
        lr = lr_schedule(setting, total_steps)
        params = net.trainable_params()
        if setting.optimizer == "momentum":
            opt = nn.Momentum(params, learning_rate=lr, momentum=0.9)
        elif setting.optimizer == "adam":
            opt = nn.Adam(params, learning_rate=lr)
        else:
            opt = nn.AdamWeightDecay(params, learning_rate=lr, weight_decay=0.01)
        # A fixed rate is a Parameter; a schedule a cell holding the per-step Parameter.
        self.lr_param = getattr(opt.learning_rate, "learning_rate", opt.learning_rate)
        options = {"spike_mode": setting.spike_mode, "history_size": HISTORY_SIZE}
        if setting.loss_scale:
            manager = nn.DynamicLossScaleUpdateCell(2.0 ** 16, 2, 200)
            self.cell = MonitoredTrainStepWithLossScale(with_loss(net), opt, manager, **options)
        else:
            self.cell = MonitoredTrainStep(with_loss(net), opt, **options)
        self.cell.set_train()
        self.step = 0
        self.read_to = 0
        self.records: list[dict[str, Any]] = []

    def params(self) -> dict[str, np.ndarray]:
        """A copy of every Parameter of the train cell (its whole training state)."""
        return {name: p.asnumpy().copy() for name, p in self.cell.parameters_and_names()}

    def restore(self, saved: dict[str, np.ndarray], step: int) -> None:
        for name, p in self.cell.parameters_and_names():
            _assign(p, saved[name])
        self.step = self.read_to = step
        self.records = []

    def run(self, steps: int, fault: Fault | None = None, fault_start: int = 0,
            on_step: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
        """Train ``steps`` more steps; return their step records (all of them, oldest first)."""
        import mindspore as ms

        rng = np.random.default_rng(12345)
        for _ in range(steps):
            if on_step is not None:
                on_step(self.step + 1)  # called before the step runs (snapshots of the state so far)
            self.step += 1
            idx = self.plan[self.step - 1]
            x, y = apply_fault(fault, self.step - fault_start, self.x[idx], self.y[idx], rng)
            in_fault = fault is not None and 0 <= self.step - fault_start < fault.length
            lr_fault = in_fault and fault.kind == "lr"
            if lr_fault:
                saved_lr = self.lr_param.asnumpy().copy()
                _assign(self.lr_param, saved_lr * np.float32(fault.factor))
            self.cell(ms.Tensor(x), ms.Tensor(y))
            if lr_fault:
                _assign(self.lr_param, saved_lr)
            if self.step - self.read_to >= READ_EVERY:
                self._read()
        self._read()
        out, self.records = self.records, []
        return out

    def _read(self) -> None:
        from gradmon.monitor.records import history_rows_to_steps

        snap = self.cell.gradmon_read_history()
        rows, lost = history_rows_to_steps(snap.fields, snap.rows, snap.total_steps,
                                           current_step=self.step, after_step=self.read_to)
        if lost:
            raise RuntimeError(f"{lost} steps left the history ring before they were read")
        self.records += [{"type": "step", "step": s, "ts": float(s), **values} for s, values in rows]
        self.read_to = self.step


def train_setting(setting: Setting, *, clean_steps: int, seeds: Sequence[int], fault_steps: Sequence[int],
                  faults: Sequence[Fault], branch_steps: int,
                  log: Callable[[str], None] = print) -> SettingRuns:
    """Train ``setting`` clean from each seed, then every fault at every fault step (from seed
    ``seeds[0]``'s clean run)."""
    import time

    from examples.models import digits

    t0 = time.perf_counter()
    data = digits()
    total = max([clean_steps, *(f + branch_steps for f in fault_steps)]) + 16  # schedule margin
    out = SettingRuns(setting)
    for i, seed in enumerate(seeds):
        trainer = _Trainer(setting, seed, total, data)
        out.warmup_detector = trainer.cell.options.spike_warmup
        saved: dict[int, dict[str, np.ndarray]] = {}

        def snapshot(step: int, trainer: _Trainer = trainer, saved: dict = saved) -> None:
            if step in fault_steps:
                saved[step] = trainer.params()

        out.clean[seed] = trainer.run(clean_steps, on_step=snapshot if i == 0 else None)
        log(f"  {setting.name} seed {seed}: {clean_steps} clean steps ({time.perf_counter() - t0:.0f} s)")
        if i:
            continue
        for start in fault_steps:
            for fault in faults:
                trainer.restore(saved[start], start - 1)
                records = trainer.run(branch_steps, fault=fault, fault_start=start)
                out.faults.append(FaultRun(fault, start, records))
        log(f"  {setting.name}: {len(fault_steps) * len(faults)} faulty runs of {branch_steps} steps "
            f"({time.perf_counter() - t0:.0f} s)")
    out.seconds = time.perf_counter() - t0
    return out
