"""Gaussian-process regression on 10-D inputs: CEM Table 3, the recursion experiment (chapter 6).

One residual block of width D_h = 64 (the paper gives no widths): a plain MLP, a gated (SwiGLU)
MLP and the CEM MLP with T = 1, 2, 4, 8 recursive steps. The GP kernel is ``task.kernel``.
"""

from cemlib.train.experiment import Experiment, build_regressor, cpu_gpu_presets

MODELS = (  # Gated 3 x 64 x 172 = 33,024 and CEM 2 x 64 x 172 = 22,016 block weights (Table 3:
            # 33.94K vs 22.66K in all); Plain d_ff = 258 ~ 1.5 x 172 matches Gated's count
    ("gp-plain", {"mlp": "plain", "d_ff": 258}, "plain residual MLP"),
    ("gp-gated", {"mlp": "gated", "d_ff": 172}, "gated (SwiGLU) residual MLP"),
    ("gp-cem-t1", {"mlp": "cem", "d_ff": 172, "T": 1}, "CEM MLP, T = 1"),
    ("gp-cem-t2", {"mlp": "cem", "d_ff": 172, "T": 2}, "CEM MLP, T = 2"),
    ("gp-cem-t4", {"mlp": "cem", "d_ff": 172, "T": 4}, "CEM MLP, T = 4"),
    ("gp-cem-t8", {"mlp": "cem", "d_ff": 172, "T": 8}, "CEM MLP, T = 8"))
D_MODEL = 64

CPU_TASK = {"kernel": "rbf", "n_train": 1000}
GPU_TASK = {"kernel": "rbf", "n_train": 4000}        # more data, not more steps: the cpu runs
                                                     # reach train RMSE ~0.01 (NOTES)
CPU_OPTIM = dict(lr=3e-3, beta2=0.99, weight_decay=0.0, warmup_steps=50, min_lr_ratio=0.01)
GPU_OPTIM = dict(CPU_OPTIM, warmup_steps=200)
CPU_TRAIN = dict(max_steps=1500, batch_size=100,     # 150 epochs of 1,000 inputs
                 eval_interval=250, eval_batches=10, log_interval=25)
GPU_TRAIN = dict(max_steps=5000, batch_size=100,     # 125 epochs of 4,000 inputs
                 eval_interval=250, eval_batches=40, log_interval=100)

EXPERIMENTS = [
    Experiment(name, f"GP regression on 10-D inputs (CEM Table 3; kernel: task.kernel): {what}",
               build_regressor,
               cpu_gpu_presets(name, "gp",
                               {"model": {"d_model": D_MODEL, **model}, "task": CPU_TASK,
                                "optim": CPU_OPTIM, "train": CPU_TRAIN},
                               {"model": {"d_model": D_MODEL, **model}, "task": GPU_TASK,
                                "optim": GPU_OPTIM, "train": GPU_TRAIN}))
    for name, model, what in MODELS]
