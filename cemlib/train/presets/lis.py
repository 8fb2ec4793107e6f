"""The longest increasing subsequence with its DP chain: Newton attention (chapter 8).

Intrinsic optimizers §5, App. A.9: 3 layers, sinusoidal positions, dropout 0.1, AdamW(0.9, 0.999),
lr 1e-4, weight decay 0.01, batch 128, 300 epochs. Four models at two settings: ``lis-*`` (the
paper's length L = 20 on the gpu preset, L = 10 on the cpu preset) and ``lis5-*`` (L = 5, a cpu
setting where greedy decoding of the chain learns within the budget).
"""

from cemlib.train.experiment import Experiment, build_newton, cpu_gpu_presets, cpu_only_presets

MODELS = (
    ("mha", {"attn": "mha"}, "standard multi-head attention with FFN"),
    ("mha2nd1st", {"attn": "mha2nd1st"}, "first-order Newton attention MHA2nd1st with FFN"),
    ("mha-only", {"attn": "mha", "ffn": False}, "standard attention only (no FFN)"),
    ("mha2nd1st-only", {"attn": "mha2nd1st", "ffn": False}, "MHA2nd1st only (no FFN)"))

CPU_MODEL = dict(d_model=64, n_layers=3, n_heads=4)           # the paper's depth
GPU_MODEL = dict(d_model=256, n_layers=3, n_heads=4)
CPU_TASK = dict(L=10, n_train=8000, n_test=300, val_fraction=0.05)
GPU_TASK = dict(L=20,                                         # the paper's length
                n_test=1024,                                  # greedy decoding dominates evaluation
                val_fraction=0.05)
CPU_OPTIM = dict(lr=1e-3, beta2=0.999, weight_decay=0.01, warmup_steps=30, min_lr_ratio=0.1)
GPU_OPTIM = dict(lr=1e-3,                                     # the paper's 1e-4 is tuned for 300 epochs
                 beta2=0.999, weight_decay=0.01,              # App. A.9
                 warmup_steps=200, min_lr_ratio=0.1)
CPU_TRAIN = dict(max_steps=600, batch_size=64, eval_interval=200, eval_batches=4, log_interval=10)
GPU_TRAIN = dict(max_steps=4000,                              # 11 epochs of 48,640 examples
                 batch_size=128,                              # App. A.9
                 eval_interval=250, eval_batches=20, log_interval=50)

L5_TASK = dict(CPU_TASK, L=5)                                 # greedy decoding learns here
L5_OPTIM = dict(CPU_OPTIM, lr=3e-3)
L5_TRAIN = dict(CPU_TRAIN, max_steps=1200)

EXPERIMENTS = [
    *(Experiment(f"lis-{suffix}", f"LIS with the DP chain (intrinsic optimizers §5): {what}", build_newton,
                 cpu_gpu_presets(f"lis-{suffix}", "lis",
                                 {"model": {**CPU_MODEL, **model}, "task": CPU_TASK, "optim": CPU_OPTIM,
                                  "train": CPU_TRAIN},
                                 {"model": {**GPU_MODEL, **model}, "task": GPU_TASK, "optim": GPU_OPTIM,
                                  "train": GPU_TRAIN}))
      for suffix, model, what in MODELS),
    *(Experiment(f"lis5-{suffix}", "LIS with the DP chain at L = 5, a CPU setting where greedy decoding "
                 f"learns: {what}", build_newton,
                 cpu_only_presets(f"lis5-{suffix}", "lis",
                                  {"model": {**CPU_MODEL, **model}, "task": L5_TASK, "optim": L5_OPTIM,
                                   "train": L5_TRAIN}))
      for suffix, model, what in MODELS),
]
