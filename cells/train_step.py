"""Monitored training steps: ``nn.TrainOneStepCell`` plus gradient norm, clipping, skip and history.

Everything per step stays on the device: the norm, the clip coefficient, the spike detector's
state, the history ring and the counters are tensors and Parameters, and ``construct`` returns
``(loss, grad_norm)`` as device tensors. The host reads the ring when it wants
(:meth:`MonitoredTrainStep.gradmon_read_history`), so non-log steps cost no host sync in GRAPH mode.

Skipping an update (non-finite norm, loss-scale overflow, or a spike with ``spike_mode="skip"``)
is a tensor condition around the optimizer call, the construct MindSpore's own
``TrainOneStepWithLossScaleCell`` uses: the optimizer does not run, so weights and optimizer
state stay bit-for-bit unchanged (multiplying the update by 0 would not: 0 x NaN = NaN, and Adam
moves weights on zero gradients). The condition only exists when a skip is possible.

With ``grad_accum_steps=N`` (N > 1) a call is one micro-step: its gradients are added to an
on-device accumulator, and every N-th call runs the monitored update above once on the mean of
the N micro-batches' gradients (another tensor condition; see :meth:`MonitoredTrainStep._accumulate`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ._compat import check_train_cell_layout, require_supported
from .checks import check_loss_output, check_step_arguments, check_step_inputs, step_checks
from .forensics import setup_forensics
from .fused_norm import FusedNormRecord
from .history import COUNTER_NAMES, history_fields
from .host_read import HostReadMixin
from .layouts import StepOutputs, backward_seed, has_learning_rate, split_network_outputs
from .norm_ops import clip_coefficient, scale_grads
from .norm_strategies import GlobalNorm
from .options import StepOptions, check_stock_arguments
from .parallel import read_parallel_setup
from .snapshot import SnapshotMixin
from .spike import initial_state
from .spike_kernel import SpikeDetector

_add_into = ops.MultitypeFuncGraph("gradmon_add_into")
_clear = ops.MultitypeFuncGraph("gradmon_clear")


@_add_into.register("Tensor", "Tensor")
def _add_into_accumulator(accum, grad):
    return ops.assign_add(accum, grad)


@_clear.register("Tensor")
def _clear_accumulator(accum):
    return ops.assign(accum, ops.zeros_like(accum))


class _SkipUpdate(nn.Cell):
    """Branch 0 of the update switch: the optimizer does not run."""

    def construct(self, grads, coef):
        return ops.zeros((), ms.float32)


class _ApplyUpdate(nn.Cell):
    """Branch 1: the optimizer runs on the gradients as they are."""

    def __init__(self, optimizer: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer

    def construct(self, grads, coef):
        return ops.depend(ops.zeros((), ms.float32), self.optimizer(grads))


class _ApplyClippedUpdate(_ApplyUpdate):
    """Branch 2: the optimizer runs on the gradients times the clip coefficient."""

    def construct(self, grads, coef):
        return ops.depend(ops.zeros((), ms.float32), self.optimizer(scale_grads(grads, coef)))


class MonitoredTrainStep(HostReadMixin, SnapshotMixin, StepOutputs, nn.TrainOneStepCell):
    """``nn.TrainOneStepCell`` that also measures, clips and guards the global gradient norm.

    Args:
        network: the network with loss: one output (the loss), or a tuple ``(loss, *extra)``. Every
            output is seeded with ``sens`` (1 by default) in the backward pass, as in the stock cell.
        optimizer: the optimizer cell.
        sens: as in ``nn.TrainOneStepCell``: the backward seed (default 1.0). It is not undone:
            the gradients, their norm and the update all refer to ``sens * loss``.
        return_grad: as in ``nn.TrainOneStepCell``: also return ``{parameter name: gradient}``.
        **options: gradmon's options, each described in :class:`~gradmon.cells.options.StepOptions`
            (``max_norm``, ``skip_nonfinite``, ``spike_mode``, ``history_size``, ``output_layout``,
            ``grad_accum_steps``...).

    Outputs:
        ``(loss, grad_norm[, grads][, *extra])``: the loss (the network's first output), the float32
        global L2 norm of the gradients after the data-parallel reduction (and loss-scale unscaling),
        before clipping (under sharding: the norm of the whole, unsharded gradients, the same on
        every rank), the gradient dict with ``return_grad=True`` and the network's other outputs.
        ``output_layout="mindformers"``: ``(loss, overflow, scale, lr, grad_norm)``. See
        :mod:`gradmon.cells.layouts`. With ``grad_accum_steps=N > 1`` the loss is a float32 scalar:
        the micro-batch's own loss on the first N - 1 calls of an optimizer step, whose ``grad_norm``
        is 0 (no norm exists yet; ``overflow`` is False), and the mean of the N losses on the N-th.

    Raises:
        UnsupportedParallelError: a parallel configuration whose norm gradmon cannot get right
            (the message names the mode and what is supported).
    """

    # Whether construct scales the loss (the loss-scale subclass): fixes skip_nonfinite, adds a ring column.
    _loss_scaled: ClassVar[bool] = False

    def __init__(self, network: nn.Cell, optimizer: nn.Cell, sens: float | None = None,
                 return_grad: bool = False, **options: Any) -> None:
        require_supported()
        # Fail before building anything.
        check_step_arguments(type(self).__name__, network, optimizer)
        checked = StepOptions.from_kwargs(type(self).__name__, **options)
        sens, return_grad = check_stock_arguments(sens, return_grad, checked.output_layout,
                                                  checked.grad_accum_steps)
        super().__init__(network, optimizer, sens=sens, return_grad=return_grad)
        check_train_cell_layout(self)
        self.options = checked
        self.step_checks = step_checks(type(self).__name__, network, self._loss_scaled, checked)
        self._setup_monitoring(checked)
        self._setup_outputs(checked)

    # ----------------------------------------------------------------------------------- setup
    def _setup_monitoring(self, options: StepOptions) -> None:
        max_norm, spike, history_size = options.max_norm, options.spike, options.history_size
        layer_stats, loss_scale = options.layer_stats, self._loss_scaled
        if spike.lr_ratio and not has_learning_rate(self.optimizer):
            spike = replace(spike, lr_ratio=0.0)  # the optimizer's rate is unreadable: no learning-rate test
        self.max_norm = max_norm
        self.skip_nonfinite = options.skip_nonfinite or loss_scale
        self.spike = spike
        self.history_size = history_size
        self.local_norm = options.local_norm
        self.layer_stats = layer_stats
        self.loss_scale = loss_scale
        self.grad_accum_steps = options.grad_accum_steps
        self.accumulates = self.grad_accum_steps > 1
        # Whether the gradients reach the norm and the update times inv_scale: the loss scale's
        # inverse, and 1/N under accumulation (the accumulator holds the sum of the N micro-batches').
        self.unscales = loss_scale or self.accumulates
        # Compile-time switches read by construct (plain Python values are constants in GRAPH mode).
        self.has_max_norm = max_norm is not None
        self.spike_on = spike.enabled
        # The ring's spike column says 2 where the detector's loss test tripped, 3 where its
        # learning-rate test did (see _record).
        self.spike_loss_code = spike.enabled and spike.loss_window > 0
        self.spike_lr = spike.enabled and spike.lr_ratio > 0
        self.spike_clip = spike.mode == "clip"
        self.spike_skip = spike.mode == "skip"
        self.clips = self.has_max_norm or self.spike_clip
        self.may_skip = self.skip_nonfinite or self.spike_skip
        # The update runs exactly on finite steps (no loss-scale update cell, no spike skip).
        self.skips_only_nonfinite = self.skip_nonfinite and not loss_scale and not self.spike_skip
        # Clipping without loss scaling inside the skip switch (see _monitored_update). With loss
        # scaling every step rescales anyway, and without a skip a branch costs more than it saves.
        self.clip_in_branch = self.clips and self.may_skip and not self.unscales
        if self.clip_in_branch:
            # A plain tuple, not a CellList: GRAPH mode compiles a tensor index into one switch, and
            # PYNATIVE reads the index once (Tensor.__index__), as it reads the `if` condition.
            self.update_branches = (_SkipUpdate(), _ApplyUpdate(self.optimizer),
                                    _ApplyClippedUpdate(self.optimizer))
        self.use_graceful_exit = bool(getattr(self, "use_graceful_exit", False))
        if not hasattr(self, "loss_scaling_manager"):
            self.loss_scaling_manager = None

        self._one = Tensor(1.0, ms.float32)
        self._zero = Tensor(0.0, ms.float32)
        self._false = Tensor(False, ms.bool_)
        self._max_norm_t = Tensor(max_norm if max_norm is not None else 1.0, ms.float32)
        self.weight_names = tuple(p.name for p in self.weights)
        if not self.weight_names:
            raise ValueError("the optimizer has no parameters to train")
        # The norm's form is fixed here, from the parallel setup and the gradients' sizes.
        self.parallel_setup = read_parallel_setup(self.network, tuple(self.weights), options.shard_group,
                                                  options.norm_strategy)
        self.grad_norm = GlobalNorm.build(self.weights, self.parallel_setup, options.norm_strategy,
                                          per_tensor=layer_stats or options.forensics > 0,
                                          scaled=self.unscales)
        setup_forensics(self, options)  # cells/forensics.py: the rings of forensics=K (none when off)
        if self.local_norm or self.forensics_keeps_ranks:
            self.local_grad_norm = GlobalNorm.build(self.weights, self.parallel_setup, options.norm_strategy,
                                                    per_tensor=False, scaled=self.unscales, local=True)

        if self.spike_on:
            # [finite steps seen, mean, variance, scale, early ring] of the detector: one read, one write.
            self.spike_state = Parameter(Tensor(initial_state(spike)), name="gradmon_spike_state",
                                         requires_grad=False)
            # The update: one fused CPU kernel where it is available, else zclip_update's stock ops.
            self.spike_detector = SpikeDetector(spike)
        # Under data parallel the loss test judges the ranks' mean loss (one scalar all-reduce), so
        # every rank takes the same decision, as it does on the all-reduced norm.
        self.spike_loss_reduce = self.spike_loss_code and self.reducer_flag
        if self.spike_loss_reduce:
            self.loss_all_reduce = ops.AllReduce()
            self._inv_degree = Tensor(1.0 / self.degree, ms.float32)
        if layer_stats:
            self.layer_sq = Parameter(Tensor(np.zeros(len(self.weight_names), np.float32)),
                                      name="gradmon_layer_sq", requires_grad=False)
        self.fields = history_fields(loss_scale, self.local_norm)
        if history_size > 0:
            self.history = Parameter(Tensor(np.zeros((history_size, len(self.fields)), np.float32)),
                                     name="gradmon_history", requires_grad=False)
            # [steps, clipped, spikes, skipped, nonfinite]: one vector, so a read is one transfer.
            self.counts = Parameter(Tensor(np.zeros(1 + len(COUNTER_NAMES), np.int32)),
                                    name="gradmon_counts", requires_grad=False)
            self._count_one = Tensor(np.ones(1, np.int32))
        # The defaults (no clipping, detector, loss scale, local or per-layer norms): the row and the
        # counters follow from the norm, so the fused kernel's one launch writes them (see _norm_and_record).
        self.fused_record = (history_size > 0 and not self.clips and not self.spike_on and not loss_scale
                             and not self.local_norm and self.grad_norm.one_fused_pass())
        if self.fused_record:
            self.norm_record = FusedNormRecord(len(self.fields))
            self._record_config = Tensor(np.array([history_size, int(self.skip_nonfinite)], np.int32))
        if self.accumulates:
            self._setup_accumulation()

    def _setup_accumulation(self) -> None:
        """The accumulator (one buffer per gradient, the parameters' shapes and dtypes), the micro-step
        counter and the sum of the micro-batches' losses: Parameters, so a checkpoint keeps them."""
        self.accum_grads = self.weights.clone(prefix="gradmon_accum", init="zeros")
        for accum in self.accum_grads:
            accum.requires_grad = False
        self.accum_loss = Parameter(Tensor(np.zeros((), np.float32)), name="gradmon_accum_loss",
                                    requires_grad=False)
        self.micro_step = Parameter(Tensor(np.zeros((), np.int32)), name="gradmon_micro_step",
                                    requires_grad=False)
        self._last_micro_step = Tensor(self.grad_accum_steps - 1, ms.int32)
        self._micro_one = Tensor(1, ms.int32)
        self._inv_accum = Tensor(1.0 / self.grad_accum_steps, ms.float32)
        self._hyper_map = ops.HyperMap()

    # ------------------------------------------------------------------------------- construct
    def construct(self, *inputs):
        if self.forensics_keeps_ids:  # the last input is the batch's sample ids: kept, not the network's
            self.forensics_ids(inputs[-1])
            inputs = inputs[:-1]
        outputs = self._forward(*inputs)
        loss, extra = split_network_outputs(outputs)
        lr = self._step_learning_rate()  # before the optimizer advances its global_step
        grads, inv_scale, scale_used = self._backward(outputs, *inputs)
        if self.accumulates:
            loss, norm, grads = self._accumulate(loss, grads, inv_scale, scale_used, lr)
        else:
            loss, norm, grads = self._monitored_update(loss, grads, inv_scale, scale_used, lr)
        return self._step_outputs(loss, norm, grads, extra, lr)

    def _forward(self, *inputs):
        """The network's outputs: its loss, or ``(loss, *extra)`` (checked: cells/checks.py)."""
        check_step_inputs(len(inputs), self.step_checks)
        return check_loss_output(self.network(*inputs), self.step_checks)

    def _backward(self, outputs, *inputs):
        """``(grads, inv_scale, scale_used)``: gradients seeded with ``sens``, as ``nn.TrainOneStepCell``."""
        if self.sense_flag:
            grads = self.grad(self.network, self.weights)(*inputs, backward_seed(outputs, self.sens))
        else:
            grads = self.grad_no_sens(self.network, self.weights)(*inputs)
        return grads, self._one, self._one

    def _accumulate(self, loss, grads, inv_scale, scale_used, lr=None):
        """One micro-step: add this micro-batch's gradients (before any reduction) to the accumulator;
        on the N-th, run :meth:`_monitored_update` once on their mean and clear the accumulator.

        The mean is the sum times ``1/N``, folded into the unscaling multiply (``inv_scale``) that
        the norm and the update already make: as in MindSpore's and mindformers' accumulation, the
        optimizer sees the mean gradient over the N micro-batches. A non-finite micro-batch makes
        the sum non-finite, so its whole optimizer step is skipped (with ``skip_nonfinite``).
        Returns ``(loss, grad_norm, grads)``: on the first N - 1 calls the micro-batch's float32
        loss and a norm of 0; on the N-th, the mean loss and the accumulated step's norm.
        """
        loss32 = _as_scalar_f32(loss)
        loss_sum = self.accum_loss + loss32
        grads = ops.depend(grads, self._hyper_map(_add_into, self.accum_grads, grads))
        norm = self._zero
        if self.micro_step < self._last_micro_step:
            ops.assign(self.accum_loss, loss_sum)
            ops.assign_add(self.micro_step, self._micro_one)
        else:
            # The accumulator, read after the add above (the Parameters' reads follow program order).
            mean_loss = loss_sum * self._inv_accum
            loss32, norm, grads = self._monitored_update(mean_loss, self.accum_grads,
                                                         inv_scale * self._inv_accum, scale_used, lr)
            loss32 = ops.depend(loss32, self._hyper_map(_clear, self.accum_grads))
            ops.assign(self.accum_loss, self._zero)
            ops.assign(self.micro_step, ops.zeros_like(self.micro_step))
        return loss32, norm, grads

    def _monitored_update(self, loss, grads, inv_scale, scale_used, lr=None):
        """Norm, detector, clip, guarded optimizer call and history for one step (``lr``: the rate
        this step's update uses, for the detector's learning-rate test).

        Returns ``(loss, grad_norm, grads)``: ``grads`` after the data-parallel reduction, before clipping.
        Each stage is a helper a subclass may override; they run in this order (their side effects on
        the detector state, the loss scale and the ring are ordered by it in GRAPH mode too).
        """
        local = self._local_norm(grads, inv_scale)
        grads = self._reduce_grads(grads)
        if self.fused_record:
            norm, finite = self._norm_and_record(loss, grads, inv_scale)
        else:
            norm = self._global_norm(grads, inv_scale)
            finite = ops.isfinite(norm)
        zscore, spike, target, loss_spike, lr_spike = self._spike_status(norm, finite, loss, lr)
        # Clip on the norm and loss tests alone: an lr spike has no clip target (skip, or a flag).
        coef = self._clip_coefficient(norm, finite, spike, target)
        if self.spike_lr:
            spike = ops.logical_or(spike, lr_spike)
        update = self._update_grads(grads, coef, inv_scale)
        apply = self._update_allowed(finite, spike, scale_used)
        loss = self._guarded_update(loss, update, coef, apply)
        if self.history_size > 0 and not self.fused_record:
            # Flags fixed by the options are constants (no kernel): without clipping nothing is
            # clipped, and with the non-finite skip alone a step is skipped exactly when it is non-finite.
            clipped = ops.logical_and(apply, coef < 1.0) if self.clips else self._false
            nonfinite = ops.logical_not(finite)
            skipped = nonfinite if self.skips_only_nonfinite else ops.logical_not(apply)
            self._record(loss, norm, coef, zscore, clipped, spike, skipped, nonfinite, scale_used, local,
                         loss_spike, lr_spike)
        return loss, norm, grads

    def _local_norm(self, grads, inv_scale):
        """This rank's own norm, before the reduction (``local_norm=True``; else a constant 0).

        Under data parallel with ``forensics=K`` it is computed too, and every rank's is kept."""
        if self.local_norm or self.forensics_keeps_ranks:
            local, _ = self.local_grad_norm(grads, inv_scale)
            if self.forensics_keeps_ranks:
                self.forensics_ranks(local)
            return local if self.local_norm else self._zero
        return self._zero

    def _reduce_grads(self, grads):
        """The data-parallel reduction (and the graceful-exit hook), as ``nn.TrainOneStepCell`` runs it."""
        grads = self.grad_reducer(grads)
        if self.use_graceful_exit:
            grads = self.graceful_exit.exit_by_request(grads, self.init_param, self.exit_param)
        return grads

    def _global_norm(self, grads, inv_scale):
        """The global norm, unscaled by ``inv_scale`` where the cell scales (and the per-layer sums).

        The strategy chosen at construction (flat: three kernels however many tensors; bucketed:
        bounded memory; per_tensor: the form the parallel compiler completes).
        """
        norm, layer_sq = self.grad_norm(grads, inv_scale)
        if self.layer_stats:
            ops.assign(self.layer_sq, layer_sq)
        if self.forensics_on:  # this step's per-layer sums, from the same pass
            self.forensics_layers(layer_sq)
        return norm

    def _norm_and_record(self, loss, grads, inv_scale):
        """``(norm, finite)`` and this step's history row and counters, from one kernel launch
        (``fused_record``: the defaults, where the row follows from the norm: clip_coef 1, zscore 0,
        not clipped, no spike, skipped exactly when non-finite with ``skip_nonfinite``).

        Replaces :meth:`_global_norm`, ``isfinite`` and :meth:`_record`'s ~12 scalar kernels by the
        kernel, a row scatter and a counter store; the values are the same bits (the norm is the
        fused path's, the loss is the step's float32 loss, the row's place ``steps mod size``).
        """
        scale = inv_scale if self.unscales else self._one
        norm, finite, row, slot, counts = self.norm_record(scale, _as_scalar_f32(loss), self._record_config,
                                                           self.counts, *grads)
        ops.scatter_update(self.history, slot, row)
        ops.assign(self.counts, counts)
        return norm, finite

    def _spike_status(self, norm, finite, loss, lr=None):
        """``(zscore, spike, target, loss_spike, lr_spike)`` of the detector, its state advanced (off:
        ``(0, False, norm, False, False)``). ``loss`` is the step's loss as the cell returns it: unscaled
        (the loss scale only seeds the backward pass), the micro-batches' mean under accumulation; under
        data parallel the detector gets the ranks' mean of it. ``lr``: the step's rate (every rank's
        is the same), read with the learning-rate test."""
        if self.spike_on:
            loss32 = _as_scalar_f32(loss)
            if self.spike_loss_reduce:
                loss32 = self.loss_all_reduce(loss32.reshape((1,))).reshape(()) * self._inv_degree
            zscore, spike, target, state, loss_spike, lr_spike = self.spike_detector(
                norm, finite, self.spike_state, loss32, lr if self.spike_lr else None)
            ops.assign(self.spike_state, state)
            return zscore, spike, target, loss_spike, lr_spike
        return self._zero, self._false, norm, self._false, self._false

    def _clip_coefficient(self, norm, finite, spike, target):
        """The factor the update's gradients get (1 when nothing clips, and on a non-finite step)."""
        if not self.clips:
            return self._one
        if self.spike_clip:
            # Only a spike is clipped to the detector's target: on any other step the target is
            # the norm itself, whose coefficient norm / (norm + eps) would scale by 0.99999.
            coef = ops.select(spike, clip_coefficient(norm, target), self._one)
            if self.has_max_norm:
                coef = ops.minimum(coef, clip_coefficient(norm, self._max_norm_t))
        else:
            coef = clip_coefficient(norm, self._max_norm_t)
        return ops.select(finite, coef, self._one)

    def _update_grads(self, grads, coef, inv_scale):
        """The gradients the optimizer gets: clipped and unscaled in one pass where either applies.

        (Rescaling stays per tensor: measured, N multiplies beat one multiply plus a Split.) With
        ``clip_in_branch`` the clip happens inside the update switch, only on steps that clip.
        """
        if self.clips:
            if self.unscales:
                return scale_grads(grads, coef * inv_scale)
            if not self.clip_in_branch:
                return scale_grads(grads, coef)
            return grads
        if self.unscales:
            return scale_grads(grads, inv_scale)
        return grads

    def _update_allowed(self, finite, spike, scale_used):
        """Whether the optimizer runs this step (a bool tensor); runs the loss-scale update cell.

        Like ``TrainOneStepWithLossScaleCell.process_loss_scale``: the overflow flag (a non-finite
        norm) goes to the update cell, which adjusts the scale; an overflow, or a spike with
        ``spike_mode="skip"``, means no update.
        """
        if not self.may_skip:
            return ops.ones_like(finite)
        if self.skips_only_nonfinite:
            return finite
        overflow = ops.logical_not(finite)
        if self.loss_scaling_manager is not None:
            overflow = self.loss_scaling_manager(self.scale_sense, ops.depend(overflow, scale_used))
        # skip_nonfinite is always on with loss scaling; off, only a spike can skip.
        apply = ops.logical_not(overflow) if self.skip_nonfinite else ops.ones_like(finite)
        if self.spike_skip:
            apply = ops.logical_and(apply, ops.logical_not(spike))
        return apply

    def _guarded_update(self, loss, grads, coef, apply):
        """The optimizer call, inside a tensor condition when a step may be skipped."""
        if not self.may_skip:
            return ops.depend(loss, self.optimizer(grads))
        if self.clip_in_branch:
            # One switch instead of the `if`: 0 skip, 1 apply as is, 2 apply clipped. A step that
            # needs no clipping makes no pass over the gradients (x * 1.0 would be one).
            branch = ops.cast(apply, ms.int32) * (1 + ops.cast(coef < 1.0, ms.int32))
            return ops.depend(loss, self.update_branches[branch](grads, coef))
        if apply:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss

    def _record(self, loss, norm, coef, zscore, clipped, spike, skipped, nonfinite, scale_used, local,
                loss_spike=None, lr_spike=None):
        """Write this step's row into the ring and bump the counters (a handful of tiny kernels).

        The ``spike`` column is 2 where the detector's loss test tripped it, 3 where its learning-rate
        test did (either way; 1: the norm tests alone); the counter counts spike steps."""
        loss32 = _as_scalar_f32(loss)
        flags = ops.stack((clipped, spike, skipped, nonfinite))
        flag_values = ops.cast(flags, ms.float32)
        if self.spike_loss_code or self.spike_lr:
            extra = ops.cast(loss_spike, ms.float32) if self.spike_loss_code else self._zero
            if self.spike_lr:
                extra = ops.maximum(extra, 2.0 * ops.cast(lr_spike, ms.float32))
            flag_values = flag_values + ops.stack((self._zero, extra, self._zero, self._zero))
        parts = (ops.stack((loss32, norm, coef, zscore)), flag_values)
        # Tuple concatenation, not starred unpacking: GRAPH mode's parser handles the former.
        if self.loss_scale:
            parts = parts + (scale_used,)  # noqa: RUF005
        if self.local_norm:
            parts = parts + (local.reshape((1,)),)  # noqa: RUF005
        row = ops.concat(parts).reshape((1, -1))
        slot = ops.floor_mod(self.counts[0:1], self.history_size)
        ops.scatter_update(self.history, slot, row)
        ops.assign_add(self.counts, ops.concat((self._count_one, ops.cast(flags, ms.int32))))


def _as_scalar_f32(loss):
    """The loss as a float32 scalar (the mean of a non-scalar loss).

    Shape and dtype are compile-time constants: a float32 scalar loss costs no kernel here."""
    loss32 = loss if loss.dtype == ms.float32 else ops.cast(loss, ms.float32)
    if loss32.shape != ():
        loss32 = ops.reduce_mean(loss32)
    return loss32


class MonitoredTrainStepWithLossScale(MonitoredTrainStep):
    """:class:`MonitoredTrainStep` with loss scaling, like ``nn.TrainOneStepWithLossScaleCell``.

    ``scale_sense`` is a ``DynamicLossScaleUpdateCell``/``FixedLossScaleUpdateCell`` (the scale is
    updated on device from the overflow flag) or a float32 Tensor of shape ``()``/``(1,)`` (a fixed
    scale; change it with :meth:`set_sense_scale`). Overflow means a non-finite gradient norm after
    unscaling, a check that runs on every backend (CPU included); an overflow step is skipped.
    The reported ``grad_norm`` is the unscaled norm; the history gets a ``loss_scale`` column with
    the scale the step used. Accepts the keyword options of :class:`MonitoredTrainStep` except
    ``sens``, ``return_grad`` (the stock cell takes neither) and ``skip_nonfinite`` (always on).

    Outputs: ``(loss, grad_norm, overflow, scale[, *extra])``; ``overflow`` is the bool the stock cell
    returns (this step's gradients were not finite; the update was skipped) and ``scale`` the loss
    scale after this step's update, as the stock cell returns it (the history keeps the scale the
    step used). ``output_layout="mindformers"``: ``(loss, overflow, scale, lr, grad_norm)``.
    """

    _loss_scaled: ClassVar[bool] = True

    def __init__(self, network: nn.Cell, optimizer: nn.Cell, scale_sense: Any, **options: Any) -> None:
        for fixed in ("sens", "return_grad", "skip_nonfinite"):
            if fixed in options:
                raise TypeError(f"MonitoredTrainStepWithLossScale does not take {fixed!r} (the loss scale "
                                "is the backward seed, nn.TrainOneStepWithLossScaleCell returns no "
                                "gradients, and overflow steps are always skipped)")
        if not isinstance(scale_sense, (nn.Cell, Tensor)):
            raise TypeError("scale_sense must be a loss-scale update Cell or a Tensor, "
                            f"got {type(scale_sense).__name__}")
        if isinstance(scale_sense, Tensor) and tuple(scale_sense.shape) not in ((), (1,)):
            raise ValueError(f"scale_sense must have shape () or (1,), got {tuple(scale_sense.shape)}")
        super().__init__(network, optimizer, sens=None, **options)
        if isinstance(scale_sense, nn.Cell):
            self.loss_scaling_manager = scale_sense
            self.scale_sense = Parameter(Tensor(scale_sense.get_loss_scale(), ms.float32), name="scale_sense")
        else:
            self.scale_sense = Parameter(scale_sense, name="scale_sense")

    def _backward(self, outputs, *inputs):
        """Gradients seeded with the loss scale, as ``nn.TrainOneStepWithLossScaleCell`` seeds them."""
        scale = ops.cast(self.scale_sense, ms.float32).reshape(())
        # A copy of the scale this step uses (Stack writes a new buffer): a cast/reshape may alias the
        # Parameter, which the update cell overwrites before the history row is written.
        scale_used = ops.stack((scale,))
        grads = self.grad(self.network, self.weights)(*inputs, backward_seed(outputs, scale))
        return grads, 1.0 / scale, scale_used

    def _loss_scale_after(self):
        # What nn.TrainOneStepWithLossScaleCell returns: the scale after this step's update (the next
        # step's), as a new tensor (in PYNATIVE the stock cell returns the Parameter itself, which changes).
        return ops.ones_like(self.scale_sense) * self.scale_sense

    def set_sense_scale(self, sens: Tensor) -> None:
        """Replace a fixed loss scale (same shape and dtype as the original ``scale_sense``)."""
        if not isinstance(sens, Tensor):
            raise TypeError(f"sens must be a Tensor, got {type(sens).__name__}")
        self.scale_sense.set_data(sens)

    def gradmon_config(self) -> dict:
        config = super().gradmon_config()
        config["loss_scale_dynamic"] = isinstance(self.loss_scaling_manager, nn.DynamicLossScaleUpdateCell)
        return config
