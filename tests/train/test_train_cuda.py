"""The trainer on a GPU: a CEM model trained compiled, with CUDA graphs; skipped without a GPU.

``train.compile_mode="reduce-overhead"`` replays each compiled step from CUDA graphs, with
cemlib's fused CEM layers (Triton kernels launched from Python inside opaque custom operators)
captured like any other kernel. Checked here: the run trains (finite losses that fall, the
evaluations run between the steps), Inductor skipped no graph, and the compiled model computes
what the eager one does (its first losses).
"""

import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("CUDA not available", allow_module_level=True)
pytest.importorskip("triton")

from cemlib.train.run import run_experiment  # noqa: E402

# head width 64 and more than one head and sequence: the specializations of the kernels carried to
# the GPU (warm_cache.py; Triton specializes an integer equal to 1)
TINY = ["model.d_model=128", "model.n_layers=2", "model.n_heads=2", "train.batch_size=8",
        "train.context_length=64", "train.max_steps=12", "train.eval_interval=4",
        "train.eval_batches=2", "train.log_interval=1", "optim.warmup_steps=2", "optim.lr=3e-3",
        "train.final_whole_eval=false"]


def _train(mode: str | None, tmp_path):
    """A short run compiled in ``mode`` (None: eager) and the graphs Inductor ran without CUDA
    graphs."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    sets = TINY + (["train.compile=true", f"train.compile_mode={mode}"] if mode else [])
    res = run_experiment("shakespeare-cem", "cpu", sets, out_dir=tmp_path / (mode or "eager"),
                         verbose=False)
    return res, counters["inductor"]["cudagraph_skips"]


def test_a_cem_model_trains_compiled_with_cuda_graphs(tmp_path):
    res, skips = _train("reduce-overhead", tmp_path)
    losses = [r["loss"] for r in res["curves"]["train"]]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert [e["step"] for e in res["curves"]["eval"]] == [0, 4, 8, 12]
    assert skips == 0  # every compiled graph ran from CUDA graphs
    # the same run in eager mode: the same model and data, the same first losses (up to bf16
    # rounding in other kernels)
    ref, _ = _train(None, tmp_path)
    first = [r["loss"] for r in ref["curves"]["train"]][:3]
    assert losses[:3] == pytest.approx(first, rel=2e-2)
