"""The stored benchmark files chapter 10 reads (benchmarks/results/): provenance, and agreement with
the stored training runs they describe.

``energy_depth_cpu.json`` is written from the seed-0 checkpoints of the chapter 10 benchmark; its
models' final metrics and parameter counts must be those of the stored seed-0 results files (the
script re-creates a missing checkpoint by re-training: bit-identical on a CPU of the kind that wrote
the stored run; on another CPU another sample of the same run, and the file records how far its
metrics moved), and each weight-shared
model's trajectory must continue its per-step records. The ``cpu_speed_bench_*.json`` files must time
the models the sweep trained (the same parameter counts).
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from cemlib.train.presets.bench import WIDTHS as BENCH_WIDTHS
from cemlib.train.results import load_results

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _stored_seed0(experiment: str) -> dict:
    task = experiment.split("-")[1]
    return load_results(ROOT / "book" / "results" / f"bench_{task}_cpu" / f"{experiment.replace('-', '_')}__seed0.json")


def _provenance(d: dict, script: str):
    assert d["command"].startswith(f"python benchmarks/{script}"), d["command"]
    assert re.fullmatch(r"[0-9a-f]{40}", d["git_commit"]), "benchmark files must come from a clean commit"
    assert d["device"]["label"] and d["versions"]["torch"]


def test_energy_depth_matches_the_stored_runs():
    d = json.loads((RESULTS / "energy_depth_cpu.json").read_text())
    _provenance(d, "energy_depth.py")
    assert set(d["tasks"]) == set(BENCH_WIDTHS)
    for task, block in d["tasks"].items():
        assert set(block["models"]) == set(BENCH_WIDTHS[task]) - {"llama", "gpt"}
        for model, row in block["models"].items():
            stored = _stored_seed0(row["experiment"])
            assert row["experiment"] == f"bench-{task}-{model}" and row["matches_stored"]
            # the re-trained checkpoint is the stored run bit for bit on a CPU of the kind that wrote it;
            # on another CPU it is another sample of the same configuration and seed, and says how far
            assert row["stored_final_metrics"] == stored["metrics"]["final"]
            assert row["stored_device"] == stored["device"]["name"]
            assert row["max_rel_diff_to_stored"] == pytest.approx(max(
                abs(row["final_metrics"][k] - v) / abs(v) for k, v in stored["metrics"]["final"].items()))
            if row["same_cpu_as_stored"]:
                assert row["final_metrics"] == stored["metrics"]["final"]
            assert row["num_parameters"] == stored["num_parameters"]
            n = len(row["labels"])
            assert len(row["before_mean"]) == len(row["after_mean"]) == len(row["descent_fraction"]) == n
            np.testing.assert_allclose(row["change_mean"], np.subtract(row["after_mean"], row["before_mean"]),
                                       rtol=1e-9, atol=1e-9)
            assert all(0.0 <= f <= 1.0 for f in row["descent_fraction"])
            # direction (first order) apart from overshoot: the table splits the same tokens
            assert len(row["first_order_descent_fraction"]) == len(row["direction_table"]) == n
            for s, t in enumerate(row["direction_table"]):
                assert abs(sum(t.values()) - 1.0) < 1e-12
                assert abs(t["downhill_descends"] + t["uphill_descends"] - row["descent_fraction"][s]) < 1e-12
                assert abs(t["downhill_descends"] + t["downhill_overshoots"]
                           - row["first_order_descent_fraction"][s]) < 1e-12
            q = np.array(row["step_ratio_quantiles"])
            assert q.shape == (n, len(d["step_ratio_quantiles"])) and (np.diff(q, axis=1) >= 0).all() and (q > 0).all()
            if row["one_energy"]:
                traj = row["trajectory_mean"]
                assert row["trained_steps"] == n and len(traj) == d["extend"] * n + 1
                np.testing.assert_allclose(traj[: n + 1], row["before_mean"] + row["after_mean"][-1:], rtol=1e-9)


@pytest.mark.parametrize("task", sorted(BENCH_WIDTHS))
def test_cpu_speed_bench_times_the_trained_models(task):
    d = json.loads((RESULTS / f"cpu_speed_bench_{task}.json").read_text())
    _provenance(d, "cpu_speed.py")
    assert d["suite"] == f"bench-{task}" and d["threads"] == 1
    rows = {r["key"]: r for r in d["rows"]}
    assert set(rows) == set(BENCH_WIDTHS[task])
    for key, r in rows.items():
        stored = _stored_seed0(f"bench-{task}-{key}")
        assert r["params"] == stored["num_parameters"]
        assert r["tokens_per_step"] == stored["metrics"]["tokens"] / stored["metrics"]["steps"]
        assert r["tokens_per_s"] > 0 and r["saved_activation_bytes"] > 0 and r["forward_flops_per_token"] > 0
