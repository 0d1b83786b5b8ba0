"""Tests with the real mindformers, run by ``make test-mindformers`` in ``.venv-mf/`` (MindSpore 2.7.2,
mindformers 1.8.0); every module skips where mindformers does not import (the main venv)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import fields

import mindspore as ms
import pytest
from gradmon.cells.options import StepOptions

# mindformers writes its logs under LOCAL_DEFAULT_PATH (default ./output) from import on: keep them
# out of the checkout. Tests that read mindformers' output files set it to their tmp_path.
_OUTPUT = tempfile.mkdtemp(prefix="gradmon-mf-")
os.environ.setdefault("LOCAL_DEFAULT_PATH", _OUTPUT)
atexit.register(shutil.rmtree, _OUTPUT, True)

MODES = {"GRAPH": ms.GRAPH_MODE, "PYNATIVE": ms.PYNATIVE_MODE}

# The step cells' output_layout="mindformers" comes with the api branch (#17's cell part).
HAS_MINDFORMERS_LAYOUT = "output_layout" in {f.name for f in fields(StepOptions)}
needs_mindformers_layout = pytest.mark.skipif(
    not HAS_MINDFORMERS_LAYOUT,
    reason="the step cells have no output_layout option on this branch yet (it lands with #17's cell part)")


@pytest.fixture(params=list(MODES))
def mode(request):
    """Run the test in GRAPH and in PYNATIVE mode (switched in-process with set_context)."""
    old = ms.get_context("mode")
    ms.set_context(mode=MODES[request.param], device_target="CPU")
    yield request.param
    ms.set_context(mode=old)


@pytest.fixture
def graph_mode():
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    yield
    ms.set_context(mode=old)
