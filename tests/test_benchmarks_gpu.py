"""The GPU set-up's CPU-checkable parts: resolving the CUDA 11 wheels' libraries for MindSpore's GPU
plugin, the set-up script's dry run, and the GPU check program run on the CPU. (No GPU is lent here.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import gpu_env as G

ROOT = Path(__file__).resolve().parent.parent

LDD_SAMPLE = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibmindspore_core.so => /x/mindspore/lib/libmindspore_core.so (0x00007f01)
\tlibcublas.so.11 => not found
\tlibcudart.so.11.0 => /site/nvidia/cuda_runtime/lib/libcudart.so.11.0 (0x00007f02)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f03)
"""


def test_parse_ldd():
    assert G.parse_ldd(LDD_SAMPLE) == {
        "libmindspore_core.so": "/x/mindspore/lib/libmindspore_core.so",
        "libcublas.so.11": None,
        "libcudart.so.11.0": "/site/nvidia/cuda_runtime/lib/libcudart.so.11.0",
    }


def test_nvidia_lib_dirs(tmp_path):
    (tmp_path / "nvidia" / "cublas" / "lib").mkdir(parents=True)
    (tmp_path / "nvidia" / "cublas" / "lib" / "libcublas.so.11").write_bytes(b"")
    (tmp_path / "nvidia" / "cublas" / "include").mkdir()
    (tmp_path / "nvidia" / "empty" / "lib").mkdir(parents=True)  # no library: not a lib dir
    assert G.nvidia_lib_dirs([tmp_path, tmp_path / "absent"]) == [tmp_path / "nvidia" / "cublas" / "lib"]


def test_every_wheel_is_pinned_to_a_cuda11_soname():
    for requirement, sonames in G.CUDA11_WHEELS.items():
        assert "-cu11==" in requirement and sonames
    assert G.CUDA11_WHEELS["nvidia-cudnn-cu11==8.9.6.50"] == ("libcudnn.so.8",)


@pytest.fixture
def mindspore_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("mindspore")
    ms_dir = Path(spec.origin).parent
    if not G.gpu_plugins(ms_dir):
        pytest.skip("this MindSpore build has no GPU plugin")
    if shutil.which("ldd") is None:
        pytest.skip("no ldd here")
    return ms_dir


def test_resolves_libraries_from_a_wheel_layout(tmp_path, mindspore_dir):
    # Real ELF files under the sonames of two wheels, laid out as pip unpacks them: the loader takes them.
    elf = Path(np.core._multiarray_umath.__file__)
    for package, soname in (("cuda_runtime", "libcudart.so.11.0"), ("cufft", "libcufft.so.10")):
        lib = tmp_path / "nvidia" / package / "lib"
        lib.mkdir(parents=True)
        shutil.copy(elf, lib / soname)
    info = G.resolve(mindspore_dir, [tmp_path])
    assert Path(info["plugin"]).name == "libmindspore_gpu.so.11.6", "the newest CUDA plugin comes first"
    assert info["ld_library_path"][:2] == [str(tmp_path / "nvidia" / "cuda_runtime" / "lib"),
                                           str(tmp_path / "nvidia" / "cufft" / "lib")]
    assert info["ld_library_path"][-1].endswith("plugin/gpu11.6")
    assert info["needed"]["libcudart.so.11.0"] == str(tmp_path / "nvidia" / "cuda_runtime" / "lib" /
                                                       "libcudart.so.11.0")
    assert "libcudart.so.11.0" not in info["missing_cuda"] and "libcufft.so.10" not in info["missing_cuda"]
    assert {"libcublas.so.11", "libcudnn.so.8", "libnvrtc.so.11.2"} <= set(info["missing_cuda"])


def test_setup_script_dry_run(mindspore_dir):
    env = {**os.environ, "PYTHON": sys.executable}
    script = str(ROOT / "benchmarks" / "gpu_setup.sh")
    proc = subprocess.run(["bash", script, "--dry-run", "--", "--only", "norm"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for requirement in G.CUDA11_WHEELS:
        assert requirement in proc.stdout
    assert "benchmarks.run --device GPU --only norm" in proc.stdout
    assert "libmindspore_gpu.so.11.6" in proc.stdout and "libcudnn.so.8" in proc.stdout


@pytest.mark.slow
def test_gpu_check_program_runs_on_cpu():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "CPU"], cwd=ROOT,
                          env={**os.environ, "GLOG_v": "3"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[3/3]" in proc.stdout and "run on CPU" in proc.stdout
