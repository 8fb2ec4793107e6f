"""Test-time recursion: CEM models trained with T = 1 and T = 2 run at other T and step sizes.

A CEM layer's recursion ``x^(t+1) = x^(t) - eta grad E(x^(t) | hn_{1:i})`` (CEM eqs. 16-17) moves
only the query, so a trained model can run more (or fewer) steps at inference, at the cost of
attention and MLP FLOPs and no extra cache (the CEM paper, §5.2, names this as a future direction).
For the chapter's cpu-preset models ``shakespeare-cem`` (``T = 1``) and ``shakespeare-cem-t2``
(``T = 2`` in attention and MLP), seeds 0-4, this script records at inference
``T = 1, 2, 3, 4, 8`` (attention and MLP together, and attention alone) and the step sizes
``eta = 0.5 ... 1.5`` at the trained ``T`` (:meth:`cemlib.models.lm.LanguageModel.recursion`):

- the loss on the whole validation split (every next-token target once, the trainer's rule),
  and its per-seed difference from the trained setting with a 95 % t-interval over the seeds;
- the energy descent: each CEM sublayer's own energy before and after it on the first
  ``--energy-windows`` validation windows (``cemlib.models.probes.energy_along_depth``: the mean
  change, the share of tokens it lowers) and, within each layer, the mean energy at every
  recursion step and the share of tokens whose energy rises at some step
  (``energy_along_recursion``);
- the decode cost of a token at a full window (64 kept tokens) with the cache: matmul FLOPs of the
  attention and MLP sublayers as PyTorch counts them (``cemlib.kernels.costs.count_flops``), and
  the measured time per token of greedy decoding (batch 1, a window filled from one token; the
  median of interleaved rounds).

Checkpoints are not kept in the repository: each run is trained again with its recorded command
(``python -m cemlib.train --experiment E --preset cpu --set train.seed=S``) into ``--runs`` (kept
there for the next call), and its final metrics are compared with the stored run in
``book/results/shakespeare_ablations_cpu/`` (bit for bit on a CPU of the kind that wrote them; on
another CPU the re-run is another sample of the same configuration and seed, and the file says how
far its metrics moved)::

    OMP_NUM_THREADS=1 python benchmarks/test_time_recursion.py --replace
        # -> benchmarks/results/test_time_recursion_cpu.json

Without ``--replace`` (or ``--out PATH``) a stored file is kept and the run goes to a new file beside
it (``benchmarks/outputs.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from cemlib.data.shakespeare import load_shakespeare
from cemlib.evidence.stats import paired
from cemlib.kernels.costs import count_flops
from cemlib.layers.cem_attention import CEMAttention
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.models.probes import energy_along_depth, energy_along_recursion
from cemlib.train import get_config, load_results, make_task, run_experiment
from cemlib.train.results import environment_info, git_commit, same_cpu_kernels
from cemlib.train.trained import find_checkpoint, load_trained
from outputs import RESULTS, add_output_arguments, announce, command_line, write_json

REPO = Path(__file__).resolve().parent.parent
TRAINED_T = {"shakespeare-cem": 1, "shakespeare-cem-t2": 2}
T_GRID = (1, 2, 3, 4, 8)
ETA_GRID = (0.5, 0.75, 1.25, 1.5)        # and 1.0, the trained step size (the T grid's trained T)
STORED = REPO / "book" / "results" / "shakespeare_ablations_cpu"
EVAL_BATCH = 128                         # windows per batch of the whole-split evaluation


def settings(T0: int) -> list[dict]:
    """The inference settings of a model trained with ``T0`` (``LanguageModel.recursion``
    arguments), the trained one first."""
    out = [dict(T_attn=T0, T_mlp=T0)]
    out += [dict(T_attn=T, T_mlp=T) for T in T_GRID if T != T0]
    out += [dict(T_attn=T) for T in T_GRID if T != T0]
    out += [dict(eta_attn=eta, eta_mlp=eta) for eta in ETA_GRID]
    return out


def label(s: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in s.items())


def checkpoint(experiment: str, seed: int, runs: Path) -> tuple[Path, dict, float | None]:
    """The run folder of ``experiment`` at ``seed`` (trained there now if it holds no finished
    run), its results and the training wall time of this call (``None`` if found)."""
    folder = runs / f"{experiment}__seed{seed}"
    try:
        find_checkpoint(folder)
        return folder, load_results(folder / "results.json"), None
    except Exception:
        t0 = time.perf_counter()
        res = run_experiment(experiment, "cpu", overrides=[f"train.seed={seed}"], out_dir=folder, verbose=False)
        return folder, res, time.perf_counter() - t0


def rerun_check(experiment: str, seed: int, fresh: dict) -> dict:
    """The re-trained run against the stored one: final metrics side by side."""
    stored = json.loads((STORED / f"{experiment.replace('-', '_')}__seed{seed}.json").read_text())
    keys = {"final_whole_val_loss": lambda r: r["metrics"]["final_whole_val"]["val_loss"],
            "final_train_loss": lambda r: r["metrics"]["final_train_loss"],
            "final_val_loss": lambda r: r["metrics"]["final_val_loss"]}
    out = {"stored_command": stored["command"], "stored_device": stored["device"],
           "same_cpu_kernels": same_cpu_kernels(stored["device"], fresh["device"]),
           "same_command": stored["command"] == fresh["command"]}
    for k, get in keys.items():
        out[k] = {"stored": get(stored), "rerun": get(fresh), "difference": get(fresh) - get(stored)}
    out["bit_identical"] = all(v["difference"] == 0 for k, v in out.items() if k in keys)
    return out


@torch.no_grad()
def whole_val_loss(model, task) -> float:
    """The loss on the whole validation split, by the task's own whole-split rule."""
    sums = None
    for weight, batch in task.whole_batches("val", EVAL_BATCH):
        s = torch.as_tensor(task.whole_stats(model, batch, "val"), dtype=torch.float64) * weight
        sums = s if sums is None else sums + s
    return float(task.summarize_whole(sums.tolist(), "val")["loss"])


def energies(model, idx: torch.Tensor) -> dict:
    """Each CEM sublayer's energy descent on ``idx``, and its recursion step by step."""
    depth = energy_along_depth(model, idx)
    change = depth.change
    steps = [{"step": lab, "mean_before": float(depth.before[i].mean()), "mean_after": float(depth.after[i].mean()),
              "mean_change": float(change[i].mean()), "share_lowered": float((change[i] < 0).double().mean()),
              "share_downhill": float((depth.first_order[i] < 0).double().mean())}
             for i, lab in enumerate(depth.labels)]
    inputs = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: inputs.append((mod, args[0])))
             for m in model.modules() if isinstance(m, (CEMAttention, CEMMLP))]
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
    within = []
    for i, (layer, h) in enumerate(inputs):
        rec = energy_along_recursion(layer, h)
        within.append({"layer": f"{'attention' if isinstance(layer, CEMAttention) else 'MLP'} {i // 2 + 1}",
                       "T": layer.T, "eta": rec.eta,
                       "mean_energy_per_step": [float(e.mean()) for e in rec.energies],
                       "share_rising": rec.share_rising, "mean_change": rec.mean_change})
    return {"along_depth": steps, "within_layer": within}


def decode_flops(model, idx: torch.Tensor) -> dict:
    """Matmul FLOPs of decoding the last token of ``idx`` (1, L) with the other ``L - 1`` kept:
    per sublayer kind, as PyTorch counts them."""
    cache = model.new_cache()
    model(idx[:, :-1], cache=cache)
    x, out, flops = model.tok_emb(idx[:, -1:]), [], {"attention": 0, "mlp": 0}
    for block, c in zip(model.blocks, cache.layers):
        flops["attention"] += count_flops(lambda: out.append(block.attn(x, cache=c)))
        x = out[-1]
        flops["mlp"] += count_flops(lambda: out.append(block.mlp(x)))
        x = out[-1]
    flops["head"] = count_flops(lambda: model.norm_f(x) @ model.head_weight.T)
    flops["total"] = sum(flops.values())
    return flops


def time_per_token(model, setting: dict, prompt: torch.Tensor, n: int) -> float:
    """Seconds per token of greedy decoding ``n`` tokens after ``prompt``, with the cache."""
    with model.recursion(**setting):
        t0 = time.perf_counter()
        model.generate(prompt, n, temperature=0)
        return (time.perf_counter() - t0) / n


def measure(experiment: str, seed: int, runs: Path, energy_windows: int, rounds: int) -> dict:
    T0 = TRAINED_T[experiment]
    folder, fresh, train_s = checkpoint(experiment, seed, runs)
    run = load_trained(folder)
    model = run.model.eval()
    cfg = get_config(experiment, "cpu", [f"train.seed={seed}"])
    task = make_task(cfg)
    C = model.config.context_length
    val = load_shakespeare(cfg.data.val_fraction).val           # the split the task evaluates
    idx = val[: energy_windows * C].view(energy_windows, C)
    out = {"experiment": experiment, "seed": seed, "trained_T": T0, "command": fresh["command"],
           "training_wall_s": fresh["metrics"]["wall_time_s"], "trained_in_this_call": train_s is not None,
           "rerun": rerun_check(experiment, seed, fresh),
           "num_parameters": fresh["num_parameters"], "settings": []}
    for s in settings(T0):
        with model.recursion(**s), torch.no_grad():
            row = {"setting": s, "label": label(s), "val_loss": whole_val_loss(model, task),
                   "energy": energies(model, idx), "decode_flops_per_token": decode_flops(model, val[None, :C])}
        out["settings"].append(row)
        print(f"  {experiment} seed {seed} {label(s):28s} val {row['val_loss']:.4f}", flush=True)
    trained = out["settings"][0]["val_loss"]
    out["trained_setting_matches_training_eval"] = {
        "training": fresh["metrics"]["final_whole_val"]["val_loss"], "here": trained,
        "difference": trained - fresh["metrics"]["final_whole_val"]["val_loss"]}
    prompt, n = val[None, :1], C - 1
    times = {row["label"]: [] for row in out["settings"]}
    with torch.no_grad():
        time_per_token(model, {}, prompt, n)                     # warm-up
        for r in range(rounds):                                   # interleaved, order alternating
            rows = out["settings"] if r % 2 == 0 else out["settings"][::-1]
            for row in rows:
                times[row["label"]].append(time_per_token(model, row["setting"], prompt, n))
    for row in out["settings"]:
        row["decode_s_per_token"] = times[row["label"]]
        row["decode_s_per_token_median"] = statistics.median(times[row["label"]])
    return out


def summarize(runs: list[dict]) -> list[dict]:
    """Per experiment and setting: the mean validation loss and the per-seed difference from the
    trained setting (mean, std, 95 % t-interval), the mean energy change per sublayer, the decode
    FLOPs and the median time per token."""
    out = []
    for experiment in TRAINED_T:
        mine = [r for r in runs if r["experiment"] == experiment]
        if not mine:
            continue
        for i, row in enumerate(mine[0]["settings"]):
            loss = {r["seed"]: r["settings"][i]["val_loss"] for r in mine}
            base = {r["seed"]: r["settings"][0]["val_loss"] for r in mine}
            entry = {"experiment": experiment, "trained_T": mine[0]["trained_T"], "setting": row["setting"],
                     "label": row["label"], "seeds": sorted(loss), "val_loss_mean": statistics.mean(loss.values()),
                     "decode_flops_per_token": row["decode_flops_per_token"],
                     "decode_ms_per_token_median_over_seeds": 1e3 * statistics.median(
                         r["settings"][i]["decode_s_per_token_median"] for r in mine)}
            if i and len(mine) >= 2:
                est = paired(loss, base)
                entry["difference_from_trained"] = {"mean": est.mean, "std": est.std, "n": est.n,
                                                    "low": est.low, "high": est.high, "level": est.level}
            entry["energy_mean_change"] = {
                step["step"]: statistics.mean(r["settings"][i]["energy"]["along_depth"][k]["mean_change"] for r in mine)
                for k, step in enumerate(row["energy"]["along_depth"])}
            entry["energy_share_lowered"] = {
                step["step"]: statistics.mean(r["settings"][i]["energy"]["along_depth"][k]["share_lowered"] for r in mine)
                for k, step in enumerate(row["energy"]["along_depth"])}
            out.append(entry)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiments", nargs="+", default=list(TRAINED_T), choices=list(TRAINED_T))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--runs", default=str(REPO / "runs" / "test_time_recursion"),
                   help="folder of the re-trained runs (default runs/test_time_recursion)")
    p.add_argument("--energy-windows", type=int, default=16, help="validation windows of the energy records")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as the stored runs)")
    add_output_arguments(p, "benchmarks/results/test_time_recursion_cpu.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    default = RESULTS / "test_time_recursion_cpu.json"
    announce(default, args.out, args.replace)
    t0 = time.time()
    device, versions = environment_info(torch.device("cpu"))
    runs = []
    for experiment in args.experiments:
        for seed in args.seeds:
            runs.append(measure(experiment, seed, Path(args.runs), args.energy_windows, args.rounds))
    payload = {"what": __doc__.splitlines()[0],
               "command": command_line(__file__, argv),
               "git_commit": git_commit(REPO), "device": device, "versions": versions,
               "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "grid": {"T": list(T_GRID), "eta": [1.0, *ETA_GRID]},
               "summary": summarize(runs), "runs": runs, "wall_time_s": time.time() - t0}
    write_json(payload, default, args.out, args.replace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
