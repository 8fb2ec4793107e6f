"""NRGPT and its baselines on ListOps and character-level Shakespeare (chapter 7).

Three architectures per task, one preset each: NRGPT (the FF2W energy, a learned inference-rate
matrix, one block iterated), the recurrent parallel GPT (``GPT_Rec_parallel`` of the authors' code)
and a standard deep GPT-2. The recurrent models take ``depth`` steps of one block, GPT ``depth``
layers. Why the gpu presets train as long as they do: ``benchmarks/NOTES.md`` ("Preset choices").
"""

from cemlib.train.experiment import Experiment, build_token_model, cpu_gpu_presets
from cemlib.train.presets.shakespeare import GPU_TRAIN as SHAKESPEARE_GPU_TRAIN

ARCHS = {"nrgpt": ({"arch": "nrgpt", "ff": "ff2w"}, "NRGPT (FF2W energy, learned rate matrix)"),
         "rgpt": ({"arch": "rgpt"}, "recurrent parallel GPT (GPT_Rec_parallel)"),
         "gpt": ({"arch": "gpt"}, "standard deep GPT-2")}


def nrgpt_family(prefix: str, data: str, task: dict, cpu_model: dict, gpu_model: dict, cpu_train: dict,
                 gpu_train: dict, cpu_optim: dict, gpu_optim: dict, what: str) -> list[Experiment]:
    """``<prefix>-nrgpt``, ``<prefix>-rgpt`` and ``<prefix>-gpt`` on ``data``: the same presets,
    ``depth`` read as recurrent steps (``n_steps``) or as layers (``n_layers``, GPT)."""
    out = []
    for arch, (extra, label) in ARCHS.items():
        depth = "n_layers" if arch == "gpt" else "n_steps"

        def model(m: dict) -> dict:
            return {**extra, **{k: v for k, v in m.items() if k != "depth"}, depth: m["depth"]}
        name = f"{prefix}-{arch}"
        presets = cpu_gpu_presets(
            name, data,
            {"model": model(cpu_model), "task": task.get("cpu", {}), "optim": cpu_optim, "train": cpu_train},
            {"model": model(gpu_model), "task": task.get("gpu", {}), "optim": gpu_optim, "train": gpu_train})
        out.append(Experiment(name, f"{what}: {label}", build_token_model, presets))
    return out


# ListOps: NRGPT §3.2, App. F.3, the authors' LOPS00 sweep (5 recurrent steps, lr 5e-4 -> 2e-5,
# batch 64, AdamW, clipping 1.0, dropout 0). Loss and accuracy on the answer.
LISTOPS_TASK = {"cpu": {"n_train": 10_000, "n_test": 500, "val_fraction": 0.05},
                "gpu": {"n_train": 50_000, "n_test": 2_000, "val_fraction": 0.05}}
LISTOPS_CPU_MODEL = dict(d_model=32, n_heads=1, depth=3)
LISTOPS_GPU_MODEL = dict(d_model=128, n_heads=4, depth=5)     # LOPS00's 5 steps
LISTOPS_CPU_TRAIN = dict(max_steps=300, batch_size=32, eval_interval=100, eval_batches=4, log_interval=10)
#: shared with the benchmark's ListOps gpu presets
LISTOPS_GPU_TRAIN = dict(max_steps=3000,                      # 4 epochs of 47,500 equations; the
                         batch_size=64,                       # cpu runs end under-trained, not
                         eval_interval=250, eval_batches=50,  # over-fitted (NOTES)
                         log_interval=50)
LISTOPS_CPU_OPTIM = dict(lr=3e-3, beta2=0.99, weight_decay=0.1, warmup_steps=30, min_lr_ratio=0.04)
LISTOPS_GPU_OPTIM = dict(lr=1e-3, beta2=0.99, weight_decay=0.1, warmup_steps=200,
                         min_lr_ratio=0.04)                   # LOPS00's 5e-4 -> 2e-5 ends at 4 %

# Shakespeare: NRGPT §3.3, App. F.4 (context 256, batch 64, beta_2 = 0.99, dropout 0.1, 100 warm-up
# updates) and Table 4's NRGPT_H_FF2W (8 steps, 1 head, width 128).
SHAKESPEARE_CPU_MODEL = dict(d_model=64, n_heads=2, depth=3)
SHAKESPEARE_GPU_MODEL = dict(d_model=128, n_heads=1, depth=8, dropout=0.1)   # Table 4, App. F.4
SHAKESPEARE_CPU_TRAIN = dict(max_steps=300, batch_size=16, context_length=64, eval_interval=50,
                             eval_batches=4, log_interval=10)
SHAKESPEARE_NRGPT_GPU_TRAIN = {**SHAKESPEARE_GPU_TRAIN,
                               "max_steps": 2000,             # 33 epochs: 0.2M-parameter models
                               "eval_interval": 250}          # still improve at 2.5 (NOTES)
SHAKESPEARE_CPU_OPTIM = dict(lr=3e-3, beta2=0.99, warmup_steps=20, min_lr_ratio=0.1)
SHAKESPEARE_GPU_OPTIM = dict(lr=1e-3, beta2=0.99, warmup_steps=100, min_lr_ratio=0.1)   # App. F.4

EXPERIMENTS = [
    *nrgpt_family("listops", "listops", LISTOPS_TASK, LISTOPS_CPU_MODEL, LISTOPS_GPU_MODEL,
                  LISTOPS_CPU_TRAIN, {**LISTOPS_GPU_TRAIN, "compile": True}, LISTOPS_CPU_OPTIM,
                  LISTOPS_GPU_OPTIM, what="ListOps (MAX, MEDIAN, SUM mod 20), answer prediction"),
    *nrgpt_family("shakespeare", "shakespeare", {}, SHAKESPEARE_CPU_MODEL, SHAKESPEARE_GPU_MODEL,
                  SHAKESPEARE_CPU_TRAIN, {**SHAKESPEARE_NRGPT_GPU_TRAIN, "compile": True},
                  SHAKESPEARE_CPU_OPTIM, SHAKESPEARE_GPU_OPTIM,
                  what="character-level tiny Shakespeare (NRGPT §3.3)"),
]
