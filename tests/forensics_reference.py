"""A torch reference for the forensics tests: per-layer gradient norms of the MLP of examples/models.py.

Independent of MindSpore: the weights come in as numpy arrays by parameter name, the forward and
backward run in float64 torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch


def mlp_grads(weights: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray,
              loss: str) -> dict[str, np.ndarray]:
    """Gradients of the mean loss over the batch ``(x, y)`` by parameter name (names end in
    ``body.{0,2,4}.{weight,bias}``); ``loss``: ``"mse"`` (float targets) or ``"ce"`` (int labels)."""
    params = {k: torch.tensor(np.asarray(v, np.float64), requires_grad=True) for k, v in weights.items()}

    def get(suffix: str) -> torch.Tensor:
        (name,) = [k for k in params if k.endswith(suffix)]
        return params[name]

    h = torch.tensor(np.asarray(x, np.float64))
    for i, layer in enumerate((0, 2, 4)):
        h = h @ get(f"body.{layer}.weight").T + get(f"body.{layer}.bias")
        if i < 2:
            h = torch.relu(h)
    if loss == "mse":
        value = torch.mean((h - torch.tensor(np.asarray(y, np.float64))) ** 2)
    else:
        value = torch.nn.functional.cross_entropy(h, torch.tensor(np.asarray(y, np.int64)))
    value.backward()
    return {k: p.grad.numpy() for k, p in params.items()}


def norm_of(grads: Mapping[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(float(np.sum(g * g)) for g in grads.values())))


def tp_mlp_grads(weights: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of the unsharded split MLP of tests/tp_train.py (``TPNet`` with world 1: tanh, relu,
    linear, head; mean softmax cross-entropy over the batch) by parameter name."""
    p = {k: torch.tensor(np.asarray(v, np.float64), requires_grad=True) for k, v in weights.items()}
    h = torch.tanh(torch.tensor(np.asarray(x, np.float64)) @ p["w_in"] + p["b_in"])
    h = torch.relu(h @ p["w_col"] + p["b_col"])
    h = h @ p["w_row"] + p["b_row"]
    logits = h @ p["w_out"] + p["b_out"]
    value = torch.nn.functional.cross_entropy(logits, torch.tensor(np.asarray(y, np.int64)))
    value.backward()
    return {k: t.grad.numpy() for k, t in p.items()}


def ranked_layer_norms(grads: Mapping[str, np.ndarray]) -> list[tuple[str, float]]:
    """``(name, norm)`` of each gradient, largest first: the order of an alarm's ``forensics.layers``."""
    return sorted(((k, float(np.linalg.norm(g))) for k, g in grads.items()), key=lambda kv: -kv[1])


def the_alarm(metrics: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A run's records (metrics.jsonl) and its one ``alarm`` event, one of them (the test fails if
    there are more or none); the alarm's line as logged is printed (``pytest -s`` shows it)."""
    from gradmon.logformat.reader import read_records

    records = list(read_records(metrics))
    (alarm,) = [r for r in records if r.get("type") == "event" and r.get("kind") == "alarm"]
    line = next(line for line in metrics.read_text().splitlines() if '"kind":"alarm"' in line)
    print("forensics event:", line)
    return records, alarm
