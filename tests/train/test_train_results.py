"""Results JSON, plot helper, LR sweep (Akima), MFU helpers, and the CLI end to end."""

import json
import math

import matplotlib
import pytest
import torch

from cemlib.train.cli import main
from cemlib.train.flops import forward_flops_per_token, mfu, stated_peak_tflops
from cemlib.train.results import (ResultsError, load_results, plot_curves, same_cpu_kernels,
                                  save_results)
from cemlib.evidence.lr_search import CEM_LR_GRID, akima_optimum, lr_sweep, plot_sweep

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """A 4-step run of the Llama Shakespeare experiment through the command line."""
    out = tmp_path_factory.mktemp("run")
    args = ["--experiment", "shakespeare-llama", "--preset", "cpu", "--quiet", "--out", str(out),
            "--set", "train.max_steps=4", "--set", "train.eval_interval=2", "--set", "train.eval_batches=1",
            "--set", "model.d_model=16", "--set", "model.n_layers=1", "--set", "optim.warmup_steps=1"]
    assert main(args) == 0
    return out, args


def test_cli_run_writes_complete_results(cli_run):
    out, args = cli_run
    res = load_results(out / "results.json")
    assert res["experiment"] == "shakespeare-llama" and res["config"]["train"]["max_steps"] == 4
    assert [e["step"] for e in res["curves"]["eval"]] == [0, 2, 4]
    assert res["metrics"]["tokens"] == 4 * res["config"]["train"]["batch_size"] * 64
    assert res["device"]["type"] == "cpu" and res["device"]["label"] == "CPU"
    assert res["device"]["capability"] == torch.backends.cpu.get_cpu_capability()  # e.g. "AVX2"
    assert res["versions"]["torch"] == torch.__version__
    assert res["metrics"]["flops_source"] == "cemlib.models.params.flops_per_token"
    assert res["metrics"]["mfu"] is None  # no stated peak for a CPU
    assert res["num_parameters"] > 0 and res["metrics"]["tokens_per_s"] > 0
    assert res["command"].startswith("python -m cemlib.train --experiment shakespeare-llama --preset cpu")
    assert "--set train.max_steps=4" in res["command"]
    assert (out / "last.pt").is_file()


def test_results_loader_errors(tmp_path, cli_run):
    with pytest.raises(ResultsError, match="does not exist"):
        load_results(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ResultsError, match="not valid JSON"):
        load_results(tmp_path / "bad.json")
    res = json.loads((cli_run[0] / "results.json").read_text())
    del res["git_commit"]
    (tmp_path / "partial.json").write_text(json.dumps(res))
    with pytest.raises(ResultsError, match=r"lacks the fields \['git_commit'\]"):
        load_results(tmp_path / "partial.json")
    with pytest.raises(ResultsError, match="lack the fields"):
        save_results(tmp_path / "x.json", {"schema": "cemlib.train.results/1"})


def test_plot_curves_labels_device(cli_run):
    res = load_results(cli_run[0] / "results.json")
    ax = plot_curves([res])
    line = ax.get_lines()[0]
    assert line.get_label() == "shakespeare-llama (cpu, CPU)"
    assert list(line.get_ydata()) == [e["val_loss"] for e in res["curves"]["eval"]]
    assert ax.get_xlabel() == "tokens seen"


def test_akima_recovers_a_known_optimum_between_grid_points():
    best = 0.0028  # between the grid points 2e-3 and 4e-3
    loss = lambda lr: 3.0 + 0.2 * (math.log2(lr) - math.log2(best)) ** 2
    res = lr_sweep(loss, CEM_LR_GRID)
    assert abs(math.log2(res.best_lr / best)) < 0.02 and abs(res.best_loss - 3.0) < 1e-3
    assert res.best_lr not in CEM_LR_GRID
    ax = plot_sweep(res, label="quadratic")
    assert len(ax.get_lines()) == 3


def test_akima_drops_diverged_runs_and_validates_input():
    res = akima_optimum(CEM_LR_GRID, [3.4, 3.2, 3.1, 3.3, float("nan")])
    assert res.excluded == [8e-3] and 1e-3 < res.best_lr < 4e-3
    with pytest.raises(ValueError, match="strictly increasing"):
        akima_optimum([1e-3, 1e-3, 2e-3], [1, 2, 3])
    with pytest.raises(ValueError, match="at least 3 finite losses"):
        akima_optimum([1e-3, 2e-3, 4e-3], [1.0, float("inf"), 2.0])
    with pytest.raises(ValueError, match="3 learning rates but 2 losses"):
        akima_optimum([1e-3, 2e-3, 4e-3], [1.0, 2.0])


def test_mfu_and_peaks():
    assert mfu(1e9, 1e4, 1e14) == pytest.approx(3e13 / 1e14)
    assert mfu(1e9, 1e4, 1e14, n_devices=2) == pytest.approx(0.15)
    assert mfu(1e9, 1e4, None) is None
    assert stated_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert stated_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert stated_peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert stated_peak_tflops("Some CPU") is None
    lin = torch.nn.Linear(4, 3)
    assert forward_flops_per_token(lin) == (2.0 * 15, "2 x parameters (approximation)")


def test_sweep_experiment_trains_each_lr(monkeypatch):
    import cemlib.evidence.lr_search as ex
    from cemlib.evidence.lr_search import sweep_experiment
    seen = []
    real = ex.run_experiment

    def spy(experiment, preset, overrides, **kw):
        seen.append(overrides[-1])
        return real(experiment, preset, overrides, **kw)
    monkeypatch.setattr(ex, "run_experiment", spy)
    tiny = ["train.max_steps=3", "train.eval_interval=3", "train.eval_batches=1", "train.batch_size=4",
            "model.d_model=8", "model.n_layers=1", "model.n_heads=2", "optim.warmup_steps=1"]
    res = sweep_experiment("shakespeare-llama", "cpu", lrs=(1e-3, 4e-3, 1.6e-2), overrides=tiny)
    assert seen == ["optim.lr=0.001", "optim.lr=0.004", "optim.lr=0.016"]
    assert len(res.losses) == 3 and 1e-3 <= res.best_lr <= 1.6e-2
    assert res.best_loss <= min(res.losses) + 1e-12


def test_git_commit_outside_a_repository(tmp_path, monkeypatch):
    """A copy of the tree without .git (a GPU machine) records the commit it was made from."""
    from cemlib.train.results import git_commit
    monkeypatch.delenv("CEMLIB_GIT_COMMIT", raising=False)
    assert git_commit(tmp_path) is None
    monkeypatch.setenv("CEMLIB_GIT_COMMIT", "0123abc")
    assert git_commit(tmp_path) == "0123abc"


def test_device_name_is_the_gpu_name_or_the_device_type():
    from cemlib.train.results import device_name

    assert device_name({"device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}}) == "NVIDIA H100 80GB HBM3"
    assert device_name({"device": {"type": "cpu", "name": "AMD EPYC"}}) == "CPU"


def test_paired_differences_of_two_models_run_with_the_same_seeds():
    """The per-seed differences a[s] - b[s]: the same difference at every seed has no spread."""
    from cemlib.evidence.stats import paired
    p = paired([2.0, 2.1, 2.2], [1.9, 2.0, 2.1])
    assert p.mean == pytest.approx(0.1) and p.std == pytest.approx(0.0, abs=1e-12) and p.n == 3
    q = paired([1.0, 2.0, 3.0], [1.5, 1.5, 1.5])                     # mean 0.5, std 1
    assert q.n == 3 and q.mean == pytest.approx(0.5) and q.std == pytest.approx(1.0)
    assert q.low < 0 < q.high                                         # t(0.975, 2) * 1 / sqrt(3) = 2.48
    with pytest.raises(ValueError, match="at least"):
        paired([1.0], [2.0])


def test_same_cpu_kernels():
    """The name alone does not identify the kernels; an entry without a capability cannot say."""
    amd = {"type": "cpu", "name": "AMD EPYC", "capability": "AVX2"}
    assert same_cpu_kernels(amd, dict(amd)) is True
    assert same_cpu_kernels(amd, {**amd, "capability": "AVX512"}) is False
    assert same_cpu_kernels(amd, {**amd, "name": "Intel(R) Xeon(R) Processor"}) is False
    assert same_cpu_kernels({"type": "cpu", "name": "AMD EPYC"}, amd) is None
    assert same_cpu_kernels(amd, {"type": "cpu", "name": "AMD EPYC"}) is None
