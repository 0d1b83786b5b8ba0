"""Standalone check: ``MonitoredTrainStep`` norm-only against ``ProbeStep`` doing the same norm.

All cells wrap the same network and optimizer and are timed in one process, interleaved
A B A B (bracketed by the plain ``TrainOneStepCell``). Run pinned, e.g.
``taskset -c 1 .venv/bin/python -m benchmarks.norm_h0_vs_probe --model tiny_transformer``.

``--baseline probe_concat --variants gm_norm_h0,probe_concat_2`` brackets the monitored cell by the
probe itself; ``probe_concat_2`` (a second, separately built copy of the same probe) shows the
noise floor between two identical graphs. With ``save_graphs`` the final kernel graphs
(``graph_build_0_*.ir``) of ``gm_norm_h0`` and ``probe_concat`` are identical op for op.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["mlp", "tiny_transformer"], default="tiny_transformer")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--block-s", type=float, default=0.4)
    p.add_argument("--baseline", default="plain", help="the bracketing cell (any variant name)")
    p.add_argument("--variants", default="probe_concat,probe_l2loss,gm_norm_h0")
    a = p.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms
    from gradmon.cells import MonitoredTrainStep
    from mindspore import nn

    from benchmarks.interleave import run_interleaved, sync
    from benchmarks.norm_impls import ProbeStep
    from benchmarks.step_overhead import MODELS
    from examples import models as M

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    spec = MODELS[a.model]
    net = M.with_loss(getattr(M, spec["factory"])())
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    x, y = M.synthetic_batch(spec["batch"])
    builders = {
        "plain": lambda: nn.TrainOneStepCell(net, opt),
        "probe_concat": lambda: ProbeStep(net, opt, norm="concat"),
        "probe_l2loss": lambda: ProbeStep(net, opt, norm="l2loss"),
        "gm_norm_h0": lambda: MonitoredTrainStep(net, opt, history_size=0, skip_nonfinite=False),
        "gm_default": lambda: MonitoredTrainStep(net, opt),
    }
    # A second, separately built copy of a cell: how far two identical graphs differ is the noise floor.
    builders.update({f"{k}_2": v for k, v in builders.items() if k != "plain"})
    cells = {}
    for name in [a.baseline, *a.variants.split(",")]:
        cells[name] = builders[name]()
        out = cells[name](x, y)
        sync(out)
        if isinstance(out, tuple):
            print(f"{name}: loss {float(out[0].asnumpy()):.4f} norm {float(out[1].asnumpy()):.4f}")
    res = run_interleaved(cells, (x, y), baseline=a.baseline, rounds=a.rounds, target_block_s=a.block_s,
                          min_steps=3, max_steps=500, warmup_steps=5, log=print)
    print(f"{a.model}: {res['blocks']} blocks of {res['steps_per_block']} steps")
    for name, v in res["variants"].items():
        ms_step = v["ms_per_step"]["median"]
        if "ratio" in v:
            r = v["ratio"]
            print(f"  {name:14s} {ms_step:8.3f} ms  ratio {r['median']:.3f} IQR {r['q1']:.3f}-{r['q3']:.3f}")
        else:
            print(f"  {name:14s} {ms_step:8.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
