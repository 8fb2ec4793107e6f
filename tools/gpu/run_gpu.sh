#!/usr/bin/env bash
# One GPU call: the GPU measurements of the kernels (tools/gpu/gpu_kernels.py: correctness,
# autotune, attention, profile, mlp, train; one JSON per stage in tools/gpu/results/, resumable),
# the CUDA kernel tests, or the training campaign.
#   bash tools/gpu/run_gpu.sh [gpu_kernels.py options]   e.g. --stage mlp train, --force
#   bash tools/gpu/run_gpu.sh tests [pytest options]     the kernel, dispatch, no-sync and
#                                                        trainer (CUDA graphs) tests on the GPU,
#                                                        one line per test (e.g. -x -rf: stop at
#                                                        the first failure; default
#                                                        configurations, 8 workers: below)
#   bash tools/gpu/run_gpu.sh campaign [run options]     the training campaign's runs
#                                                        (python tools/gpu/campaign.py run ...)
#                                                        with the carried kernels installed first
# A copy of the tree without .git records its commit from CEMLIB_GIT_COMMIT
# (cemlib.train.results.git_commit). The project's pytest options load nbval; -o addopts=-ra drops
# them, so a GPU image without the book's toolchain runs the tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Triton's cache compiled for sm_90 without a GPU (tools/gpu/warm_cache.py build; ignored by git,
# carried to the device as .triton_warm): installed first, so that the kernels it holds are not
# compiled again here. Each stage's JSON says how many kernels it still compiled (triton_cache).
# A cache built from other kernel code is stale: its kernels compile again (check says so).
if [[ -f .triton_warm/triton_sm90.tar.xz ]]; then
  python tools/gpu/warm_cache.py install || echo "warm Triton cache: not installed" >&2
fi
if [[ "${1:-}" == "campaign" ]]; then
  # warm_cache.py build compiles the campaign's models with CEM layers at their gpu presets too
  exec python tools/gpu/campaign.py run "${@:2}"
fi
if [[ "${1:-}" == "tests" ]]; then
  # Compiling, on the host, is most of these tests' time on a GPU. So: each attention kernel in
  # its default configuration, not its autotune space (CEMLIB_AUTOTUNE=0; gpu_kernels.py's
  # every_config_v2 checks every configuration), the tests not marked slow, compiled beforehand
  # into the carried cache (warm_cache.py build replays these tests on CPU tensors), and, where
  # pytest-xdist is installed (the GPU image has it), CEMLIB_TEST_WORKERS processes (default 8)
  # side by side. Either is overridden by setting it, or by passing -n / -p no:xdist.
  export CEMLIB_AUTOTUNE="${CEMLIB_AUTOTUNE:-0}"
  opts=()
  if [[ " ${*:2} " != *" -n "* && " ${*:2} " != *"no:xdist"* ]] \
      && python -c "import xdist" 2>/dev/null; then
    opts+=(-n "${CEMLIB_TEST_WORKERS:-8}")
  fi
  # a test that runs longer than CEMLIB_TEST_TIMEOUT seconds (default 240) fails with its stack,
  # where pytest-timeout is installed (the GPU image has it), instead of holding the call to its end
  if [[ " ${*:2} " != *"--timeout"* ]] && python -c "import pytest_timeout" 2>/dev/null; then
    opts+=(--timeout "${CEMLIB_TEST_TIMEOUT:-240}")
  fi
  # one line per test, as it starts and as it ends, with its seconds and a failure's message, in
  # CEMLIB_TEST_LOG (default $OUT/gpu_tests.tsv on the device machine; tests/pytest_timing.py), so
  # that a call cut off by its time limit still names the slow tests
  if [[ -z "${CEMLIB_TEST_LOG:-}" && -n "${OUT:-}" ]]; then
    export CEMLIB_TEST_LOG="$OUT/gpu_tests.tsv"
  fi
  # -v: one line per test as it ends ("[gw3] [ 45%] FAILED tests/..."), so a call cut off by its
  # time limit still names its failures (pytest names them only in its closing summary).
  # The trainer's test first: it compiles with Inductor, the longest test, and so starts at once.
  count="import sys; sys.path.insert(0, 'tools/gpu'); import warm_cache; print(warm_cache.compiled())"
  before=$(python -c "$count" 2>/dev/null || echo 0)
  status=0
  python -m pytest -v -p no:cacheprovider -o addopts=-ra -p pytest_timing -m "not slow" \
    ${opts[@]+"${opts[@]}"} \
    tests/train/test_train_cuda.py tests/kernels/test_kernels_cuda.py \
    tests/kernels/test_kernels_attention.py tests/kernels/test_kernels_gated_mlp.py \
    tests/kernels/test_kernels_dplr.py tests/kernels/test_kernels_dispatch.py \
    tests/kernels/test_kernels_attention_torch.py tests/layers/test_no_sync.py \
    tests/kernels/test_kernels_runtime.py "${@:2}" || status=$?
  echo "Triton kernels compiled by the tests: $(( $(python -c "$count" 2>/dev/null || echo 0) - before ))"
  exit "$status"
fi
exec python tools/gpu/gpu_kernels.py "$@"
