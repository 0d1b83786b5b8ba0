"""A training loop that follows mindformers 2.1's PyNative ``Trainer`` (``pynative/trainer/trainer.py``),
for the tests of gradmon's trainer adapter and spike defence where that Trainer cannot be imported
(it needs ``hyper_parallel``; on MindSpore 2.10 CPU ``Tensor.backward`` is missing too).

What it keeps of the Trainer, method by method: ``train`` (state from ``_init_train_state``, then
``on_train_begin``, ``_inner_train_loop``, ``on_train_end``; nothing after the loop when it raises),
``_inner_train_loop`` (``while step < state.max_steps``: epoch hooks, ``on_step_begin``,
``training_step``, ``global_step += 1``, ``on_step_end(config, state, loss=, grad_norm=, ...,
has_last=)``), ``training_step`` (forward and backward, then ``_optimizer_update``),
``_optimizer_update`` (global norm of the gradients, in-place clip to ``training.max_norm`` as
``_calculate_global_grad_norm`` does, ``_should_skip_optimizer_step``, the optimizer, zeroed
gradients) and ``_should_skip_optimizer_step`` (``use_skip_step_on_nan``, ``skipped_steps``,
``max_consecutive_skipped_steps``' ``RuntimeError``). ``ms.value_and_grad`` stands in for
``loss.backward()`` (which HyperParallel patches into MindSpore) and sets ``param.grad``.

The callback handler, state and config classes are injected: mindformers' real ``CallbackHandler``,
``TrainerState`` and ``TrainConfig`` in tests/with_mindformers2/, the duck-typed stand-ins below in
the main suite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

CLIP_EPS = 1e-6


class RegressionLoss(nn.Cell):
    """A small MLP's squared error, times ``scale`` (a loss spike is ``scale=1000``)."""

    def __init__(self, seed: int = 0, width: int = 16) -> None:
        super().__init__()
        ms.set_seed(seed)
        self.net = nn.SequentialCell(nn.Dense(8, width), nn.ReLU(), nn.Dense(width, 1))

    def construct(self, x, y, scale):
        return ops.reduce_mean(ops.square(self.net(x) - y)) * scale


def make_batch(step: int, *, nan: bool = False, scale: float = 1.0, size: int = 16) -> tuple[Tensor, ...]:
    """Step ``step``'s batch (0-based, deterministic); ``nan``: NaN inputs, so NaN gradients."""
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((size, 8)).astype(np.float32)
    y = (x[:, :1] * 0.5 - x[:, 1:2]).astype(np.float32)
    if nan:
        x[0, 0] = np.nan
    return Tensor(x), Tensor(y), Tensor(np.float32(scale))


# -- duck-typed stand-ins for mindformers' CallbackHandler, TrainerState and TrainConfig ------------


class DuckCallbackHandler:
    """Calls every callback as mindformers 2.1's ``CallbackHandler.call_event`` does."""

    def __init__(self, callbacks=None, model=None, train_dataset=None, eval_dataset=None, optimizer=None,
                 lr_scheduler=None) -> None:
        self.callbacks = list(callbacks or [])
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset

    def call_event(self, event: str, args: Any, state: Any, **kwargs: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, event)(args, state, model=self.model, optimizer=self.optimizer,
                               lr_scheduler=self.lr_scheduler, train_dataset=self.train_dataset,
                               eval_dataset=self.eval_dataset, **kwargs)

    def __getattr__(self, event: str) -> Callable[..., None]:
        if event.startswith("on_"):
            return lambda args, state, **kwargs: self.call_event(event, args, state, **kwargs)
        raise AttributeError(event)


@dataclass
class DuckTrainerState:
    epoch: float = 0.0
    global_step: int = 0
    max_steps: int = 0
    epoch_step: int = 0
    global_batch_size: int = 0
    num_accumulation_steps: int = 1
    consumed_samples: int = 0
    skipped_steps: int = 0
    loss_scale: float = 1.0
    is_train_begin: bool = False
    is_train_end: bool = False

    def update_epoch(self) -> None:
        if self.epoch_step > 0:
            self.epoch = self.global_step / self.epoch_step


def duck_config(*, steps: int, max_norm: float = 1.0, use_skip_step_on_nan: bool = False,
                max_consecutive_skipped_steps: int = 0, global_batch_size: int = 16,
                pipeline_parallel: int = 1, **extra: Any) -> SimpleNamespace:
    training = SimpleNamespace(steps=steps, local_batch_size=global_batch_size,
                               global_batch_size=global_batch_size, max_norm=max_norm,
                               use_skip_step_on_nan=use_skip_step_on_nan,
                               max_consecutive_skipped_steps=max_consecutive_skipped_steps)
    parallelism = SimpleNamespace(tensor_parallel=1, pipeline_parallel=pipeline_parallel, context_parallel=1,
                                  expert_parallel=1, data_parallel_shard=-1)
    return SimpleNamespace(training=training, parallelism=parallelism, **extra)


# -- the loop --------------------------------------------------------------------------------------


class LoopTrainer:
    """mindformers 2.1's PyNative Trainer loop (module docstring) on one ``RegressionLoss``.

    ``batches(step)`` gives step ``step``'s (0-based) inputs. ``norms``, ``losses``, ``lrs`` record
    what the loop computed per step (the norm it returned; the rate the optimizer used)."""

    def __init__(self, config: Any, *, callbacks: list[Any], handler_cls: Any = DuckCallbackHandler,
                 state_cls: Any = DuckTrainerState, batches: Callable[[int], tuple] = make_batch,
                 epoch_step: int = 10, lr: Any = None, seed: int = 0) -> None:
        self.config = config
        self.network = RegressionLoss(seed)
        self.model = [self.network]
        self.lr_scheduler = lr if lr is not None else nn.CosineDecayLR(1e-4, 1e-2, 40)
        self.optimizer = nn.AdamWeightDecay(self.network.trainable_params(), learning_rate=self.lr_scheduler)
        self.batches = batches
        self.epoch_step = epoch_step
        self.state_cls = state_cls
        self.global_batch_size = config.training.global_batch_size
        self.use_skip_step_on_nan = config.training.use_skip_step_on_nan
        self.max_consecutive_skipped_steps = config.training.max_consecutive_skipped_steps
        self._consecutive_skipped_steps = 0
        self.callback_handler = handler_cls(callbacks=callbacks, model=self.network, optimizer=self.optimizer,
                                            lr_scheduler=self.lr_scheduler)
        self._grad_fn = ms.value_and_grad(self.network, None, self.optimizer.parameters)
        self.norms: list[float] = []
        self.losses: list[float] = []
        self.lrs: list[float] = []

    def _init_train_state(self) -> Any:
        return self.state_cls(epoch_step=self.epoch_step, max_steps=self.config.training.steps,
                              global_batch_size=self.global_batch_size, num_accumulation_steps=1,
                              is_train_begin=True, is_train_end=False)

    def train(self) -> None:
        self.state = self._init_train_state()
        self.callback_handler.on_train_begin(self.config, self.state)
        self._inner_train_loop()
        self.callback_handler.on_train_end(self.config, self.state)

    def _inner_train_loop(self) -> None:
        for m in self.model:
            m.set_train(True)
        step = self.state.global_step
        while step < self.state.max_steps:
            if step % self.state.epoch_step == 0 and step > 0:
                self.callback_handler.on_epoch_begin(self.config, self.state)
                self.state.update_epoch()
            self.callback_handler.on_step_begin(self.config, self.state)
            loss, grad_norm = self.training_step(step)
            self.state.consumed_samples += self.global_batch_size
            self.state.global_step += 1
            step = self.state.global_step
            self.callback_handler.on_step_end(
                self.config, self.state, loss=loss, grad_norm=grad_norm, monitor=None,
                metric_reduce_group=None, metric_reduce_group_size=None, pp_metric_reduce_group=None,
                pp_metric_reduce_group_size=None, has_last=True)
            if step % self.state.epoch_step == 0:
                self.callback_handler.on_epoch_end(self.config, self.state)

    def training_step(self, step: int) -> tuple[Tensor, Tensor]:
        loss, grads = self._grad_fn(*self.batches(step))  # stands in for loss.backward()
        for param, grad in zip(self.optimizer.parameters, grads):
            param.grad = grad
        self.lrs.append(float(self.optimizer.get_lr().asnumpy()))
        grad_norm = self._optimizer_update()
        self.losses.append(float(loss.asnumpy()))
        self.norms.append(float(grad_norm.asnumpy()))
        return loss, grad_norm

    def _optimizer_update(self) -> Tensor:
        grads = [p.grad for p in self.optimizer.parameters]
        global_norm = ops.sqrt(sum(ops.reduce_sum(ops.square(g.astype(ms.float32))) for g in grads))
        clip_coef = self.config.training.max_norm / (global_norm + CLIP_EPS)
        if clip_coef < 1:
            scale = float(clip_coef.asnumpy())
            for g in grads:
                g.copy_(g * scale)  # mindformers: g.mul_(scale); MindSpore 2.10 CPU's mul_ is not in place
        if not self._should_skip_optimizer_step(global_norm):
            self.optimizer(tuple(grads))
        for p in self.optimizer.parameters:
            p.grad = None
        return global_norm

    def _should_skip_optimizer_step(self, global_norm: Tensor) -> bool:
        if not self.use_skip_step_on_nan:
            return False
        if math.isfinite(float(global_norm.asnumpy())):
            self._consecutive_skipped_steps = 0
            return False
        self._consecutive_skipped_steps += 1
        self.state.skipped_steps += 1
        if 0 < self.max_consecutive_skipped_steps <= self._consecutive_skipped_steps:
            raise RuntimeError(f"[SkipStepOnNaN] The global gradient norm has been NaN/Inf for "
                               f"{self._consecutive_skipped_steps} consecutive steps")
        return True

    def weights(self) -> list[np.ndarray]:
        return [p.asnumpy().copy() for p in self.network.trainable_params()]
