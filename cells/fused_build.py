"""Compile gradmon's C++ kernels at first use into a per-user cache (no MindSpore import here).

The library is built with the system C++ compiler into
``$XDG_CACHE_HOME/gradmon/kernels/<key>/`` (default ``~/.cache/gradmon/kernels/<key>/``), where
``<key>`` hashes the source, the compile flags, the compiler's identity, the MindSpore version and the
machine: a changed source or a new compiler gets a fresh directory, and nothing is ever written into
site-packages. Two processes compiling at once are safe: each compiles to its own temporary file and
renames it into place atomically, so a reader sees either no library or a complete one.

Environment:

- ``GRADMON_CXX``: the compiler to use (a name on ``PATH`` or a path); else ``CXX``, else the first of
  ``c++``, ``g++``, ``clang++`` on ``PATH``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_CXX = "GRADMON_CXX"
# -fopenmp-simd: the `omp simd reduction` pragmas vectorise the float64 accumulation without
# -ffast-math and without an OpenMP runtime. -O3 alone would not reorder a floating-point sum.
CXX_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp-simd", "-fno-math-errno", "-pthread")
COMPILE_TIMEOUT_S = 300
# Bumped when this module changes how it builds (part of the cache key).
BUILD_FORMAT = "1"


class KernelBuildError(RuntimeError):
    """The kernel library could not be built or found; the message says why and what to do."""


def find_compiler(environ: dict | None = None) -> str:
    """Absolute path of the C++ compiler to use; :class:`KernelBuildError` when there is none."""
    env = os.environ if environ is None else environ
    named = env.get(ENV_CXX) or env.get("CXX")
    candidates = [named] if named else ["c++", "g++", "clang++"]
    for name in candidates:
        # CXX may carry flags ("ccache g++" is not supported: the first word must be the compiler).
        found = shutil.which(name.split()[0], path=env.get("PATH"))
        if found:
            return found
    source = f"{ENV_CXX}/CXX={named!r}" if named else "c++, g++ or clang++ on PATH"
    raise KernelBuildError(f"no C++ compiler found ({source})")


def compiler_identity(cxx: str) -> str:
    """The compiler's path and the first line of ``--version``: part of the cache key."""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"the C++ compiler {cxx} does not run: {exc}") from exc
    first = (out.stdout or out.stderr).strip().splitlines()
    if out.returncode != 0 or not first:
        raise KernelBuildError(f"the C++ compiler {cxx} does not run (`--version` exited {out.returncode})")
    return f"{os.path.realpath(cxx)} {first[0]}"


def cache_root(environ: dict | None = None) -> Path:
    """``$XDG_CACHE_HOME/gradmon/kernels`` (``~/.cache`` when unset): per user, outside site-packages."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradmon" / "kernels"


def build_key(source: bytes, compiler: str, ms_version: str, flags: tuple[str, ...] = CXX_FLAGS) -> str:
    """Hash of everything the compiled library depends on (pure function)."""
    h = hashlib.sha256()
    for part in (BUILD_FORMAT, platform.machine(), ms_version, compiler, " ".join(flags)):
        h.update(part.encode())
        h.update(b"\0")
    h.update(source)
    return h.hexdigest()[:20]


def compile_library(source: Path, output: Path, cxx: str, flags: tuple[str, ...] = CXX_FLAGS) -> None:
    """Compile ``source`` into the shared library ``output`` via a temporary file and an atomic rename."""
    output.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    os.close(fd)
    try:
        cmd = [cxx, *flags, "-o", tmp, str(source)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KernelBuildError(f"compiling {source.name} failed: {exc}") from exc
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise KernelBuildError(f"compiling {source.name} failed ({' '.join(cmd)}):\n{tail}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, output)  # atomic: a concurrent reader sees the old state or the whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ensure_library(source: Path, name: str, ms_version: str, environ: dict | None = None,
                   flags: tuple[str, ...] = CXX_FLAGS) -> Path:
    """Path of the compiled ``source`` in the cache, compiling it first (with ``flags``) when it is not
    there yet."""
    cxx = find_compiler(environ)
    key = build_key(source.read_bytes(), compiler_identity(cxx), ms_version, flags)
    library = cache_root(environ) / key / f"lib{name}.so"
    if not library.is_file():
        try:
            compile_library(source, library, cxx, flags)
        except OSError as exc:  # an unwritable cache directory, a full disk
            raise KernelBuildError(f"cannot write the kernel cache {library.parent}: {exc}") from exc
    return library


def check_white_list(library: Path, environ: dict | None = None) -> None:
    """:class:`KernelBuildError` when ``MS_CUSTOM_AOT_WHITE_LIST`` is set and does not hold ``library``
    (MindSpore would then refuse to load it)."""
    env = os.environ if environ is None else environ
    allowed = env.get("MS_CUSTOM_AOT_WHITE_LIST")
    if allowed and os.path.commonpath([os.path.realpath(library), os.path.realpath(allowed)]) != \
            os.path.realpath(allowed):
        raise KernelBuildError(f"MS_CUSTOM_AOT_WHITE_LIST={allowed} does not allow {library}")


class KernelLibrary:
    """One kernel library of a process: built (or found in the cache), self-tested and checked
    against MindSpore's aot white list once, on first use; then its path, or why it cannot be used
    (warned once, with ``warning``, saying ``fallback``: what runs instead). The device target is
    the caller's to check (this module imports no MindSpore)."""

    def __init__(self, source: Path, name: str, self_test: Callable[[Path], None], fallback: str,
                 warning: type[Warning], flags: tuple[str, ...] = CXX_FLAGS) -> None:
        self.source, self.name, self.flags = source, name, flags
        self._self_test, self._fallback, self._warning = self_test, fallback, warning
        self._lock = threading.Lock()
        self._library: Path | None = None
        self._reason: str | None = None

    def unavailable_reason(self, ms_version: str) -> str | None:
        """Why the library cannot be used (``None``: it can); builds and checks it the first time."""
        with self._lock:
            if self._library is None and self._reason is None:
                try:
                    library = ensure_library(self.source, self.name, ms_version, flags=self.flags)
                    self._self_test(library)
                    check_white_list(library)
                    self._library = library
                except (KernelBuildError, OSError) as exc:
                    self._reason = str(exc)
                    # (stacklevel 3: whoever asked the module's *_unavailable_reason, as before)
                    warnings.warn(f"gradmon: {self._fallback}: {exc}", self._warning, stacklevel=3)
        return self._reason

    @property
    def path(self) -> Path | None:
        """The library, once :meth:`unavailable_reason` found it usable."""
        return self._library


_DLLS: dict[str, object] = {}


def element_type(dtype: Any) -> Any:
    """A MindSpore dtype as the graph's infer functions see it: a tensor type's element type, or the
    dtype itself (the kernels' ``infer_dtype`` checks compare against ``ms.float32`` etc.)."""
    return dtype.element_type() if hasattr(dtype, "element_type") else dtype


def call_aot(library: Path, func: str, inputs: list | None, outputs: list | None) -> int:
    """Call an aot kernel of ``library`` on numpy arrays, as MindSpore's CPU runtime does (for self-tests).

    ``inputs``/``outputs`` are C-contiguous numpy arrays (a ``(uint16 array, "bfloat16")`` pair for
    bfloat16); the kernel writes into ``outputs``. With ``inputs=None`` the function is called without
    arguments (e.g. an ABI query). Returns the kernel's int result.
    """
    import ctypes


    dll = _DLLS.get(str(library))
    if dll is None:
        dll = _DLLS[str(library)] = ctypes.CDLL(str(library))
    fn = getattr(dll, func)
    fn.restype = ctypes.c_int
    if inputs is None:
        return int(fn())
    arrays, names = [], []
    for item in [*inputs, *(outputs or [])]:
        array, name = item if isinstance(item, tuple) else (item, item.dtype.name)
        if not array.flags.c_contiguous:
            raise ValueError("call_aot needs C-contiguous arrays")
        arrays.append(array)
        names.append(name)
    n = len(arrays)
    params = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
    ndims = (ctypes.c_int * n)(*[a.ndim for a in arrays])
    shape_arrays = [(ctypes.c_int64 * max(1, a.ndim))(*a.shape) for a in arrays]
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64))
                                                      for s in shape_arrays])
    dtypes = (ctypes.c_char_p * n)(*[name.encode() for name in names])
    return int(fn(ctypes.c_int(n), params, ndims, shapes, dtypes, None, None))
