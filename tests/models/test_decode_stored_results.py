"""The stored decoding results (benchmarks/results/decode_cpu.json, test_time_recursion_cpu.json):
provenance, the cache bytes against the one formula, the counted decode FLOPs against the closed
form, and agreement with the stored training runs the test-time recursion evaluates."""

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from cemlib.evidence.stats import paired
from cemlib.models.lm import LMConfig
from cemlib.models.params import flops_per_token, kv_cache_bytes_per_token

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
STORED_RUNS = ROOT / "book" / "results" / "shakespeare_ablations_cpu"
CROSS_CPU_LOSS_RTOL = 0.10  # a re-run on another CPU is another sample of the same run


def _load(name: str) -> dict:
    path = RESULTS / name
    if not path.is_file():
        pytest.skip(f"{name} is not stored in this copy")
    return json.loads(path.read_text())


def _provenance(d: dict, script: str) -> None:
    assert d["command"].startswith(f"python benchmarks/{script}"), d["command"]
    assert re.fullmatch(r"[0-9a-f]{40}", d["git_commit"]), "results must come from a clean commit"
    assert d["device"]["label"] and d["device"]["threads"] and d["versions"]["torch"]
    assert d["wall_time_s"] > 0


def test_decode_benchmark_covers_its_grid_and_keeps_what_the_formula_counts():
    d = _load("decode_cpu.json")
    _provenance(d, "decode.py")
    rows = {(r["model"], r["batch"], r["context"]): r for r in d["steady_state"] if r["device"] == "cpu"}
    assert set(rows) == {(m, b, c) for m in ("llama", "cem") for b in (1, 8) for c in (256, 1024)}
    for r in rows.values():
        cfg = LMConfig(**r["config"])
        assert r["cache_bytes_per_token"] == r["cache_bytes_per_token_formula"] \
            == kv_cache_bytes_per_token(cfg, 4)                                  # float32
        assert len(r["cache"]["seconds"]) == len(r["no_cache"]["seconds"]) >= 3
        assert r["speedup_median"] > 1
    readme = d["readme_run"]
    assert all(case["same_text"] for case in readme["cases"])
    window = next(c for c in readme["cases"] if c["context_length"] == 256)
    assert window["speedup_median"] > 1                    # the done-when number


def test_recursion_results_hold_five_seeds_paired_and_agree_with_the_stored_runs():
    d = _load("test_time_recursion_cpu.json")
    _provenance(d, "test_time_recursion.py")
    for experiment, T0 in (("shakespeare-cem", 1), ("shakespeare-cem-t2", 2)):
        runs = sorted((r for r in d["runs"] if r["experiment"] == experiment), key=lambda r: r["seed"])
        assert [r["seed"] for r in runs] == [0, 1, 2, 3, 4] and {r["trained_T"] for r in runs} == {T0}
        for r in runs:
            stored = json.loads((STORED_RUNS / f"{experiment.replace('-', '_')}__seed{r['seed']}.json").read_text())
            assert r["rerun"]["same_command"] and r["command"] == stored["command"]
            for key in ("final_whole_val_loss", "final_train_loss", "final_val_loss"):
                got = r["rerun"][key]
                if r["rerun"]["same_cpu_kernels"]:
                    assert got["difference"] == 0, key
                assert got["rerun"] == pytest.approx(got["stored"], rel=CROSS_CPU_LOSS_RTOL), key
            trained = r["settings"][0]
            assert trained["setting"] == dict(T_attn=T0, T_mlp=T0)
            assert trained["val_loss"] == pytest.approx(r["rerun"]["final_whole_val_loss"]["rerun"], abs=1e-6)
            base = LMConfig(vocab_size=65, context_length=64, d_model=128, n_layers=2, n_heads=4,
                            attn="cem", mlp="cem", T_attn=T0, T_mlp=T0)
            for s in r["settings"]:
                assert math.isfinite(s["val_loss"])
                # one cached decode step at a full window, counted, is the closed form
                cfg = dataclasses.replace(base, **s["setting"])
                assert s["decode_flops_per_token"]["total"] == flops_per_token(cfg), s["label"]
        for entry in (e for e in d["summary"] if e["experiment"] == experiment and "difference_from_trained" in e):
            i = next(k for k, s in enumerate(runs[0]["settings"]) if s["label"] == entry["label"])
            est = paired({r["seed"]: r["settings"][i]["val_loss"] for r in runs},
                         {r["seed"]: r["settings"][0]["val_loss"] for r in runs})
            assert entry["difference_from_trained"]["mean"] == pytest.approx(est.mean, abs=1e-12)
            assert entry["difference_from_trained"]["low"] == pytest.approx(est.low, abs=1e-12)
