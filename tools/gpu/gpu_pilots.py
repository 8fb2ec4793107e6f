"""CPU pilots of the Shakespeare ``gpu`` presets' schedule and regularisation, scaled down.

The gpu Llama (10.7M parameters on the 1.0M training characters) over-fits: in
``book/results/shakespeare_llama_gpu.json`` its validation loss is 1.512 at step 500 (8 epochs),
1.520 at step 1000 and rises from there (2.516 at step 5000, train loss 0.199). A CPU cannot train
that model for 8 epochs, so the pilots shrink the model (width 128, 4 layers, 4 heads: 0.81M
parameters), the context (128) and the batch (32), and above all the training text
(``task.train_chars``: the first 10,000 or 50,000 characters; validation is the usual whole
held-out tail), until the same dynamics appear within a few hundred steps: a validation minimum,
a plateau, then a rise while the training loss keeps falling. Each pilot is one recorded
``python -m cemlib.train`` command, run on one thread under ``nice``::

    python tools/gpu/gpu_pilots.py --run r1_llama_d02_const240   # -> benchmarks/results/pilots/
    python tools/gpu/gpu_pilots.py --summary                     # the table of every stored pilot

``benchmarks/NOTES.md`` ("Preset choices") quotes these files; the presets name them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "benchmarks" / "results" / "pilots"

_SMALL = ["model.d_model=128", "model.n_layers=4", "model.n_heads=4"]
#: 50,000 characters, lr 3e-3 (the cpu preset's), an evaluation every 25 steps (2 epochs)
_Q = [*_SMALL, "model.dropout=0.2", "train.context_length=128", "train.batch_size=32", "task.train_chars=50000",
      "optim.lr=0.003", "optim.warmup_steps=20", "train.eval_interval=25", "train.eval_batches=8",
      "train.log_interval=25"]
#: 10,000 characters, the gpu presets' lr 1e-3, an evaluation every 10 steps (4 epochs)
_R = [*_SMALL, "train.context_length=128", "train.batch_size=32", "task.train_chars=10000", "optim.lr=0.001",
      "optim.warmup_steps=10", "train.eval_interval=10", "train.eval_batches=4", "train.log_interval=10"]
_CONSTANT = ["optim.min_lr_ratio=1.0"]

#: name -> (experiment, overrides, what it tests)
PILOTS: dict[str, tuple[str, list[str], str]] = {
    "q1_llama_const300": ("shakespeare-llama", [*_Q, "train.max_steps=300", *_CONSTANT],
                          "50k characters, constant lr: where the validation loss stops improving"),
    "q2_llama_cos125": ("shakespeare-llama", [*_Q, "train.max_steps=125"],
                        "50k characters, cosine over 10 epochs"),
    "q3_llama_cos250": ("shakespeare-llama", [*_Q, "train.max_steps=250"],
                        "50k characters, cosine over 20 epochs"),
    "r1_llama_d02_const240": ("shakespeare-llama", [*_R, "model.dropout=0.2", "train.max_steps=240", *_CONSTANT],
                              "10k characters, dropout 0.2, constant lr: minimum, plateau, rise"),
    "r2_llama_d00_const240": ("shakespeare-llama", [*_R, "model.dropout=0.0", "train.max_steps=240", *_CONSTANT],
                              "the same without dropout"),
    "r3_llama_d02_cos110": ("shakespeare-llama", [*_R, "model.dropout=0.2", "train.max_steps=110"],
                            "cosine ending at r1's minimum (step 110)"),
    "r4_llama_d02_cos165": ("shakespeare-llama", [*_R, "model.dropout=0.2", "train.max_steps=165"],
                            "cosine ending at 1.5x r1's minimum"),
    "r6_llama_d02_cos220": ("shakespeare-llama", [*_R, "model.dropout=0.2", "train.max_steps=220"],
                            "cosine ending at 2x r1's minimum"),
    "r7_llama_d03_cos165": ("shakespeare-llama", [*_R, "model.dropout=0.3", "train.max_steps=165"],
                            "r4 with dropout 0.3"),
    "r8_llama_wd05_cos165": ("shakespeare-llama", [*_R, "model.dropout=0.2", "train.max_steps=165",
                                                   "optim.weight_decay=0.5"], "r4 with weight decay 0.5"),
    "r9_llama_lr2e-3_cos165": ("shakespeare-llama", [*_R, "model.dropout=0.2", "train.max_steps=165",
                                                     "optim.lr=0.002"], "r4 with lr 2e-3"),
    "r10_llama_lr5e-4_cos165": ("shakespeare-llama", [*_R, "model.dropout=0.2", "train.max_steps=165",
                                                      "optim.lr=0.0005"], "r4 with lr 5e-4"),
    "r5_cem_d02_const240": ("shakespeare-cem", [*_R, "model.dropout=0.2", "train.max_steps=240", *_CONSTANT],
                            "r1 for full CEM (T = 1): where its minimum is"),
}


def command(name: str) -> str:
    """The recorded command of pilot ``name`` (what its results file's ``command`` says)."""
    from cemlib.train.registry import reproduce_command
    experiment, overrides, _ = PILOTS[name]
    return reproduce_command(experiment, "cpu", overrides)


def run(name: str, out_root: Path) -> Path:
    """Run pilot ``name`` (one thread, ``nice``) and store its results as ``STORE/<name>.json``."""
    experiment, overrides, _ = PILOTS[name]
    out = out_root / name
    args = ["nice", "-n", "5", sys.executable, "-m", "cemlib.train", "--experiment", experiment, "--preset", "cpu"]
    for o in overrides:
        args += ["--set", o]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(args + ["--out", str(out), "--quiet"], check=True, cwd=ROOT, env=env)
    STORE.mkdir(parents=True, exist_ok=True)
    target = STORE / f"{name}.json"
    shutil.copyfile(out / "results.json", target)
    return target


def summary_rows() -> list[dict]:
    """One row per stored pilot: steps, epochs, best (sampled) validation loss and its step, the final
    model's loss on the whole validation split, the last training-split evaluation."""
    rows = []
    for name, (experiment, overrides, what) in PILOTS.items():
        path = STORE / f"{name}.json"
        if not path.is_file():
            continue
        res = json.loads(path.read_text())
        ev = res["curves"]["eval"]
        best = min(ev, key=lambda e: e["val_loss"])
        tc = res["config"]["train"]
        chars = res["config"]["task"]["train_chars"]
        rows.append({"pilot": name, "what": what, "parameters": res["num_parameters"], "steps": tc["max_steps"],
                     "epochs": tc["max_steps"] * tc["batch_size"] * tc["context_length"] / chars,
                     "best_val": best["val_loss"], "best_step": best["step"],
                     "final_whole_val": res["metrics"]["final_whole_val"]["val_loss"],
                     "final_train": ev[-1]["train_loss"]})
    return rows


def summary_markdown() -> str:
    lines = ["| pilot | what it tests | steps (epochs) | best val (step) | final, whole val | final train |",
             "|---|---|---|---|---|---|"]
    for r in summary_rows():
        lines.append(f"| {r['pilot']} | {r['what']} | {r['steps']} ({r['epochs']:.0f}) | "
                     f"{r['best_val']:.3f} ({r['best_step']}) | {r['final_whole_val']:.3f} | {r['final_train']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", action="append", default=[], help="pilot name (repeatable); see PILOTS")
    p.add_argument("--out", default="runs/pilots", help="run folders (checkpoints); results go to the store")
    p.add_argument("--summary", action="store_true", help="print the table of the stored pilots")
    a = p.parse_args(argv)
    for name in a.run:
        if name not in PILOTS:
            p.error(f"unknown pilot {name!r}; known: {', '.join(PILOTS)}")
        print(f"{name}: stored {run(name, Path(a.out)).relative_to(ROOT)}")
    if a.summary:
        print(summary_markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
