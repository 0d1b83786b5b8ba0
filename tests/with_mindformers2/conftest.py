"""Tests with mindformers 2.x's PyNative callback protocol, run by ``make test-mindformers2`` in
``.venv-mf2/`` (MindSpore 2.10, mindformers 2.1.0 with --no-deps; docs/mindformers.md); every module
skips where mindformers 2.x is absent (the main venv, and .venv-mf/ with mindformers 1.8).

mindformers 2.1's PyNative ``Trainer`` needs ``hyper_parallel`` (not on the package index) and
MindSpore 2.11, so it does not import here; its ``CallbackHandler``, ``TrainConfig`` and
``TrainerState`` do, and the tests drive them from tests/trainer_loop.py, a loop that follows the
Trainer's ``_inner_train_loop``.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile

import pytest

# mindformers writes its logs under LOCAL_DEFAULT_PATH (default ./output) from import on.
_OUTPUT = tempfile.mkdtemp(prefix="gradmon-mf2-")
os.environ.setdefault("LOCAL_DEFAULT_PATH", _OUTPUT)
atexit.register(shutil.rmtree, _OUTPUT, True)


def mindformers_major() -> int:
    """The installed mindformers' major version (0: none)."""
    try:
        from importlib.metadata import version

        return int(version("mindformers").split(".")[0])
    except Exception:
        return 0


def load_trainer_state():
    """mindformers' ``TrainerState``, loaded by file path: its package ``__init__`` imports the
    Trainer, which needs hyper_parallel."""
    import mindformers

    path = os.path.join(os.path.dirname(mindformers.__file__), "pynative", "trainer", "train_state.py")
    spec = importlib.util.spec_from_file_location("mindformers_train_state", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TrainerState


@pytest.fixture(scope="session")
def trainer_state_cls():
    return load_trainer_state()
