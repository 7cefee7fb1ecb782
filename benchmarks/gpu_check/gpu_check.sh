#!/usr/bin/env bash
# One prepared check of every CUDA path of autotune on one GPU, in at most 9 minutes with its
# install; writes gpu_check.json, gpu_check.md (the table for benchmarks/RESULTS.md) and logs
# to OUT_DIR.
#
#   benchmarks/gpu_check/gpu_check.sh OUT_DIR --wheels .gpu-wheels   # a CUDA GPU node, offline
#   benchmarks/gpu_check/gpu_check.sh OUT_DIR --dry-run --nvme       # CPU ranks, tiny workload (CI)
#   benchmarks/gpu_check/gpu_check.sh OUT_DIR --wheels .gpu-wheels --plan-from OLD/gpu_check.json
#                                      # the time plan re-made from an earlier run's times
#
# The wheels come from `python benchmarks/gpu_check/prepare_gpu_wheels.py .gpu-wheels`, made where
# PyPI is reachable. The interpreter is $GPU_CHECK_PYTHON, else in a dry run this
# repository's .venv, else python3: on a GPU node the one whose torch the check should use
# (the check's venv sees that interpreter's packages). Everything else is in the package
# benchmarks/gpu_check/ (`--help`), which this runs from the repository root it sits in,
# wherever the caller stands (relative paths in the arguments stay the caller's).
#
# Exit code: 0 every phase and check passed; 1 something failed; 3 nothing failed but
# something is not verified (skipped, out of time, not judged here, or beyond one GPU:
# gpu_check.md lists each with its reason); 2 a wrong call.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$(dirname "$here")")"
if [ "$#" -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: $0 OUT_DIR [--dry-run] [--wheels DIR] [options of benchmarks/gpu_check]" >&2
  exit 2
fi

python="${GPU_CHECK_PYTHON:-}"
if [ -z "$python" ]; then
  python=python3
  for arg in "$@"; do
    if [ "$arg" = "--dry-run" ] && [ -x "$repo/.venv/bin/python" ]; then
      python="$repo/.venv/bin/python"
    fi
  done
fi

# recorded in the report as the command that produced its numbers
GPU_CHECK_COMMAND="benchmarks/gpu_check/gpu_check.sh $*"
export GPU_CHECK_COMMAND
# the repository root goes on the driver's sys.path only, not into the environment of the
# commands it starts
exec "$python" -u -c '
import sys
sys.path.insert(0, sys.argv.pop(1))
sys.argv[0] = "benchmarks/gpu_check/gpu_check.sh"
from benchmarks.gpu_check import main
sys.exit(main())
' "$repo" "$@"
