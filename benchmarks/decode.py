"""Decoding speed with and without the cache: Llama and CEM at the Shakespeare cpu widths, and
sampling from the README's cpu Llama run.

**Steady-state decode** (``steps``): for each model (``shakespeare-llama`` and ``shakespeare-cem``,
their cpu preset's width, depth and heads; ``context_length`` = the largest context timed; random
weights, the time does not depend on them), batch ``B`` and context ``L``, the time of one new token
per sequence once the window holds about ``L`` tokens: with the cache, ``--steps`` calls
``model(token, cache=...)`` after a prefill of ``L - steps`` tokens (not timed); without it,
``--steps`` forward passes over the windows of ``L - steps + 1 .. L`` tokens, what
``generate(..., use_cache=False)`` runs. Tokens/s = ``B`` / the time per step.

**The README's run** (``readme_run``): ``cemlib train --experiment shakespeare-llama --preset cpu``
(trained into ``--readme-run`` unless a checkpoint is there), then sampling as the README does
(prompt ``"ROMEO:"``, temperature 0.8, top-k 40, seed 0) at a window of 256 tokens (``cemlib
generate --context-length 256``, 250 new tokens: the text fills the window) and at the trained
window of 64 (300 new tokens: past the window, where the cache no longer helps), with and without
the cache, in this process; and the command itself end to end (``cemlib generate``, a fresh
process each, start-up included).

Timing is interleaved: each round times the cached and the uncached way in turn (the order
alternates), so a slow phase of a shared machine hits both; the JSON holds every round's time,
the medians and the median of the per-round ratios (cached over uncached tokens/s). With a GPU the
steady-state rows are also measured there (``--device``)::

    python benchmarks/decode.py --replace        # -> benchmarks/results/decode_cpu.json
    python benchmarks/decode.py --rounds 2 --contexts 64 --batches 1 --out quick.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from cemlib.models.lm import LanguageModel, LMConfig
from cemlib.models.params import kv_cache_bytes_per_token
from cemlib.train import get_config, run_experiment
from cemlib.train.results import environment_info, git_commit
from cemlib.train.trained import find_checkpoint, load_trained
from outputs import RESULTS, add_output_arguments, announce, command_line, write_json

MODELS = {"llama": "shakespeare-llama", "cem": "shakespeare-cem"}
VOCAB = 65  # tiny Shakespeare's characters
README = dict(prompt="ROMEO:", temperature=0.8, top_k=40, seed=0)
REPO = Path(__file__).resolve().parent.parent


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _interleaved(ways: dict, rounds: int, device) -> dict:
    """Each round times every way of ``ways`` (name -> callable) once, the order alternating;
    returns ``{name: [seconds per round]}``."""
    names, times = list(ways), {n: [] for n in ways}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n].append(_timed(ways[n], device))
    return times


def _summary(times: dict, tokens: int) -> dict:
    """Medians of the per-round seconds and tokens/s, and the median per-round ratio of the cached
    tokens/s to the uncached ones."""
    out = {n: {"seconds": t, "median_s": statistics.median(t),
               "tokens_per_s": tokens / statistics.median(t)} for n, t in times.items()}
    out["speedup_median"] = statistics.median(u / c for c, u in zip(times["cache"], times["no_cache"]))
    return out


def steady_state(name: str, batch: int, context: int, steps: int, rounds: int, device, dtype,
                 max_context: int) -> dict:
    """Time per new token at a window of about ``context`` tokens, with and without the cache."""
    m = get_config(MODELS[name], "cpu").model
    cfg = LMConfig(vocab_size=VOCAB, context_length=max_context, **m)
    torch.manual_seed(0)
    model = LanguageModel(cfg).to(device=device, dtype=dtype).eval()
    idx = torch.randint(0, VOCAB, (batch, context), device=device)
    start = context - steps
    state = {}

    def cached():
        cache = model.new_cache()
        model(idx[:, :start], cache=cache)                  # the prefill, not timed
        state["cache"] = cache
        t = _timed(lambda: [model(idx[:, i:i + 1], cache=cache) for i in range(start, context)], device)
        state["t"] = t

    def uncached():
        for i in range(start, context):
            model(idx[:, :i + 1])

    with torch.no_grad():
        cached(), uncached()                                 # warm-up
        times = {"cache": [], "no_cache": []}
        for r in range(rounds):
            for way in (("cache", "no_cache") if r % 2 == 0 else ("no_cache", "cache")):
                if way == "cache":
                    cached()
                    times["cache"].append(state["t"])
                else:
                    times["no_cache"].append(_timed(uncached, device))
    row = {"model": name, "experiment": MODELS[name], "config": cfg.to_dict(), "batch": batch,
           "context": context, "steps_timed": steps, "dtype": str(dtype).replace("torch.", ""),
           "device": device.type,
           "cache_bytes_per_token": sum(state["cache"].bytes_per_token()),
           "cache_bytes_per_token_formula": kv_cache_bytes_per_token(cfg, torch.finfo(dtype).bits // 8),
           "cache_bytes_per_token_formula_bf16": kv_cache_bytes_per_token(cfg, 2)}
    row.update(_summary(times, batch * steps))
    return row


def readme_run(folder: Path, rounds: int, cli_rounds: int) -> dict:
    """Sampling from the README's cpu Llama run, with and without the cache."""
    trained_now = False
    try:
        find_checkpoint(folder)
    except Exception:  # no run there yet: train it with the README's command
        folder.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        res = run_experiment("shakespeare-llama", "cpu", out_dir=folder, verbose=False)
        trained_now = {"wall_s": time.perf_counter() - t0,
                       "final_whole_val_loss": res["metrics"]["final_whole_val"]["val_loss"]}
    run = load_trained(folder)
    tok, model = run.tokenizer, run.model
    prompt = tok.encode(README["prompt"])[None]
    out = {"train_command": "cemlib train --experiment shakespeare-llama --preset cpu",
           "trained_in_this_run": trained_now, "checkpoint_step": run.step,
           "trained_context_length": model.config.context_length, "sampling": README, "cases": []}
    trained = model.config
    for window, new in ((256, 250), (trained.context_length, 300)):
        model.config = dataclasses.replace(trained, context_length=window)
        texts = {}

        def way(use_cache):
            def go():
                ids = model.generate(prompt, new, temperature=README["temperature"], top_k=README["top_k"],
                                     seed=README["seed"], use_cache=use_cache)
                texts[use_cache] = tok.decode(ids[0])
            return go

        with torch.no_grad():
            way(True)(), way(False)()                        # warm-up
            times = _interleaved({"cache": way(True), "no_cache": way(False)}, rounds, torch.device("cpu"))
        case = {"context_length": window, "max_new_tokens": new, "same_text": texts[True] == texts[False],
                "text": texts[True]}
        case.update(_summary(times, new))
        out["cases"].append(case)
    model.config = trained
    cli = [sys.executable, "-m", "cemlib.generate", "--checkpoint", str(folder), "--prompt", README["prompt"],
           "--temperature", str(README["temperature"]), "--top-k", str(README["top_k"]),
           "--seed", str(README["seed"]), "--context-length", "256", "--max-new-tokens", "250"]

    def command(extra):
        def go():
            subprocess.run(cli + extra, check=True, capture_output=True, cwd=REPO)
        return go

    times = _interleaved({"cache": command([]), "no_cache": command(["--no-cache"])}, cli_rounds,
                         torch.device("cpu"))
    out["command"] = {"argv": "cemlib generate --checkpoint RUN --prompt ROMEO: --temperature 0.8 "
                              "--top-k 40 --seed 0 --context-length 256 --max-new-tokens 250 [--no-cache]",
                      **_summary(times, 250)}
    return out


def _load() -> dict:
    try:
        import os
        load1, load5, load15 = os.getloadavg()
        return {"load_average_1_5_15": [load1, load5, load15], "cores": os.cpu_count()}
    except (OSError, AttributeError):
        return {}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--steps", type=int, default=8, help="decode steps timed per round (default 8)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--device", nargs="+", default=None,
                   help="devices of the steady-state rows (default: cpu, and cuda when present)")
    p.add_argument("--readme-run", default=str(REPO / "runs" / "decode-readme-llama"),
                   help="run folder of the README's cpu Llama run (trained there if absent)")
    p.add_argument("--cli-rounds", type=int, default=3, help="rounds of the end-to-end command (default 3)")
    p.add_argument("--skip-readme", action="store_true", help="no README-run measurement")
    add_output_arguments(p, "benchmarks/results/decode_cpu.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    devices = args.device or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    default = RESULTS / "decode_cpu.json"
    announce(default, args.out, args.replace)
    t0 = time.time()
    device_info, versions = environment_info(torch.device("cpu"))
    payload = {"what": __doc__.splitlines()[0], "command": command_line(__file__, argv),
               "git_commit": git_commit(REPO), "device": device_info, "versions": versions,
               "load_before": _load(), "steady_state": []}
    for dev in devices:
        device = torch.device(dev)
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
        if device.type == "cuda":
            payload["gpu"] = environment_info(device)[0]
        for name in args.models:
            for batch in args.batches:
                for context in args.contexts:
                    row = steady_state(name, batch, context, args.steps, args.rounds, device, dtype,
                                       max(args.contexts))
                    payload["steady_state"].append(row)
                    print(f"{dev} {name:6s} B={batch} L={context:5d}: cache {row['cache']['tokens_per_s']:9.1f} "
                          f"tok/s, no cache {row['no_cache']['tokens_per_s']:9.1f} tok/s, "
                          f"x{row['speedup_median']:.1f}", flush=True)
    if not args.skip_readme:
        payload["readme_run"] = readme_run(Path(args.readme_run), args.rounds, args.cli_rounds)
        for case in payload["readme_run"]["cases"]:
            print(f"README run, window {case['context_length']}, {case['max_new_tokens']} tokens: "
                  f"cache {case['cache']['median_s']:.3f} s, no cache {case['no_cache']['median_s']:.3f} s, "
                  f"x{case['speedup_median']:.2f}, same text {case['same_text']}", flush=True)
        c = payload["readme_run"]["command"]
        print(f"cemlib generate end to end: cache {c['cache']['median_s']:.2f} s, no cache "
              f"{c['no_cache']['median_s']:.2f} s, x{c['speedup_median']:.2f}", flush=True)
    payload["load_after"] = _load()
    payload["wall_time_s"] = time.time() - t0
    write_json(payload, default, args.out, args.replace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
