"""A chapter's stored GPU runs beside its CPU runs (cemlib.evidence.tables.gpu_results_table)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from cemlib.evidence.tables import Row, best_evaluation, final_metric, gpu_results_table
from cemlib.train.run import run_experiment

TINY_GPU = ["train.max_steps=3", "train.eval_interval=3", "train.eval_batches=1", "train.batch_size=2",
            "train.final_whole_eval=false", "train.checkpoint_interval=0", "train.device=cpu",
            "train.context_length=32", "train.compile=false"]


@pytest.fixture(scope="module")
def gpu_like_result():
    """A real 3-step CPU run of the Llama gpu preset, relabelled as the GPU would have written it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = run_experiment("shakespeare-llama", "gpu", TINY_GPU, verbose=False)
    finally:
        torch.set_num_threads(threads)
    res = json.loads(json.dumps(res))
    res["device"] = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1, "label": "GPU"}
    return res


def test_without_a_gpu_run_the_table_is_empty_and_says_how_to_train_one(tmp_path):
    rows = [Row("Llama", "shakespeare-llama", "1.4697 (nanoGPT)"), Row("full CEM", "shakespeare-cem")]
    t = gpu_results_table(tmp_path / "shakespeare_gpu", rows)
    assert not t.available and t.device is None and t.rows == []
    assert "No GPU run of these models is stored" in t.note
    for e in ("shakespeare-llama", "shakespeare-cem"):
        assert f"cemlib train --experiment {e} --preset gpu" in t.note
    assert "not yet run" not in t.markdown().lower() and "not yet run" not in repr(t).lower()


def test_stored_gpu_runs_beside_cpu_runs(gpu_like_result, tmp_path):
    gpu_dir = tmp_path / "shakespeare_gpu"
    gpu_dir.mkdir()
    seeds = []
    for seed in (0, 1):
        r = copy.deepcopy(gpu_like_result)
        r["config"]["train"]["seed"] = seed
        r["metrics"]["final_whole_val"] = {"val_loss": 1.40 + 0.02 * seed}
        (gpu_dir / f"run{seed}.json").write_text(json.dumps(r))
        seeds.append(r)
    cpu = copy.deepcopy(gpu_like_result)
    cpu["preset"], cpu["device"] = "cpu", {"type": "cpu", "name": "x", "count": 1, "label": "CPU"}
    cpu["metrics"]["final_whole_val"] = {"val_loss": 1.80}
    (tmp_path / "cpu.json").write_text(json.dumps(cpu))
    t = gpu_results_table(gpu_dir, [Row("Llama", "shakespeare-llama", "1.4697"), Row("other", "shakespeare-cem")],
                          cpu=tmp_path / "cpu.json")
    assert t.available and t.device == "NVIDIA H100 80GB HBM3" and "NVIDIA H100 80GB HBM3" in t.note
    assert [r[0] for r in t.rows] == ["Llama"]                       # a model without a GPU run is left out
    assert "cemlib train --experiment shakespeare-cem --preset gpu" in t.note
    mean, sd = 1.41, math.sqrt(2 * 0.01 ** 2)
    assert t.rows[0][2] == f"{mean:.3f} ± {sd:.3f} (2 seeds)" and t.rows[0][4] == "1.800 (1 seed)"
    value, step, metric = best_evaluation(seeds[0])
    assert metric == "val_loss" and f"step {step}" in t.rows[0][3] and "periodic" in t.header[3]
    assert "whole validation split" in t.note                       # why best and final can differ
    assert final_metric(seeds[1], "val_loss") == pytest.approx(1.42)
    live = copy.deepcopy(cpu)
    live["metrics"]["final_whole_val"] = {"val_loss": 1.90}
    both = gpu_results_table(gpu_dir, [Row("Llama", "shakespeare-llama")], cpu=[tmp_path / "cpu.json", live])
    assert both.rows[0][4] == f"1.850 ± {math.sqrt(2 * 0.05 ** 2):.3f} (2 runs)"  # one seed, twice


def test_the_table_finds_the_stored_results_from_any_folder(tmp_path, monkeypatch):
    """A chapter opened alone names its folders ``results/<folder>``: the CPU folder is found among
    the stored results, and a GPU folder not made gives an empty table, not an error."""
    monkeypatch.chdir(tmp_path)
    table = gpu_results_table("results/shakespeare_gpu", [Row("Llama", "shakespeare-llama")],
                              cpu="results/shakespeare_blocks_cpu")
    assert table.available and table.rows[0][4].endswith("seeds)")   # the stored CPU runs were read
    empty = gpu_results_table("results/no_such_gpu_folder", [Row("Llama", "shakespeare-llama")])
    assert empty.rows == [] and "cemlib train --experiment shakespeare-llama --preset gpu" in empty.note
