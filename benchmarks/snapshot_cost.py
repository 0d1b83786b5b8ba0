"""What automatic recovery's snapshots cost: ms per snapshot and per restore, the share of step time
at one snapshot every M=100 steps, and the host memory one snapshot holds.

Models of benchmarks/step_overhead.py (the 1.8M demo Transformer, the 22M one) in a
``MonitoredTrainStep`` that clips with the spike detector (``max_norm=1.0, spike_mode="clip"``: the
optimizer runs in a switch branch, the case that needs ``ops.assign`` to restore), Adam, GRAPH mode.
``device_copy_ms`` is the alternative not taken (a device-side ``Tensor.copy()`` of every
Parameter). Rounds interleave ``step, snapshot, step, restore, device copy`` so that the machine's
load hits all alike; the figures are medians. The 150M row is computed from bytes (4 bytes x
parameters x 3: weights and Adam's two moments), not run: a 150M model does not train on this 2-core
machine in minutes.

Run: ``python -m benchmarks.snapshot_cost [--rounds N] [--models tiny_transformer,transformer_20m]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

M = 100


def measure(model: str, rounds: int) -> dict:
    import mindspore as ms
    from gradmon.cells import MonitoredTrainStep
    from gradmon.cells.snapshot import restore_snapshot, take_snapshot
    from mindspore import nn

    from benchmarks.step_overhead import network_and_inputs

    ms.set_context(mode=ms.GRAPH_MODE)
    net, inputs = network_and_inputs(model)
    opt = nn.Adam(net.trainable_params(), 1e-4)
    cell = MonitoredTrainStep(net, opt, max_norm=1.0, spike_mode="clip")
    params = sum(int(p.size) for p in net.trainable_params())
    for _ in range(2):  # compile, warm up
        cell(*inputs)
    steps, snaps, restores, device = [], [], [], []
    params_list = [p for _, p in cell.parameters_and_names()]
    snap = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        cell(*inputs)[0].asnumpy()
        steps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        snap = take_snapshot(cell, 0)
        snaps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cell(*inputs)[0].asnumpy()
        steps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        restore_snapshot(cell, snap)
        cell.counts.asnumpy()  # the restore has landed
        restores.append(time.perf_counter() - t0)
        # The alternative not taken: a device-side copy of every Parameter (one kernel launch each).
        t0 = time.perf_counter()
        copies = [p.value().copy() for p in params_list]
        copies[-1].asnumpy()
        device.append(time.perf_counter() - t0)
        del copies
    step_ms = statistics.median(steps) * 1e3
    snap_ms = statistics.median(snaps) * 1e3
    return {"model": model, "params": params, "snapshot_mib": snap.nbytes / 2**20 if snap else None,
            "step_ms": step_ms, "snapshot_ms": snap_ms, "restore_ms": statistics.median(restores) * 1e3,
            "share_at_m100": snap_ms / (M * step_ms), "device_copy_ms": statistics.median(device) * 1e3,
            "rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="tiny_transformer,transformer_20m")
    args = parser.parse_args(argv)
    rows = [measure(m, args.rounds) for m in args.models.split(",")]
    # 150M: from bytes (fp32 weights + Adam's m and v), the counters and ring being negligible.
    rows.append({"model": "150M (estimate)", "params": 150_000_000,
                 "snapshot_mib": 150_000_000 * 4 * 3 / 2**20})
    for r in rows:
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
