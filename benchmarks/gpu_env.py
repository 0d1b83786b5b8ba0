"""A CUDA 11 user space for MindSpore's GPU plugin from pip wheels alone (used by ``gpu_setup.sh``).

The MindSpore wheel carries its GPU plugins (``mindspore/lib/plugin/libmindspore_gpu.so.11.{1,6}``)
built against CUDA 11; they link ``libcudart.so.11.0``, ``libcublas.so.11``, ``libcudnn.so.8``,
``libcufft.so.10``, ``libcurand.so.10``, ``libcusolver.so.11``, ``libcusparse.so.11`` and
``libnvrtc.so.11.2`` (11.6 plugin; read with ``readelf -d``), plus the driver's ``libcuda.so.1``.
NVIDIA publishes each of those as a ``nvidia-*-cu11`` wheel that unpacks to
``site-packages/nvidia/<name>/lib/``. No system CUDA is needed: ``LD_LIBRARY_PATH`` names those
folders (and the plugin's own ``gpu11.6`` folder, which holds NCCL and AKG).

``python -m benchmarks.gpu_env`` reports what resolves; ``--requirements`` prints the pip
requirements, ``--exports`` a shell ``export LD_LIBRARY_PATH=...`` line, ``--check`` exits 1 unless
every CUDA library the plugin needs resolves (the driver's may be missing only with
``--no-driver-ok``). Pure functions (``parse_ldd``, ``nvidia_lib_dirs``) are tested on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import site
import subprocess
import sys
from pathlib import Path

# pip requirement -> the sonames it provides to the 11.6 plugin. cuDNN stays on 8.x (9.x is libcudnn.so.9).
CUDA11_WHEELS: dict[str, tuple[str, ...]] = {
    "nvidia-cuda-runtime-cu11==11.8.89": ("libcudart.so.11.0",),
    "nvidia-cublas-cu11==11.11.3.6": ("libcublas.so.11", "libcublasLt.so.11"),
    "nvidia-cudnn-cu11==8.9.6.50": ("libcudnn.so.8",),
    "nvidia-cufft-cu11==10.9.0.58": ("libcufft.so.10",),
    "nvidia-curand-cu11==10.3.0.86": ("libcurand.so.10",),
    "nvidia-cusolver-cu11==11.4.1.48": ("libcusolver.so.11",),
    "nvidia-cusparse-cu11==11.7.5.86": ("libcusparse.so.11",),
    "nvidia-cuda-nvrtc-cu11==11.8.89": ("libnvrtc.so.11.2",),
}
DRIVER_LIBS = ("libcuda.so.1",)  # the NVIDIA driver's, from the host; never a pip wheel
PLUGIN_PATTERN = re.compile(r"libmindspore_gpu\.so\.(\d+)\.(\d+)$")


def parse_ldd(text: str) -> dict[str, str | None]:
    """``ldd`` output -> {soname: resolved path, or None when "not found"} (pure)."""
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        name, arrow, rest = line.strip().partition("=>")
        if not arrow:
            continue
        rest = rest.strip()
        out[name.strip()] = None if rest.startswith("not found") else rest.split(" (")[0].strip() or None
    return out


def nvidia_lib_dirs(site_dirs: list[Path]) -> list[Path]:
    """Every ``<site>/nvidia/<package>/lib`` folder holding a shared library, sorted (pure I/O)."""
    found = []
    for base in site_dirs:
        root = Path(base) / "nvidia"
        if root.is_dir():
            found.extend(d / "lib" for d in sorted(root.iterdir()) if any((d / "lib").glob("*.so*")))
    return found


def gpu_plugins(mindspore_dir: Path) -> list[Path]:
    """MindSpore's GPU plugins, newest CUDA first."""
    plugins = [p for p in (mindspore_dir / "lib" / "plugin").glob("libmindspore_gpu.so.*")
               if PLUGIN_PATTERN.search(p.name)]
    return sorted(plugins, key=lambda p: tuple(int(x) for x in PLUGIN_PATTERN.search(p.name).groups()),
                  reverse=True)


def site_dirs() -> list[Path]:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(d) for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def resolve(mindspore_dir: Path | None = None, sites: list[Path] | None = None) -> dict:
    """Which CUDA libraries the newest GPU plugin needs and where each resolves with the wheels' folders."""
    if mindspore_dir is None:
        import importlib.util

        spec = importlib.util.find_spec("mindspore")
        if spec is None or spec.origin is None:
            return {"error": "mindspore is not installed in this Python"}
        mindspore_dir = Path(spec.origin).parent
    plugins = gpu_plugins(mindspore_dir)
    if not plugins:
        return {"error": f"no libmindspore_gpu.so.* in {mindspore_dir}/lib/plugin (a CPU-only build?)"}
    plugin = plugins[0]
    major, minor = PLUGIN_PATTERN.search(plugin.name).groups()
    dirs = [*nvidia_lib_dirs(sites if sites is not None else site_dirs()),
            mindspore_dir / "lib" / "plugin" / f"gpu{major}.{minor}"]
    ld_path = [str(d) for d in dirs if d.is_dir()]
    inherited = os.environ.get("LD_LIBRARY_PATH")
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join([*ld_path, *([inherited] if inherited else [])])}
    try:
        proc = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, env=env, timeout=60,
                              check=False)
        resolved = parse_ldd(proc.stdout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"ldd failed on {plugin}: {exc}"}
    cuda = [name for names in CUDA11_WHEELS.values() for name in names]
    needed = {name: resolved.get(name, "(indirect, or not needed)") for name in (*cuda, *DRIVER_LIBS)}
    return {
        "plugin": str(plugin),
        "ld_library_path": ld_path,
        "needed": needed,
        "missing_cuda": [n for n in cuda if n in resolved and resolved[n] is None],
        "missing_driver": [n for n in DRIVER_LIBS if resolved.get(n, "") is None],
        "missing_other": sorted(n for n, p in resolved.items() if p is None and n not in needed),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requirements", action="store_true", help="print the pip requirements, one a line")
    p.add_argument("--exports", action="store_true", help="print `export LD_LIBRARY_PATH=...`")
    p.add_argument("--check", action="store_true", help="exit 1 unless every needed library resolves")
    p.add_argument("--no-driver-ok", action="store_true", help="with --check: a missing libcuda.so.1 is fine")
    p.add_argument("--json", action="store_true", help="print the resolution as JSON")
    a = p.parse_args(argv)
    if a.requirements:
        print("\n".join(CUDA11_WHEELS))
        return 0
    info = resolve()
    if "error" in info:
        print(f"gpu_env: {info['error']}", file=sys.stderr)
        return 1
    if a.exports:
        joined = ":".join(info["ld_library_path"])
        print(f"export LD_LIBRARY_PATH={shlex.quote(joined)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
        return 0
    if a.json:
        print(json.dumps(info, indent=1))
    else:
        print(f"plugin: {info['plugin']}")
        for name, path in info["needed"].items():
            print(f"  {name:22s} {path or 'NOT FOUND'}")
        for key in ("missing_cuda", "missing_driver", "missing_other"):
            if info[key]:
                print(f"{key}: {', '.join(info[key])}")
    missing = info["missing_cuda"] + info["missing_other"]
    if not a.no_driver_ok:
        missing += info["missing_driver"]
    return 1 if a.check and missing else 0


if __name__ == "__main__":
    sys.exit(main())
