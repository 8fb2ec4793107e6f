"""Redraw time of the book's live explorers: what a reader waits for after moving a slider.

Each explorer of ``cemlib.viz`` is built as its chapter builds it (same arguments; data made the
same way, or a seeded stand-in where the chapter computes it), then its controls are moved through
a fixed sequence of values, as a reader drags them; every move redraws once. The time of each move
is the kernel's: process CPU time (``time.process_time``, all threads) and wall time, from setting
the control's value to the redraw's return, PNG encoding included (the browser's decoding is not).
The target is 0.3 s of kernel time per redraw.

    python benchmarks/explorer_redraw.py [--rounds 3] [--out benchmarks/results/explorer_redraw_cpu.json]

No frontend is needed: ipywidgets runs without a kernel (its messages go nowhere).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

torch.set_num_threads(1)    # as the chapters do; the explorers' work is small


def _ch01():
    from cemlib.viz import landscape_explorer
    g = torch.Generator().manual_seed(0)
    patterns2d = torch.nn.functional.normalize(torch.randn(4, 2, generator=g, dtype=torch.float64), dim=-1) * 1.5
    e = landscape_explorer(patterns2d, start=(1.6, -1.6), beta=2.0, eta=1.0, rule="cccp", steps=10)
    return e, [("x0", [0.4, -0.3, 1.2]), ("beta", [1.0, 5.0, 2.0]), ("steps", [20, 5, 10])]


def _ch02():
    from cemlib.viz.energy2d import cem_attention_landscape, energy_explorer
    g = torch.Generator().manual_seed(0)
    keys2d = torch.randn(5, 2, generator=g, dtype=torch.float64)

    def attention_panel(tau, alibi_slope, quadratic):
        return cem_attention_landscape(keys2d, tau=tau, alibi_slope=alibi_slope, quadratic=quadratic == "on")

    e = energy_explorer(attention_panel,
                        {"tau": ("temperature τ", 0.1, 4.0, 0.05, 1.0), "alibi_slope": ("ALiBi slope m", 0.0, 4.0, 0.05, 0.0),
                         "quadratic": ("add ½‖x‖² (Chapter 1)", ["off", "on"], "off")},
                        start=tuple(keys2d[-1].tolist()), eta=1.0, steps=6, xlim=(-3, 3), ylim=(-3, 3), label="energy")
    return e, [("x0", [0.5, -1.0, 1.5]), ("params.tau", [0.5, 2.0, 1.0]), ("steps", [12, 3, 6])]


def _ch03():
    from cemlib.viz.energy2d import cem_mlp_landscape, energy_explorer
    g = torch.Generator().manual_seed(0)
    V = torch.randn(6, 2, generator=g, dtype=torch.float64)
    gamma = torch.randn(6, generator=g, dtype=torch.float64)
    e = energy_explorer(lambda phi, variant: cem_mlp_landscape(V, gamma, phi, variant),
                        {"phi": ("activation φ", ["silu", "gelu", "relu2"], "silu"),
                         "variant": ("variant", ["standard", "sign"], "standard")},
                        start=(1.0, 1.0), eta=0.5, steps=10, xlim=(-2.5, 2.5), ylim=(-2.5, 2.5))
    return e, [("x0", [0.5, -1.0, 1.5]), ("params.phi", ["gelu", "relu2", "silu"]), ("eta", [1.0, 0.2, 0.5])]


def _ch06():
    from cemlib.viz.gp import gp_slice_explorer
    e = gp_slice_explorer("rbf", 10 ** 0.5)
    return e, [("ell", [1.0, 5.0, 3.0]), ("kernel", ["periodic", "matern", "rbf"]), ("seed", [1, 2, 0])]


def _ch07():
    from cemlib.viz.nrgpt import token_energy_explorer
    e = token_energy_explorer(c=0.1, gamma_spread=1.0, steps=40, rate="gamma")
    return e, [("c", [0.3, 1.0, 0.1]), ("spread", [0.5, 1.5, 1.0]), ("steps", [60, 20, 40])]


def _ch09():
    from cemlib.viz.hyperset import circle_flow_explorer
    e = circle_flow_explorer(flow="attention", beta=1.0, step=0.1, steps=30)
    return e, [("beta", [2.0, 0.5, 1.0]), ("steps", [60, 10, 30]), ("flow", ["cem", "both", "attention"])]


def _ch10():
    from cemlib.evidence.stored import stored_path
    from cemlib.train.results import load_runs
    from cemlib.viz.benchmark import bench_explorer
    results = stored_path("book/results")
    sweeps = {t: load_runs(results / f"bench_{t}_cpu", by="model") for t in ("shakespeare", "listops")}
    e = bench_explorer(sweeps, {"shakespeare": ["val_loss", "train_loss"],
                                "listops": ["test_accuracy", "val_accuracy", "val_loss", "train_loss"]})
    return e, [("zoom", [0.5, 0.0, 0.3]), ("seeds", ["all", "mean", "band"]), ("metric", ["train_loss", "val_loss"])]


def _ch11():
    from cemlib.viz.roofline import roofline_explorer
    e = roofline_explorer(phase="decode", L=4096, batch=8, head_dim=64, block_m=64)
    return e, [("logL", [10, 14, 12]), ("logB", [5, 1, 3]), ("phase", ["forward", "decode"])]


EXPLORERS = {"ch01 landscape_explorer": _ch01, "ch02 energy_explorer (CEM attention)": _ch02,
             "ch03 energy_explorer (CEM MLP)": _ch03, "ch06 gp_slice_explorer": _ch06,
             "ch07 token_energy_explorer": _ch07, "ch09 circle_flow_explorer": _ch09,
             "ch10 bench_explorer": _ch10, "ch11 roofline_explorer": _ch11}


def _control(explorer, name):
    if name.startswith("params."):
        return explorer.params[name.split(".", 1)[1]]
    return getattr(explorer, name)


def measure(make, rounds: int) -> dict:
    t0 = time.perf_counter()
    explorer, moves = make()
    build_s = time.perf_counter() - t0
    cpu, wall = [], []
    for _ in range(rounds):
        for name, values in moves:
            w = _control(explorer, name)
            for v in values:
                c0, w0 = time.process_time(), time.perf_counter()
                w.value = v
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
    png = getattr(explorer, "image").value
    return {"build_s": build_s, "moves": len(cpu), "cpu_median_s": statistics.median(cpu), "cpu_max_s": max(cpu),
            "wall_median_s": statistics.median(wall), "wall_max_s": max(wall), "png_bytes": len(png),
            "repr": repr(explorer)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="times each sequence of moves is repeated")
    ap.add_argument("--only", action="append", help="explorers whose name contains this (repeatable)")
    ap.add_argument("--out", help="JSON file to write (default: print only)")
    args = ap.parse_args(argv)
    rows = {}
    for name, make in EXPLORERS.items():
        if args.only and not any(s in name for s in args.only):
            continue
        rows[name] = r = measure(make, args.rounds)
        print(f"{name:40s} redraw CPU median {r['cpu_median_s'] * 1e3:6.0f} ms (max {r['cpu_max_s'] * 1e3:5.0f}), "
              f"wall median {r['wall_median_s'] * 1e3:6.0f} ms, PNG {r['png_bytes'] / 1024:.0f} KiB", flush=True)
    if args.out:
        from cemlib.train.results import git_commit
        payload = {"command": " ".join(["python", "benchmarks/explorer_redraw.py"] + (argv or sys.argv[1:])),
                   "git_commit": git_commit(), "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
                   "cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "explorers": rows}
        with open(args.out, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
