"""Building the fused-norm kernel library, the kernel alone (through ctypes, no MindSpore), and the
fallback where no compiler is available (in a subprocess, as a user without g++ would run it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from gradmon.cells import fused_build as B

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "cells" / "csrc" / "fused_norm.cc"
BUILD_MODULE = ROOT / "cells" / "fused_build.py"


def _compiler_or_skip() -> str:
    try:
        return B.find_compiler()
    except B.KernelBuildError as exc:
        pytest.skip(f"no C++ compiler here: {exc}")


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory) -> dict:
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("cache"))}


@pytest.fixture(scope="module")
def library(cache_env) -> Path:
    """The library built once for this module into an empty per-test cache."""
    _compiler_or_skip()
    return B.ensure_library(SOURCE, "gradmon_fused_norm", "test", environ=cache_env)


# --------------------------------------------------------------------------------- pure functions
def test_build_key_tracks_everything_the_library_depends_on():
    base = B.build_key(b"src", "g++ 12", "2.10.0")
    assert base == B.build_key(b"src", "g++ 12", "2.10.0")
    others = {B.build_key(b"src2", "g++ 12", "2.10.0"), B.build_key(b"src", "clang 16", "2.10.0"),
              B.build_key(b"src", "g++ 12", "2.9.0"), B.build_key(b"src", "g++ 12", "2.10.0", ("-O2",))}
    assert base not in others and len(others) == 4


def test_cache_root_is_per_user():
    assert B.cache_root({"XDG_CACHE_HOME": "/x/cache"}) == Path("/x/cache/gradmon/kernels")
    assert B.cache_root({}) == Path(os.path.expanduser("~")) / ".cache" / "gradmon" / "kernels"


def test_find_compiler_honours_the_env_and_says_what_is_missing(tmp_path):
    fake = tmp_path / "my-c++"
    fake.write_text("#!/bin/sh\necho fake 1.0\n")
    fake.chmod(0o755)
    assert B.find_compiler({"GRADMON_CXX": str(fake), "PATH": ""}) == str(fake)
    assert B.find_compiler({"CXX": "my-c++", "PATH": str(tmp_path)}) == str(fake)
    with pytest.raises(B.KernelBuildError, match=r"no C\+\+ compiler found.*GRADMON_CXX"):
        B.find_compiler({"GRADMON_CXX": "/nonexistent/c++", "PATH": ""})
    with pytest.raises(B.KernelBuildError, match=r"c\+\+, g\+\+ or clang\+\+ on PATH"):
        B.find_compiler({"PATH": str(tmp_path / "empty")})
    assert B.compiler_identity(str(fake)).endswith("fake 1.0")
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(B.KernelBuildError, match="does not run"):
        B.compiler_identity(str(broken))


# --------------------------------------------------------------------------------------- building
def test_builds_once_into_the_cache(library, cache_env, monkeypatch):
    assert library.is_file()
    assert library.parent.parent == Path(cache_env["XDG_CACHE_HOME"]) / "gradmon" / "kernels"
    assert [p.name for p in library.parent.iterdir()] == [library.name], "no temporary file is left behind"

    def no_second_compile(*args, **kwargs):
        raise AssertionError("the cached library must be reused")

    monkeypatch.setattr(B, "compile_library", no_second_compile)
    assert B.ensure_library(SOURCE, "gradmon_fused_norm", "test", environ=cache_env) == library
    other_version = B.build_key(SOURCE.read_bytes(), B.compiler_identity(B.find_compiler()), "other")
    assert other_version != library.parent.name, "another MindSpore version gets another folder"


def test_compile_error_is_reported_and_leaves_nothing(tmp_path):
    cxx = _compiler_or_skip()
    bad = tmp_path / "bad.cc"
    bad.write_text("this is not C++;\n")
    out = tmp_path / "cache" / "libbad.so"
    with pytest.raises(B.KernelBuildError, match=r"compiling bad\.cc failed"):
        B.compile_library(bad, out, cxx)
    assert list(out.parent.iterdir()) == []


_BUILD_SCRIPT = textwrap.dedent("""
    import importlib.util, sys
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("fused_build", sys.argv[1])
    B = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(B)
    print(B.ensure_library(Path(sys.argv[2]), "gradmon_fused_norm", "race"))
""")


def test_two_processes_building_at_once(tmp_path):
    _compiler_or_skip()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    cmd = [sys.executable, "-c", _BUILD_SCRIPT, str(BUILD_MODULE), str(SOURCE)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1
    lib = Path(paths.pop())
    assert [p.name for p in lib.parent.iterdir()] == [lib.name]
    assert B.call_aot(lib, "GradmonFusedNormAbi", None, None) == 2  # cells/fused_norm.py ABI_VERSION


# ------------------------------------------------------------------------------ the kernel alone
def _squared_norm(library, arrays, scale=1.0, func="GradmonSquaredNorm") -> tuple[int, np.ndarray]:
    out = np.zeros((), np.float32)
    rc = B.call_aot(library, func, [np.array(scale, np.float32), *arrays], [out])
    return rc, out


def _bf16(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bfloat16 bits by truncation, their exact float64 values)."""
    bits = (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def test_kernel_dtypes_and_edge_values(library):
    rng = np.random.default_rng(0)
    f32 = rng.normal(size=(301, 7)).astype(np.float32)
    f16 = np.array([1e-7, -6e-8, 65504.0, -3.5, 0.0, 2.0 ** -14], np.float16)  # subnormals, max, min normal
    f64 = rng.normal(size=33)
    bits, bf_vals = _bf16(rng.normal(size=50) * 1e30)  # squares beyond float32, fine in float64
    arrays = [f32, f16, f64, (bits, "bfloat16"), np.zeros((0,), np.float32), np.array([3.0], np.float16)]
    exact = sum(float(np.sum(a.astype(np.float64) ** 2)) for a in (f32, f16, f64, bf_vals)) + 9.0
    scale = float(np.float32(1e-25))  # the kernel gets the float32 scale
    rc, out = _squared_norm(library, arrays, scale=scale)
    assert rc == 0
    assert float(out) == np.float32(exact * scale * scale)
    rc, root = _squared_norm(library, arrays, scale=-scale, func="GradmonNorm")
    assert rc == 0 and float(root) == np.float32(np.sqrt(exact) * scale)


def test_kernel_half_specials(library):
    for value, check in ((np.inf, np.isinf), (np.nan, np.isnan)):
        rc, out = _squared_norm(library, [np.array([1.0, value], np.float16)])
        assert rc == 0 and check(float(out))
    rc, out = _squared_norm(library, [np.array([-65504.0], np.float16)] * 3)
    assert rc == 0 and float(out) == np.float32(3 * 65504.0 ** 2)


def test_kernel_per_tensor(library):
    arrays = [np.full((2, 2), 2.0, np.float32), np.zeros(0, np.float32), np.array([-1.5], np.float16)]
    out = np.zeros(3, np.float32)
    assert B.call_aot(library, "GradmonSquaredNorms", [np.array(2.0, np.float32), *arrays], [out]) == 0
    np.testing.assert_array_equal(out, [64.0, 0.0, 9.0])
    wrong = np.zeros(2, np.float32)  # output length must equal the number of tensors
    assert B.call_aot(library, "GradmonSquaredNorms", [np.array(1.0, np.float32), *arrays], [wrong]) != 0


def test_kernel_rejects_unsupported_dtypes(library):
    rc, _ = _squared_norm(library, [np.ones(4, np.int32)])
    assert rc != 0


def test_clip_and_scale_entry_points(library):
    grads = [np.full((3,), 4.0, np.float32), np.full((2, 2), 3.0, np.float32)]  # norm sqrt(48+36)
    norm, coef = np.zeros((), np.float32), np.zeros((), np.float32)
    args = [np.array(1.0, np.float32), np.array(2.0, np.float32), *grads]
    assert B.call_aot(library, "GradmonNormClipCoef", args, [norm, coef]) == 0
    assert float(norm) == np.float32(np.sqrt(84.0))
    np.testing.assert_allclose(float(coef), 2.0 / (np.sqrt(84.0) + 1e-6), rtol=1e-6)
    outs = [np.zeros_like(g) for g in grads]
    assert B.call_aot(library, "GradmonScale", [np.array(0.5, np.float32), *grads], outs) == 0
    for o, g in zip(outs, grads):
        np.testing.assert_array_equal(o, g * 0.5)


_THREADS_SCRIPT = textwrap.dedent("""
    import importlib.util, os, sys, time
    import numpy as np
    spec = importlib.util.spec_from_file_location("fused_build", sys.argv[1])
    B = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(B)
    lib = sys.argv[2]
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=n).astype(np.float32) for n in (1_500_000, 3, 700_001)]
    arrays.append(rng.normal(size=400_000).astype(np.float16))

    def norm():
        out = np.zeros((), np.float32)
        assert B.call_aot(lib, "GradmonSquaredNorm", [np.array(1.0, np.float32), *arrays], [out]) == 0
        return out

    first = norm()  # starts the worker threads (when more than one)
    pid = os.fork()
    if pid == 0:  # the child has no workers: the kernel must not wait for them
        os._exit(0 if norm() == first else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        raise SystemExit("the forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child got another result"
    print(first.view(np.uint32))
""")


def test_same_bits_for_any_thread_count_and_after_fork(library):
    exact_bits = set()
    for threads in ("1", "2", "5"):
        env = {**os.environ, "GRADMON_FUSED_NORM_THREADS": threads}
        proc = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(BUILD_MODULE), str(library)],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        exact_bits.add(proc.stdout.strip())
    assert len(exact_bits) == 1, exact_bits


# --------------------------------------------------------------------------- no compiler: fallback
_FALLBACK_SCRIPT = textwrap.dedent("""
    import json, warnings
    import numpy as np
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import mindspore as ms
        from mindspore import Tensor
        from gradmon.cells import fused_norm as F
        from gradmon.cells.norm_ops import global_norm
        from gradmon.cells.norm_strategies import fused_available
        first, second = F.fused_norm_available(), F.fused_norm_available()
        grads = (Tensor(np.full((3, 4), 0.5, np.float32)), Tensor(np.array([2.0], np.float16)))
        fused = fused_available()  # what norm_strategy='auto' asks: the cells then take the stock path
        value = float(global_norm(grads).asnumpy())
        try:
            F.FusedSquaredNorm()
            raised = ""
        except F.FusedNormUnavailableError as exc:
            raised = str(exc)
    ours = [str(w.message) for w in caught if issubclass(w.category, F.FusedNormFallbackWarning)]
    print(json.dumps({"available": [first, second], "fused_cell": fused, "value": value,
                      "flat": float(global_norm(grads).asnumpy()), "raised": raised, "warnings": ours,
                      "reason": F.fused_norm_unavailable_reason()}))
""")


@pytest.mark.parametrize("how", ["no compiler on PATH", "GRADMON_CXX names a missing compiler"])
def test_without_a_compiler_warns_once_and_falls_back(tmp_path, how):
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "GRADMON_CXX", "GRADMON_FUSED_NORM")}
    env["XDG_CACHE_HOME"] = str(tmp_path)  # an empty cache: nothing built before
    env["GLOG_v"] = "3"
    if how.startswith("no compiler"):
        env["PATH"] = str(tmp_path / "empty-bin")  # python runs by absolute path; no c++/g++/clang++
    else:
        env["GRADMON_CXX"] = "/nonexistent/g++"
    proc = subprocess.run([sys.executable, "-c", _FALLBACK_SCRIPT], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["available"] == [False, False] and result["fused_cell"] is False
    assert len(result["warnings"]) == 1, result["warnings"]
    assert "no C++ compiler found" in result["warnings"][0] and "flat norm" in result["warnings"][0]
    assert "no C++ compiler found" in result["raised"] and "no C++ compiler found" in result["reason"]
    assert result["value"] == result["flat"] == pytest.approx(np.sqrt(12 * 0.25 + 4.0), rel=1e-6)
    assert not (tmp_path / "gradmon").exists() or not any((tmp_path / "gradmon").rglob("*.so"))


def test_a_kernel_library_is_built_and_checked_once_and_says_why_not(tmp_path, monkeypatch):
    # KernelLibrary (what the fused-norm and detector modules share): a self-test that fails is
    # the reason, warned once; one that passes gives the path; each is decided once per process.
    _compiler_or_skip()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = []

    def failing(path: Path) -> None:
        calls.append(path)
        raise B.KernelBuildError(f"{path.name} is wrong")

    bad = B.KernelLibrary(SOURCE, "gradmon_fused_norm", failing, "the test kernel is not available",
                          UserWarning)
    with pytest.warns(UserWarning, match="gradmon: the test kernel is not available: .* is wrong"):
        assert "is wrong" in bad.unavailable_reason("test")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "is wrong" in bad.unavailable_reason("test")  # (no second build, test or warning)
    assert len(calls) == 1 and bad.path is None
    good = B.KernelLibrary(SOURCE, "gradmon_fused_norm", calls.append, "unused", UserWarning)
    assert good.unavailable_reason("test") is None
    assert good.path == calls[-1] and good.path.is_file() and len(calls) == 2
    monkeypatch.setenv("MS_CUSTOM_AOT_WHITE_LIST", str(tmp_path / "elsewhere"))
    listed = B.KernelLibrary(SOURCE, "gradmon_fused_norm", calls.append, "not listed", UserWarning)
    with pytest.warns(UserWarning, match="does not allow"):
        assert "MS_CUSTOM_AOT_WHITE_LIST" in listed.unavailable_reason("test")
