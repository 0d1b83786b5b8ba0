#!/usr/bin/env bash
# Prepare a GPU environment for gradmon from pip packages only, check that MindSpore runs on the GPU,
# then run the benchmark suite there. No system CUDA is assumed: the CUDA 11 user-space libraries that
# MindSpore's GPU plugin links come from NVIDIA's nvidia-*-cu11 wheels (benchmarks/gpu_env.py lists them),
# and LD_LIBRARY_PATH points at them. The host needs an NVIDIA driver (libcuda.so.1) that runs CUDA 11.
#
#   benchmarks/gpu_setup.sh [--dry-run] [--venv DIR] [--wheelhouse DIR] [--check-only] [--write-results]
#                           [-- ARGS for `python -m benchmarks.run`]
#
#   --dry-run        install nothing: print the plan and resolve the libraries in the current Python
#   --venv DIR       the virtual environment to create/use (default .venv-gpu)
#   --wheelhouse DIR install offline from wheels saved there with `pip download` (for a GPU box without
#                    network: run `pip download -d DIR mindspore==2.10.0 "numpy<2" ... <requirements>`
#                    on a machine with network and copy DIR over)
#   --check-only     stop after the GPU check (no benchmark run)
#   --write-results  copy the suite's Markdown to benchmarks/RESULTS-GPU.md
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0 CHECK_ONLY=0 WRITE=0 VENV=.venv-gpu WHEELHOUSE=""
BENCH_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --venv) VENV="$2"; shift ;;
    --wheelhouse) WHEELHOUSE="$2"; shift ;;
    --check-only) CHECK_ONLY=1 ;;
    --write-results) WRITE=1 ;;
    --) shift; BENCH_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_setup.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

PYTHON=${PYTHON:-python3}
PIP_SOURCE=()
if [ -n "$WHEELHOUSE" ]; then PIP_SOURCE=(--no-index --find-links "$WHEELHOUSE"); fi
mapfile -t CUDA_REQS < <("$PYTHON" -m benchmarks.gpu_env --requirements)

if [ "$DRY_RUN" = 1 ]; then
  echo "would create $VENV and run:"
  echo "  $VENV/bin/python -m pip install ${PIP_SOURCE[*]} -e .[demo] ${CUDA_REQS[*]}"
  echo "  eval \"\$($VENV/bin/python -m benchmarks.gpu_env --exports)\""
  echo "  $VENV/bin/python -m benchmarks.gpu_env --check"
  echo "  $VENV/bin/python -m benchmarks.gpu_check --device GPU"
  [ "$CHECK_ONLY" = 1 ] || echo "  $VENV/bin/python -m benchmarks.run --device GPU ${BENCH_ARGS[*]}"
  echo "libraries as they resolve now in $PYTHON:"
  "$PYTHON" -m benchmarks.gpu_env || echo "(not resolved: see the message above)"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q "${PIP_SOURCE[@]}" -e ".[demo]" "${CUDA_REQS[@]}"
eval "$("$PY" -m benchmarks.gpu_env --exports)"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
"$PY" -m benchmarks.gpu_env --check
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
"$PY" -m benchmarks.gpu_check --device GPU
[ "$CHECK_ONLY" = 1 ] && exit 0

OUT_DIR=benchmarks/out/gpu
"$PY" -m benchmarks.run --device GPU --out-dir "$OUT_DIR" "${BENCH_ARGS[@]}"
if [ "$WRITE" = 1 ]; then
  latest=$(ls -t "$OUT_DIR"/results-*.md | head -1)
  cp "$latest" benchmarks/RESULTS-GPU.md
  echo "wrote benchmarks/RESULTS-GPU.md from $latest"
fi
