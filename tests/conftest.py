"""Suite-wide set-up, run in each test process before any test module is imported."""

import mindspore as ms

# One CPU kernel thread per test process, so that runs are reproducible bit for bit. With more,
# MindSpore's CPU kernels split their work by a timed search whose pick depends on the machine's load,
# and the split changes the last bits of some results: the stock nn.TrainOneStepCell with
# nn.AdamOffload, run twice in one process under load, ended with different moments in 1 of 10 runs
# here (the parity tests compare against such a run; 0 of 164 with one thread). Set before the
# runtime starts: it is read once.
try:
    from mindspore.device_context.cpu import op_tuning
except ImportError:  # (MindSpore without device_context: the older setting)
    ms.set_context(runtime_num_threads=1)
else:
    op_tuning.threads_num(1)
