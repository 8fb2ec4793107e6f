#!/usr/bin/env bash
# The GPU measurements of the kernels issue in one call of under 10 minutes on one H100
# (benchmarks/gpu_kernels.py: correctness, autotune, attention, profile, mlp, train; one JSON per
# stage in benchmarks/results/, resumable), or the CUDA kernel tests (a separate call).
#   bash benchmarks/run_gpu.sh [gpu_kernels.py options]   e.g. --stage mlp train, --force
#   bash benchmarks/run_gpu.sh tests [pytest options]     the kernel and no-sync tests on the GPU
#                                                         (e.g. -x -rf: stop at the first failure)
# A copy of the tree without .git records its commit from CEMLIB_GIT_COMMIT
# (cemlib.train.results.git_commit). The project's pytest options load nbval; -o addopts=-ra drops
# them, so a GPU image without the book's toolchain runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ "${1:-}" == "tests" ]]; then
  exec python -m pytest -q -p no:cacheprovider -o addopts=-ra tests/test_kernels_cuda.py \
    tests/test_kernels_triton.py tests/test_kernels_dispatch.py tests/test_kernels_torch.py \
    tests/test_no_sync.py "${@:2}"
fi
exec python benchmarks/gpu_kernels.py "$@"
