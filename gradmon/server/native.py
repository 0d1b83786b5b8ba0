"""The compiled line scanner (``csrc/scanlines.c``), built at first use into the per-user cache.

Indexing a big run log in Python is dominated by making a dict per line and then taking each
key's values out of those dicts again; the scanner takes each key's values in one pass in C, for
the lines it can decide (flat records of printable ASCII: what gradmon's writer produces), and
makes no dict (``steprecords.py`` makes a record's when it is read). It is never required: without
a C compiler or Python's headers, or when ``GRADMON_NATIVE=0``, or when its self-test fails,
``parse.py`` runs the same rules in Python (its reference, which the tests compare it with).

The module is compiled with the system C compiler into
``$XDG_CACHE_HOME/gradmon/native/<key>/`` (default ``~/.cache``), where ``<key>`` hashes the
source, the flags, the compiler's identity and the Python ABI: nothing is written into
site-packages, and two processes compiling at once each write a temporary file and rename it into
place. Environment: ``GRADMON_CC`` (else ``CC``, else ``cc``, ``gcc``, ``clang`` on ``PATH``).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import math
import os
import platform
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from gradmon.logformat.schema import TEXT_KEYS

__all__ = ["ENV_DISABLE", "scanner", "unavailable_reason"]

log = logging.getLogger("gradmon.server")

ENV_DISABLE = "GRADMON_NATIVE"  # "0": never build or use the scanner
ENV_CC = "GRADMON_CC"
SOURCE = Path(__file__).with_name("csrc") / "scanlines.c"
MODULE = "_scanlines"
CC_FLAGS = ("-O2", "-shared", "-fPIC", "-fno-strict-aliasing")
COMPILE_TIMEOUT_S = 120
BUILD_FORMAT = "1"  # bumped when this module changes how it builds (part of the cache key)
# The powers of ten whose 128-bit mantissas the scanner's float reading takes (POWERS_OF_TEN): the
# decimal exponents of a 19-digit significand whose value a double holds, neither subnormal nor
# infinite (the others are left to CPython's parser).
POW10_MIN, POW10_MAX = -342, 308

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "module" or "reason", once decided


class NativeBuildError(RuntimeError):
    """The scanner cannot be built or loaded here; the message says why."""


def _compiler(environ: dict) -> str:
    named = environ.get(ENV_CC) or environ.get("CC")
    for name in [named] if named else ["cc", "gcc", "clang"]:
        found = shutil.which(name.split()[0], path=environ.get("PATH"))
        if found:
            return found
    raise NativeBuildError(f"no C compiler found ({ENV_CC}/CC={named!r})" if named else
                           "no C compiler found (cc, gcc or clang on PATH)")


def _identity(cc: str) -> str:
    """The compiler's real path, size and modification time: part of the cache key (a changed
    compiler gets a fresh build; no process started on every server start to ask its version)."""
    real = os.path.realpath(cc)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise NativeBuildError(f"the C compiler {cc} cannot be read: {exc}") from exc
    return f"{real} {st.st_size} {st.st_mtime_ns}"


def _cache_root(environ: dict) -> Path:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradmon" / "native"


def build(environ: dict | None = None) -> Path:
    """The compiled module's path in the cache, compiling it first when it is not there."""
    env = dict(os.environ if environ is None else environ)
    include = sysconfig.get_paths().get("include") or ""
    if not os.path.isfile(os.path.join(include, "Python.h")):
        raise NativeBuildError(f"Python's C headers are not installed (no Python.h in {include!r})")
    cc = _compiler(env)
    source = SOURCE.read_bytes()
    flags = (*CC_FLAGS, f"-I{include}")
    h = hashlib.sha256()
    for part in (BUILD_FORMAT, platform.machine(), sys.version, sysconfig.get_config_var("SOABI") or "",
                 _identity(cc), " ".join(flags)):
        h.update(part.encode())
        h.update(b"\0")
    h.update(source)
    header = powers_of_ten_header()
    h.update(header.encode())
    out = _cache_root(env) / h.hexdigest()[:20] / (MODULE + importlib.machinery.EXTENSION_SUFFIXES[0])
    if out.is_file():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The build's own directory: the generated header, then the module until renamed.
        work = tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as exc:  # an unwritable cache, a full disk
        raise NativeBuildError(f"cannot write the cache {out.parent}: {exc}") from exc
    try:
        try:
            Path(work, "powers_of_ten.h").write_text(header, encoding="ascii")
        except OSError as exc:
            raise NativeBuildError(f"cannot write the cache {out.parent}: {exc}") from exc
        tmp = os.path.join(work, out.name)
        cmd = [cc, *flags, f"-I{work}", "-o", tmp, str(SOURCE)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NativeBuildError(f"compiling {SOURCE.name} failed: {exc}") from exc
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise NativeBuildError(f"compiling {SOURCE.name} failed ({' '.join(cmd)}):\n{tail}")
        os.replace(tmp, out)  # atomic: another process sees no module or the whole one
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def power_of_ten_mantissa(q: int) -> int:
    """The 128 leading bits of 10^q (an int in [2^127, 2^128)), rounded down: what the
    Eisel-Lemire algorithm multiplies a significand by (its exponent is implied by q)."""
    if q >= 0:
        v = 10**q
        n = v.bit_length()
        return v << (128 - n) if n <= 128 else v >> (n - 128)
    d = 10**-q
    v = (1 << (128 + d.bit_length())) // d  # (129 bits: 2^(b-1) <= d < 2^b)
    return v >> (v.bit_length() - 128)


def powers_of_ten_header() -> str:
    """``powers_of_ten.h``, which the scanner includes: POW10_MIN, POW10_MAX and the table of
    :func:`power_of_ten_mantissa` as ``{high, low}`` 64-bit halves, from Python's exact integers."""
    mask = (1 << 64) - 1
    rows = []
    for q in range(POW10_MIN, POW10_MAX + 1):
        v = power_of_ten_mantissa(q)
        rows.append(f"    {{0x{v >> 64:016X}ULL, 0x{v & mask:016X}ULL}}, /* 1e{q} */")
    return (f"/* Generated by gradmon/server/native.py at build time. */\n#define POW10_MIN ({POW10_MIN})\n"
            f"#define POW10_MAX ({POW10_MAX})\nstatic const uint64_t POWERS_OF_TEN[][2] = {{\n"
            + "\n".join(rows) + "\n};\n")


def _load(path: Path) -> ModuleType:
    name = f"gradmon.server.{MODULE}"
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise NativeBuildError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.text_keys(TEXT_KEYS)  # (their "NaN" stays text: decode_record's rule, jsonl._decode_nonfinite)
    return module


# A batch whose answer is known (the self-test): a step record, spaced, another kind, undecided lines.
_SELF_TEST = [b'{"type":"step","step":1,"loss":0.5,"x":"a","f":true,"n":null}',
              b'{ "type" : "step" , "step" : -2 , "loss" : 1e-3 }', b'{"type":"event","step":3}',
              b'{"type":"step","step":4,"v":{"a":1}}', None]


def _self_test(module: ModuleType) -> None:
    got = module.scan_steps(list(_SELF_TEST))
    records = [{"type": "step", "step": 1, "loss": 0.5, "x": "a", "f": True, "n": None},
               {"type": "step", "step": -2, "loss": 0.001}]
    missing = struct.pack("<Q", module.MISSING_BITS)
    want = ([(0, ("type", "step", "loss", "x", "f", "n")), (1, ("type", "step", "loss"))], [3, 4],
            {"type": ["step", "step"], "step": [1, -2], "loss": None, "x": ["a", None],
             "f": [True, None], "n": [None, None]},
            {"type": 4, "step": 1, "loss": 2, "x": 4 | 16, "f": 8 | 16, "n": 16},
            {"type": missing * 2, "step": struct.pack("<2d", 1, -2), "loss": struct.pack("<2d", 0.5, 0.001),
             "x": missing * 2, "f": missing * 2, "n": missing * 2}, 2, [2, 3, 4])
    if got != want:
        raise NativeBuildError(f"the compiled scanner's self-test failed: {got!r}")
    # Numbers beyond Clinger's exact path (Eisel and Lemire's): as float() reads them, bit for bit.
    tokens = (b"2.3572208881378174", b"1796685804.0480554", b"1e23", b"-4.9406564584124654e-300")
    line = b'{"type":"step",' + b",".join(b'"k%d":%s' % (i, t) for i, t in enumerate(tokens)) + b"}"
    floats = module.scan_steps([line])[4]
    if [floats.get(f"k{i}") for i in range(len(tokens))] != [struct.pack("<d", float(t)) for t in tokens]:
        raise NativeBuildError(f"the compiled number reading's self-test failed: {floats!r}")
    # The strings decode_record reads as non-finite floats, but not under a text key (undecided).
    got = module.scan_steps([b'{"type":"step","step":1,"a":"NaN","b":"Infinity","c":"-Infinity","d":"nan"}',
                             b'{"type":"step","step":2,"message":"NaN"}'])
    want_nan = {"a": struct.pack("<d", math.nan), "b": struct.pack("<d", math.inf),
                "c": struct.pack("<d", -math.inf), "d": missing}
    got = (got[1], {k: got[4][k] for k in want_nan}, got[3]["a"], got[3]["d"], got[5])
    if got != ([1], want_nan, 2 | 32, 4, 1):
        raise NativeBuildError(f"the compiled non-finite strings' self-test failed: {got!r}")
    got = module.first_nonfinite([None, missing + struct.pack("<3d", 1, math.inf, math.nan)], 0, 4), \
        module.first_nonfinite([struct.pack("<3d", math.nan, -math.inf, 1)], 1, 3), \
        module.first_nonfinite([struct.pack("<2d", math.nan, 1)], 1, 2)
    if got != (2, 1, -1):
        raise NativeBuildError(f"the compiled first non-finite row's self-test failed: {got!r}")
    keys = want[0][0][1]
    cols = [want[2][k] if k != "loss" else [0.5, 0.001] for k in keys]  # (loss: made when read)
    got = (module.build_records(keys, cols, 0, 1), module.build_records(keys[:2], cols[:2], 0, 2))
    if got != ([records[0]], [{"type": "step", "step": 1}, {"type": "step", "step": -2}]):
        raise NativeBuildError(f"the compiled record builder's self-test failed: {got!r}")
    got = module.scan_records(list(_SELF_TEST))
    if got != [*records, {"type": "event", "step": 3}, None, None]:
        raise NativeBuildError(f"the compiled record scanner's self-test failed: {got!r}")
    nan = float("nan")
    got = (module.m4_indices(struct.pack("<10d", 1, nan, 3, 0, 5, 2, 2, 9, -1, 4), 2),
           module.m4_indices(missing + struct.pack("<9d", *range(9)), 2))
    if got != ([0, 1, 3, 4, 5, 7, 8, 9], None):
        raise NativeBuildError(f"the compiled downsampling's self-test failed: {got!r}")
    # Summaries' points (levelfiles.FIELD records): one with first == min, one empty, one with a NaN.
    records = b"".join(struct.pack("<qqdqdqdqd", *f) for f in (
        (3, 10, 1.0, 12, 2.0, 10, 1.0, 11, 5.0), (0,) * 9, (1, 20, nan, 20, nan, 20, nan, 20, nan)))
    got = (module.field_points(records, 7, [7, 8]), module.field_points(records, 7, [9]))
    if got != ([(10, 1.0), (11, 5.0), (12, 2.0)], None):
        raise NativeBuildError(f"the compiled summary points' self-test failed: {got!r}")
    # Lines after a block's first: an empty one, one ending in CR, a partial one; one too long.
    got = (module.split_lines(b'x\n\nab\r\ncd\ne', 2, 100, 8), module.split_lines(b'x\nabcdefghi\n', 2, 0, 8))
    if got != (([(103, b""), (107, b"ab"), (110, b"cd")], 10), None):
        raise NativeBuildError(f"the compiled line splitter's self-test failed: {got!r}")
    # Medians: odd and even counts; a zero median, an int and a NaN are left to sorted().
    got = [module.median(v) for v in ([3.0, -1.0, 2.0], [4.0, 1.0, 2.0, 3.0], [0.0, -0.0, 1.0], [1, 2.0],
                                      [nan], [])]
    if got != [2.0, 2.5, None, None, None, None]:
        raise NativeBuildError(f"the compiled median's self-test failed: {got!r}")
    # Order statistics of two sequences together; a zero, an int, a NaN and k out of range are left.
    got = [module.order_statistic(k, a, b) for k, a, b in (
        (0, [3.0, -1.0], [2.0]), (2, [3.0], [-1.0, 2.0]), (1, [1.0, 1.0], [1.0]), (1, [0.0, -0.0], [1.0]),
        (0, [1], [2.0]), (0, [nan], []), (3, [1.0, 2.0], [3.0]), (-1, [1.0], []))]
    if got != [-1.0, 3.0, 1.0, None, None, None, None, None]:
        raise NativeBuildError(f"the compiled order statistic's self-test failed: {got!r}")
    # Running medians of a window of 3 as values come: at cuts 0, 1 and 3; a zero median is left.
    got = (module.window_medians([1.0, 5.0], [3.0, 9.0, 7.0, 2.0], [0, 1, 3], 3),
           module.window_medians([-1.0, 0.0], [1.0], [1], 3), module.window_medians([], [1.0], [0], 3))
    if got != ([3.0, 3.0, 7.0], None, None):
        raise NativeBuildError(f"the compiled window medians' self-test failed: {got!r}")
    # Two buckets of two rows, column-wise: one with a missing value, one without a number; merged.
    got = module.bucket_columns(["a", "b"], [missing + struct.pack("<3d", 2, -1, 3), None], [5, 6, 7, 8],
                                0, 2, 2)
    want = [struct.pack("<2I", 1, 2), struct.pack("<2q", 6, 7), struct.pack("<2d", 2, -1),
            struct.pack("<2q", 6, 8), struct.pack("<2d", 2, 3), struct.pack("<2q", 6, 7),
            struct.pack("<2d", 2, -1), struct.pack("<2q", 6, 8), struct.pack("<2d", 2, 3)]
    base = [struct.pack("<2q", 5, 7), struct.pack("<2q", 6, 8), struct.pack("<2I", 2, 2),
            struct.pack("<2q", 0, 9)]
    merged = module.merge_groups(base, [want], 0, 1, 2)
    if got != [want, None] or merged != (
            [struct.pack("<q", 5), struct.pack("<q", 8), struct.pack("<I", 4), struct.pack("<q", 0)],
            [[struct.pack("<I", 3), struct.pack("<q", 6), struct.pack("<d", 2), struct.pack("<q", 8),
              struct.pack("<d", 3), struct.pack("<q", 7), struct.pack("<d", -1), struct.pack("<q", 8),
              struct.pack("<d", 3)]]):
        raise NativeBuildError(f"the compiled bucket columns' self-test failed: {got!r} {merged!r}")
    # Chunk maxima (the first of equal values: -0.0 before 0.0), and a strict increase.
    got = (module.chunk_maxima(struct.pack("<6d", 9, 1, 2, -0.0, 0.0, 5), 1, 5, 2),
           [module.increasing(struct.pack(f"<{len(v)}d", *v)) for v in ([1, 2, 5], [1, 1], [nan, 2], [])])
    if repr(got) != repr(([2.0, -0.0], [True, False, False, True])):
        raise NativeBuildError(f"the compiled chunk maxima's self-test failed: {got!r}")
    # Two rows of a level file's record (an 'I' count widened, an int64, a double; native order).
    got = module.rows_of_columns([struct.pack("=2I", 3, 2**32 - 1), struct.pack("=2q", -5, 7),
                                  struct.pack("=2d", -0.0, 2.5)], (4, 8, 8), 2)
    if got != struct.pack("=qqdqqd", 3, -5, -0.0, 2**32 - 1, 7, 2.5):
        raise NativeBuildError(f"the compiled row packing's self-test failed: {got!r}")
    # Where a slice's step records fill buckets of 2, one record already in the open one.
    step, other = b'{"type":"step","step":1}', b'{"type":"system"}'
    got = module.bucket_cut(list(enumerate([step, other, step, step, other, step, None])), 1, 2)
    if got != 4:
        raise NativeBuildError(f"the compiled bucket cut's self-test failed: {got!r}")


def scanner() -> ModuleType | None:
    """The compiled scanner module (built, loaded and self-tested the first time), or ``None``
    when it cannot be used here (the reason is warned once, unless ``GRADMON_NATIVE=0`` asked for
    that: :func:`unavailable_reason`)."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" not in _state:
            module = None
            if os.environ.get(ENV_DISABLE, "1").strip() == "0":
                _state["reason"] = f"{ENV_DISABLE}=0"
            else:
                try:
                    module = _load(build())
                    _self_test(module)
                except Exception as exc:  # (a build or a module that fails its self-test in any way)
                    module = None
                    reason = str(exc)
                    if not isinstance(exc, (NativeBuildError, OSError)):
                        reason = f"{type(exc).__name__}: {reason}"
                    _state["reason"] = reason
                    log.warning("indexing without the compiled line scanner (the Python path, about "
                                "three times as slow on big logs): %s", reason)
            _state["module"] = module
    return _state["module"]


def unavailable_reason() -> str | None:
    """Why the scanner is not used (``None``: it is, or it was not asked for yet)."""
    scanner()
    return _state.get("reason")
