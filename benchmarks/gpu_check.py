"""Does MindSpore run on this GPU? ``python -m benchmarks.gpu_check`` (run by ``gpu_setup.sh``).

Three steps, each printed, the first failure ends with exit code 1 and the error: MindSpore's own
``run_check()``; a matrix product on the GPU compared with numpy; three GRAPH-mode training steps of
gradmon's ``MonitoredTrainStep`` (the MLP of ``examples/models.py``) whose reported norm must equal
the float64 norm of the same gradients computed separately. ``--device CPU`` runs the same program on
the CPU (what the tests do here, where no GPU is lent).
"""

from __future__ import annotations

import argparse
import sys
import traceback


def check(device: str) -> None:
    import mindspore as ms
    import numpy as np
    from gradmon.cells import MonitoredTrainStep
    from mindspore import Tensor, nn

    from examples.models import MLP, synthetic_batch, with_loss

    ms.set_context(mode=ms.GRAPH_MODE, device_target=device)
    print(f"[1/3] mindspore {ms.__version__} run_check on {device}", flush=True)
    ms.run_check()

    print("[2/3] matmul against numpy", flush=True)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(64, 32)).astype(np.float32), rng.normal(size=(32, 16)).astype(np.float32)
    got = ms.ops.matmul(Tensor(a), Tensor(b)).asnumpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-3, atol=1e-3)

    print("[3/3] MonitoredTrainStep: reported norm vs float64 norm of the same gradients", flush=True)
    ms.set_seed(0)
    net, twin = MLP(hidden=32), MLP(hidden=32)
    for p, q in zip(net.trainable_params(), twin.trainable_params()):
        q.set_data(Tensor(p.asnumpy()))
    step = MonitoredTrainStep(with_loss(net), nn.SGD(net.trainable_params(), learning_rate=0.0),
                              history_size=8)
    x, y = synthetic_batch(16)
    ref_net = with_loss(twin)
    _, grads = ms.value_and_grad(ref_net, None, ref_net.trainable_params())(x, y)
    exact = float(np.sqrt(sum(np.sum(g.asnumpy().astype(np.float64) ** 2) for g in grads)))
    for i in range(3):
        loss, norm = step(x, y)
        print(f"      step {i + 1}: loss {float(loss.asnumpy()):.5f} norm {float(norm.asnumpy()):.6f} "
              f"(float64 {exact:.6f})", flush=True)
        np.testing.assert_allclose(float(norm.asnumpy()), exact, rtol=1e-4)  # lr 0: same gradients each step
    assert step.gradmon_read_history().total_steps == 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="GPU", choices=["GPU", "CPU", "Ascend"])
    a = p.parse_args(argv)
    try:
        check(a.device)
    except Exception:
        traceback.print_exc()
        print(f"gpu_check: MindSpore does not run correctly on {a.device} (see above)", file=sys.stderr)
        return 1
    print(f"gpu_check: MindSpore and gradmon run on {a.device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
