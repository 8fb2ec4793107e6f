#!/usr/bin/env bash
# Every GPU check the kernels and the trainer still need, in one command (one CUDA GPU):
#   1. the kernel tests compiled on the GPU, bf16 included (FlashAttention criterion);
#   2. the attention and MLP benchmarks -> benchmarks/results/{attention,mlp}_<device>.json
#      (their default names);
#   3. the training-step benchmark -> benchmarks/results/train_step_<device>.json.
# Usage: bash benchmarks/run_gpu.sh [--quick]   (--quick: fewer timed repetitions)
# Prints the wall time of each part. The Shakespeare GPU preset is separate (several minutes):
#   python -m cemlib.train --experiment shakespeare-llama --preset gpu --out runs/llama-gpu
# The project's pytest options load nbval; -o addopts=-ra drops them, so a GPU image without the
# book's toolchain runs the kernel tests. A copy of the tree without .git records its commit from
# CEMLIB_GIT_COMMIT (cemlib.train.results.git_commit).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU')"
rep=100
if [[ "${1:-}" == "--quick" ]]; then rep=20; fi
dev=$(python -c "import torch, re; print(re.sub(r'\W+', '_', torch.cuda.get_device_name()).strip('_'))")
mkdir -p benchmarks/results

part() {  # part NAME COMMAND...: run, then print its wall time
  local name=$1; shift
  local t0=$SECONDS
  "$@"
  echo "== ${name}: $((SECONDS - t0)) s"
}

part "kernel tests (CUDA)" python -m pytest -q -p no:cacheprovider -o addopts=-ra \
  tests/test_kernels_cuda.py tests/test_kernels_triton.py tests/test_kernels_dispatch.py tests/test_kernels_torch.py
part "attention benchmark" python benchmarks/bench_attention.py --rep "$rep"
part "MLP benchmark" python benchmarks/bench_mlp.py --rep "$rep"
part "training-step benchmark" python benchmarks/train_step.py --measure-peak \
  --out "benchmarks/results/train_step_${dev}.json"
