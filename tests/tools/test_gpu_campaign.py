"""The gpu presets and the tools that prepare their GPU runs, on the CPU: the budget
(``tools/gpu/budget.py``), the campaign (``campaign.py``) and the import of its results
(``import_results.py``)."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # GPU-campaign tools: subprocess dry runs of every gpu preset
import torch
import torch.nn.functional as F

from cemlib.models.lm import LanguageModel, LMConfig
from cemlib.models.params import flops_per_token
from cemlib.train.config import ConfigError
from cemlib.train.registry import EXPERIMENTS, get_config
from cemlib.train.run import run_experiment

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import budget  # noqa: E402
from budget import (FAMILIES, H100_PEAK_TFLOPS, STARTUP_S, TRAINER_STEP_S, StepCounts, cached_counts,  # noqa: E402
                    count_ops, count_step, estimate, fingerprint, load_counts, preset_estimate)
from campaign import PLAN, Run, dry_overrides, plan_runs, run_campaign  # noqa: E402
from import_results import check_results, import_campaign  # noqa: E402
GPU_PRESETS = sorted(name for name, exp in EXPERIMENTS.items() if "gpu" in exp.presets)


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------ the presets
@pytest.mark.parametrize("experiment", GPU_PRESETS)
def test_every_gpu_preset_trains_three_steps_on_the_cpu(experiment, one_thread):
    overrides = dry_overrides(experiment)
    assert not any(o.startswith("model.") for o in overrides)  # the model keeps its gpu size
    res = run_experiment(experiment, "gpu", overrides, verbose=False)
    assert res["metrics"]["steps"] == 3 and res["status"] == "complete"
    assert math.isfinite(res["metrics"]["final_val_loss"]) and math.isfinite(res["curves"]["train"][-1]["loss"])


#: gpu presets allowed over 3 H100-minutes, with their cap: CEM ablations that keep the Shakespeare
#: schedule to compare with full CEM at equal steps (see SHAKESPEARE_GPU_TRAIN); in no plan.
OVER_THREE_MINUTES = {"shakespeare-cem-reuse2": 3.05, "shakespeare-cem-precond-diag": 3.2,
                      "shakespeare-cem-t3": 3.6, "shakespeare-cem-precond-dplr": 4.15}


def test_every_gpu_preset_has_current_counts_and_fits_three_minutes():
    store = load_counts()
    over = {}
    for name in GPU_PRESETS:
        cfg = get_config(name, "gpu")
        assert cached_counts(cfg, store) is not None, \
            f"{name}/gpu changed since it was counted: python tools/gpu/budget.py --update"
        e = preset_estimate(name, "gpu", store=store)
        if e.minutes > OVER_THREE_MINUTES.get(name, 3.0):
            over[name] = round(e.minutes, 2)
    assert not over, f"gpu presets estimated over 3 H100-minutes: {over}"
    assert not {r.experiment for r in PLAN} & set(OVER_THREE_MINUTES)


def test_gpu_presets_evaluate_often_enough():
    """Every 100-250 steps; a token stream (whose periodic evaluation samples) on >= 50 batches."""
    for name in GPU_PRESETS:
        cfg = get_config(name, "gpu")
        assert 100 <= cfg.train.eval_interval <= 250, name
        if cfg.data.name == "shakespeare":
            assert cfg.train.eval_batches >= 50, name


def test_shakespeare_train_chars_shortens_the_training_stream_only():
    from cemlib.train.datasets import make_task
    full = make_task(get_config("shakespeare-llama", "cpu"))
    short = make_task(get_config("shakespeare-llama", "cpu", ["task.train_chars=10000"]))
    assert short.train.tokens.numel() == 10_000
    assert torch.equal(short.train.tokens, full.train.tokens[:10_000])
    assert torch.equal(short.splits["val"].tokens, full.splits["val"].tokens)
    for bad in ("5", "true", "99999999"):
        with pytest.raises(ConfigError, match="task.train_chars"):
            make_task(get_config("shakespeare-llama", "cpu", [f"task.train_chars={bad}"]))


# ------------------------------------------------------------------------------ the budget
def test_counts_of_a_language_model_preset_match_flops_per_token_and_the_stored_counts(one_thread):
    cfg = get_config("shakespeare-cem", "gpu")
    c = count_step(cfg)
    model_cfg = LMConfig(vocab_size=65, context_length=cfg.train.context_length, **cfg.model)
    assert c.forward_flops_per_example == flops_per_token(model_cfg) * cfg.train.context_length
    assert c.family == "cem" and c.final_forwards > 0  # a token stream: the whole split at the end
    stored = cached_counts(cfg)
    deterministic = {k: v for k, v in c.__dict__.items() if k != "data_s"}
    assert deterministic == {k: v for k, v in stored.__dict__.items() if k != "data_s"}


def test_estimate_adds_its_parts():
    cfg = get_config("shakespeare-llama", "gpu")
    c = StepCounts(fingerprint(cfg), "compiled", 1, forward_flops_per_example=1e9, train_ops=1000, eval_ops=300,
                   eval_forwards=100, eval_examples=6400, final_forwards=7, final_examples=436, data_s=2.0)
    e = estimate(cfg, c)
    fam, tc = FAMILIES["compiled"], cfg.train
    rate = fam.eta * H100_PEAK_TFLOPS * 1e12
    step = 1000 * fam.op_s + 3e9 * tc.batch_size / rate + TRAINER_STEP_S
    assert e.step_s == pytest.approx(step)
    n_eval = tc.max_steps // tc.eval_interval + 1 + (tc.max_steps % tc.eval_interval > 0)
    assert e.evaluations == n_eval
    assert e.eval_s == pytest.approx(n_eval * (100 * 300 * fam.op_s + 6400e9 / rate))
    assert e.total_s == pytest.approx(STARTUP_S + 2.0 + fam.compile_s + tc.max_steps * step + e.eval_s
                                      + 7 * 300 * fam.op_s + 436e9 / rate)
    other = get_config("shakespeare-llama", "gpu", ["train.max_steps=10"])
    with pytest.raises(ValueError, match="another configuration"):
        estimate(other, c)
    seeded = get_config("shakespeare-llama", "gpu", ["train.seed=2"])
    assert fingerprint(seeded) == fingerprint(cfg)  # a seed changes neither model nor data


@pytest.mark.parametrize("path", ["train_step_T1_NVIDIA_H100_80GB_HBM3.json",
                                  "train_step_T2_NVIDIA_H100_80GB_HBM3.json"])
def test_step_model_reproduces_the_h100_training_step_benchmark(path, one_thread):
    """The families' constants against the measured medians (forward FLOPs as recorded; operations
    counted here at context 16, which they do not depend on)."""
    bench = json.loads((ROOT / "benchmarks" / "results" / path).read_text())
    for r in bench["rows"]:
        cfg = LMConfig(vocab_size=65, context_length=16, d_model=r["d_model"], n_layers=r["n_layers"],
                       n_heads=r["n_heads"], attn=r["attn"], mlp=r["mlp"], T_attn=r["T_attn"], T_mlp=r["T_mlp"])
        model = LanguageModel(cfg)
        x = torch.randint(0, 65, (1, 16))
        ops = count_ops(lambda: F.cross_entropy(model(x).reshape(-1, 65), x.reshape(-1)).backward())
        fam = FAMILIES["cem" if r["attn"] == "cem" else "compiled"]
        flops = 3 * r["forward_flops_per_token"] * r["batch"] * r["context_length"]
        predicted = ops * fam.op_s + flops / (fam.eta * H100_PEAK_TFLOPS * 1e12)
        assert -0.10 <= predicted / r["median_s"] - 1 <= 0.20, (r["attn"], r["d_model"], predicted, r["median_s"])


def test_stored_pilots_are_clean_runs_of_their_recorded_commands():
    import gpu_pilots
    rows = {r["pilot"]: r for r in gpu_pilots.summary_rows()}
    assert set(rows) == set(gpu_pilots.PILOTS)  # every pilot the preset comments quote is stored
    for name in gpu_pilots.PILOTS:
        res = json.loads((gpu_pilots.STORE / f"{name}.json").read_text())
        assert res["command"] == gpu_pilots.command(name) and res["status"] == "complete"
        assert len(res["git_commit"]) == 40 and "+" not in res["git_commit"]
    # the numbers the Shakespeare gpu preset's choices rest on (benchmarks/NOTES.md)
    assert rows["r4_llama_d02_cos165"]["final_whole_val"] < min(rows["r3_llama_d02_cos110"]["final_whole_val"],
                                                                 rows["r6_llama_d02_cos220"]["final_whole_val"])
    assert rows["r1_llama_d02_const240"]["best_step"] == rows["r5_cem_d02_const240"]["best_step"] == 110
    assert rows["r2_llama_d00_const240"]["best_step"] < rows["r1_llama_d02_const240"]["best_step"]


# ------------------------------------------------------------------------------ the plan
def test_plan_runs_are_registered_presets_in_order_and_plan_one_fits_25_minutes():
    store = load_counts()
    files = [r.file for r in PLAN]
    assert len(files) == len(set(files))
    assert [r.plan for r in PLAN] == sorted(r.plan for r in PLAN)  # plan 1 first
    for r in PLAN:
        assert r.experiment in EXPERIMENTS and r.preset in EXPERIMENTS[r.experiment].presets
        assert r.command == f"python -m cemlib.train --experiment {r.experiment} --preset gpu --set train.seed={r.seed}"
    first = [preset_estimate(r.experiment, r.preset, r.overrides, store) for r in plan_runs(1)]
    assert all(e is not None for e in first) and sum(e.minutes for e in first) <= 25.0
    central = {(r.experiment, r.seed) for r in plan_runs(1)}
    for e in ("shakespeare-llama", "shakespeare-cem", "shakespeare-cem-attn", "shakespeare-cem-mlp",
              "shakespeare-cem-t2"):
        assert {s for x, s in central if x == e} | {r.seed for r in plan_runs(2) if r.experiment == e} \
            == {0, 1, 2}, e  # three seeds of the central comparison over the two plans


# ------------------------------------------------------------------------------ the campaign, dry
def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_campaign_dry_run_continues_where_it_stopped_and_exports(tmp_path):
    out, tar = tmp_path / "out", tmp_path / "export" / "campaign.tar"
    base = [sys.executable, str(ROOT / "tools" / "gpu" / "campaign.py"), "run", "--dry-run", "--plan", "1", "--limit", "2",
            "--out", str(out), "--export", str(tar)]
    # each dry run is assumed to take 270 s: 1.1 x 270 s fits the 300 s budget once, not twice
    first = subprocess.run(base + ["--budget-s", "300", "--dry-estimate-s", "270"], capture_output=True, text=True,
                           env=_env(), cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    runs = plan_runs(1)[:2]
    assert f"done  {runs[0].file}" in first.stdout and f"left  {runs[1].file}" in first.stdout
    second = subprocess.run(base + ["--budget-s", "600", "--jobs", "2"], capture_output=True, text=True, env=_env(),
                            cwd=tmp_path, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"skip  {runs[0].file}: results exist" in second.stdout and f"done  {runs[1].file}" in second.stdout
    with tarfile.open(tar) as t:
        names = sorted(t.getnames())
    assert names == sorted(["campaign.json", runs[0].file, runs[1].file, f"logs/{runs[0].name}.log",
                            f"logs/{runs[1].name}.log"])
    log = json.loads((out / "campaign.json").read_text())
    assert [len(c["ran"]) for c in log["calls"]] == [1, 1]
    ran = log["calls"][1]["ran"][0]
    assert ran["command"] == runs[1].command and ran["extra_overrides"] == dry_overrides(runs[1].experiment)
    # the dry runs' files are refused by the import: CPU device, commands with the dry overrides
    checked = {c.file: c for c in import_campaign(tar, tmp_path / "results", repo=None, check_only=True)}
    assert set(checked) == {runs[0].file, runs[1].file}
    for c in checked.values():
        assert not c.ok
        assert any("not on a GPU" in p for p in c.problems) and any("is not the plan's" in p for p in c.problems)


def test_campaign_stops_a_run_at_the_end_of_its_budget(tmp_path, monkeypatch):
    """A run still going when the budget ends gets SIGTERM and is left for the next call."""
    import campaign
    run = Run("shakespeare-llama", 0, "x", 1, "test")
    monkeypatch.setattr(campaign, "dry_overrides",
                        lambda experiment, preset="gpu", steps=3: dry_overrides(experiment, preset, steps=100_000))
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    call = run_campaign([run], tmp_path / "out", budget_s=25.0, dry_run=True, dry_estimate_s=0.0, verbose=False)
    assert not call["ran"] and len(call["left"]) == 1
    assert call["left"][0]["stopped_at_budget"] and call["left"][0]["why"] == "stopped at the end of the budget"


def test_campaign_waits_for_a_run_that_fits_alone_instead_of_dropping_it(tmp_path, monkeypatch):
    """Two runs of 100 s each (by estimate) in 200 s with two jobs: beside the first, the second does
    not fit (1.1 x 100 x 2 > 200), alone it does, so it waits for the first to end and then runs."""
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    runs = plan_runs(1)[:2]
    call = run_campaign(runs, tmp_path / "out", budget_s=200.0, dry_run=True, jobs=2, verbose=False,
                        results_root=tmp_path, estimate_s=lambda run: 100.0)
    assert [e["run"] for e in call["ran"]] == [r.file for r in runs] and not call["left"]
    assert all(e["shared_gpu_with"] == [] for e in call["ran"])      # one after the other
    # a run that does not fit even alone is still left at once, and the next one is not blocked
    call = run_campaign(runs, tmp_path / "out2", budget_s=200.0, dry_run=True, jobs=2, verbose=False,
                        results_root=tmp_path, estimate_s=lambda run: 250.0 if run is runs[0] else 10.0)
    assert [e["run"] for e in call["left"]] == [runs[0].file] and [e["run"] for e in call["ran"]] == [runs[1].file]


# ------------------------------------------------------------------------------ import and display
@pytest.fixture(scope="module")
def gpu_like_results(tmp_path_factory):
    """A real 3-step CPU run of a plan entry, then edited (in a temporary folder) into what the GPU
    would have written: the preset's own configuration, a CUDA device, the plan's command, HEAD."""
    torch.set_num_threads(1)
    run = plan_runs(1)[0]
    res = run_experiment(run.experiment, "gpu", [*run.overrides, *dry_overrides(run.experiment)], verbose=False)
    res = json.loads(json.dumps(res))
    cfg = get_config(run.experiment, run.preset, run.overrides).to_dict()
    res["config"] = cfg
    res["metrics"]["steps"] = cfg["train"]["max_steps"]
    res["device"] = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1, "label": "GPU"}
    res["command"] = run.command
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    res["git_commit"] = head.stdout.strip() if head.returncode == 0 else "0" * 40
    return run, res, head.returncode == 0


def _write_campaign(folder: Path, files: dict[str, dict]) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(data))
    return folder


def test_import_accepts_a_gpu_run_of_the_plan_and_refuses_each_fault(gpu_like_results, tmp_path):
    run, res, has_git = gpu_like_results
    repo = ROOT if has_git else None
    assert check_results(run.file, json.dumps(res).encode(), repo).problems == []
    faults = {
        "not on a GPU": lambda d: d["device"].update(type="cpu"),
        "not a clean commit": lambda d: d.update(git_commit=d["git_commit"] + "+dirty"),
        "is not the plan's": lambda d: d.update(command=d["command"] + " --set optim.lr=0.1"),
        "differs from the preset's": lambda d: d["config"]["optim"].update(lr=0.5),
        "not complete": lambda d: d.update(status="interrupted"),
        "ran 3 of": lambda d: d["metrics"].update(steps=3),
    }
    for words, fault in faults.items():
        bad = copy.deepcopy(res)
        fault(bad)
        problems = check_results(run.file, json.dumps(bad).encode(), repo).problems
        assert any(words in p for p in problems), (words, problems)
    assert any("not a run of the campaign's plan" in p
               for p in check_results("elsewhere/x__seed0.json", json.dumps(res).encode(), repo).problems)
    # a folder laid out as the campaign's --out: accepted files are copied with their provenance
    src = _write_campaign(tmp_path / "campaign", {run.file: res})
    checked = import_campaign(src, tmp_path / "results", repo=repo)
    assert [c.ok for c in checked] == [True]
    stored = json.loads((tmp_path / "results" / run.file).read_text())
    assert stored["metrics"] == res["metrics"] and stored["provenance"]["source"] == "campaign"
    assert (tmp_path / "results" / run.folder / "summary.md").is_file()
