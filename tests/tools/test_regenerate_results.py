"""``tools/regenerate_results.py``: a stored CPU result trained again from its command replaces the file."""

import json
import sys
from pathlib import Path

from cemlib.train.results import load_results
from cemlib.train.run import run_experiment

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import regenerate_results  # noqa: E402

TINY = ["train.max_steps=4", "train.eval_interval=2", "train.eval_batches=1", "train.batch_size=4",
        "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "optim.warmup_steps=1"]


def test_a_stored_result_is_regenerated_in_place_with_its_grid_entry(tmp_path):
    res = run_experiment("shakespeare-llama", "cpu", TINY, tmp_path / "run", verbose=False)
    stored = tmp_path / "results" / "shakespeare_llama__seed0.json"
    stored.parent.mkdir()
    res = json.loads(json.dumps(res))
    res["sweep"] = {"overrides": [], "seed": 0}
    res["metrics"]["final_val_loss"] = 99.0                     # what a change of the code would move
    stored.write_text(json.dumps(res))
    assert regenerate_results.main([str(stored.parent), "--check"]) == 0
    assert regenerate_results.main([str(stored.parent), "--allow-dirty"]) == 0
    fresh = load_results(stored)
    assert fresh["sweep"] == {"overrides": [], "seed": 0} and fresh["command"] == res["command"]
    assert fresh["metrics"]["final_val_loss"] != 99.0
    assert fresh["metrics"]["final_whole_val"] == res["metrics"]["final_whole_val"]  # same machine, same run
