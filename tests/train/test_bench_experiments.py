"""The chapter-10 benchmark experiments (``bench-<task>-<model>``): every one builds and trains, the
models of one task are parameter-matched within the stated tolerance, and ListOps hides its answer
from the inputs without changing what a causal model predicts."""

import math

import pytest
import torch

from cemlib.train import EXPERIMENTS, get_config, run_experiment
from cemlib.train.presets.bench import (PARAM_TOLERANCE as BENCH_PARAM_TOLERANCE,
                                        WIDTHS as BENCH_WIDTHS)
from cemlib.train.registry import build

BENCH = sorted(n for n in EXPERIMENTS if n.startswith("bench-"))
TWO_STEPS = ["train.max_steps=2", "train.eval_interval=2", "train.eval_batches=1", "train.batch_size=4",
             "train.log_interval=1", "train.final_whole_eval=false", "optim.warmup_steps=1"]


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_every_task_model_pair_is_registered():
    assert BENCH == sorted(f"bench-{t}-{m}" for t, ms in BENCH_WIDTHS.items() for m in ms)
    assert "hyperset" not in BENCH_WIDTHS["shakespeare"]  # no causal form: ListOps only


@pytest.mark.parametrize("name", BENCH)
def test_bench_experiment_trains_two_steps(name):
    r = run_experiment(name, "cpu", TWO_STEPS, verbose=False)
    assert r["metrics"]["steps"] == 2
    assert all(math.isfinite(v) for v in r["metrics"]["final"].values())


@pytest.mark.parametrize("task", sorted(BENCH_WIDTHS))
def test_models_of_a_task_are_parameter_matched(task):
    """Trainable parameters of the cpu presets, as built for the task's data: the largest is
    within BENCH_PARAM_TOLERANCE of the smallest; every preset uses the same training tokens."""
    counts, tokens = {}, set()
    for model in BENCH_WIDTHS[task]:
        cfg = get_config(f"bench-{task}-{model}", "cpu")
        counts[model] = _n_params(build(cfg)[0])
        tokens.add((cfg.train.max_steps, cfg.train.batch_size, cfg.train.context_length,
                    tuple(sorted(cfg.task.items()))))
    assert max(counts.values()) / min(counts.values()) - 1 <= BENCH_PARAM_TOLERANCE, counts
    assert len(tokens) == 1


def test_listops_hide_answer_keeps_causal_predictions():
    base = ["task.n_train=200", "task.n_test=20", "train.eval_batches=1"]
    shown = get_config("bench-listops-llama", "cpu", base + ["task.hide_answer=false"])
    hidden = get_config("bench-listops-llama", "cpu", base)
    assert hidden.task["hide_answer"] is True
    model, t_shown = build(shown)
    _, t_hidden = build(hidden)
    x1, y1, m1 = t_shown.splits["train"].tensors
    x2, y2, m2 = t_hidden.splits["train"].tensors
    assert torch.equal(y1, y2) and torch.equal(m1, m2)
    pos = m1.float().argmax(1)                      # the column of '=': the answer is predicted here
    rows = torch.nonzero(pos + 1 < x1.shape[1]).flatten()  # the longest rows end before the answer
    assert len(rows) > 0
    assert torch.equal(x1[rows, pos[rows] + 1], y1[rows, pos[rows]])  # shown: the answer is the next input
    cols = torch.arange(x2.shape[1])
    assert bool((x2[cols > pos[:, None]] == x2.max()).all())  # hidden: <pad> (the last id) after '='
    assert torch.equal(x1[cols <= pos[:, None]], x2[cols <= pos[:, None]])
    model.eval()
    with torch.no_grad():                            # a causal model scores the same logits
        torch.testing.assert_close(model(x1[:8])[m1[:8]], model(x2[:8])[m2[:8]])


def test_hide_answer_rejects_non_bool():
    from cemlib.train import ConfigError
    with pytest.raises(ConfigError, match="task.hide_answer must be true or false"):  # before any data loads
        get_config("bench-listops-gpt", "cpu", ["task.n_train=50", "task.n_test=5", 'task.hide_answer="yes"'])


def test_bench_model_builds_the_preset_at_any_width():
    from cemlib.train.registry import bench_model
    from cemlib.train.datasets import make_task
    cfg = get_config("bench-listops-hyperset", "cpu")
    task = make_task(cfg)
    registered = bench_model("listops", "hyperset", task=task)
    reference = build(cfg)[0]
    assert _n_params(registered) == _n_params(reference)
    for p, q in zip(registered.parameters(), reference.parameters()):   # the same seeded initialisation
        assert torch.equal(p, q)
    wide = bench_model("listops", "hyperset", 2 * BENCH_WIDTHS["listops"]["hyperset"][0], task=task)
    assert wide.layer.attention.d == 2 * BENCH_WIDTHS["listops"]["hyperset"][0]
    assert bench_model("shakespeare", "cem", 40).config.d_model == 40
    with pytest.raises(Exception, match="no benchmark model"):
        bench_model("shakespeare", "hyperset")


def test_count_flops_counts_every_recurrent_step():
    from cemlib.train.registry import bench_model
    from cemlib.kernels.costs import count_flops
    model = bench_model("listops", "nrgpt")
    x = torch.zeros(2, 30, dtype=torch.long)
    per_step = count_flops(lambda: model(x))
    model.n_steps *= 2
    head_and_rest = 2 * per_step - count_flops(lambda: model(x))   # what does not repeat
    assert 0 < head_and_rest < 0.2 * per_step
    with pytest.raises(TypeError):
        count_flops(3)


def test_count_flops_counts_cpu_attention_like_explicit_attention():
    """PyTorch's counter misses the CPU kernel of scaled_dot_product_attention; count_flops adds it,
    with the count of the same attention written as two matrix products."""
    import torch.nn.functional as F
    from cemlib.kernels.costs import count_flops
    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    sdpa = count_flops(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    explicit = count_flops(lambda: torch.softmax(q @ k.transpose(-1, -2), -1) @ v)
    assert sdpa == explicit == 2 * 2 * (2 * 4 * 16 * 16 * 8)
