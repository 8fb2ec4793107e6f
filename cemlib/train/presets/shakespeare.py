"""Character-level tiny Shakespeare: the Llama baseline and the CEM models (chapters 2-5).

Every experiment here is one ``model`` change away from ``shakespeare-llama``; the data, optimiser
and schedule are shared, so two presets of the same kind compare models at equal steps.
``cpu``: a 0.4M-parameter model, about a minute on 2 cores. ``gpu``: nanoGPT's shakespeare-char
model (its ``train_shakespeare_char`` config, also NRGPT App. F.4's setting) on a shorter schedule.
The CPU pilots behind the gpu numbers: ``benchmarks/NOTES.md`` ("Preset choices").
"""

from cemlib.train.experiment import Experiment, build_lm, train_config
from cemlib.train.config import ExperimentConfig, OptimConfig

CPU_MODEL = dict(d_model=128, n_layers=2, n_heads=4)    # 0.4M parameters: a minute on 2 cores
CPU_OPTIM = dict(lr=3e-3,                               # Llama's loss at 3e-3 is within 0.01 of
                                                        # the best of book/results/shakespeare_lr_cpu
                 beta2=0.99, min_lr_ratio=0.1,          # as the gpu preset
                 warmup_steps=20)                       # 3 % of the run
CPU_TRAIN = dict(max_steps=600, batch_size=32,          # 600 x 32 x 64 characters: 1.2 passes
                 context_length=64,                     # over the 1.0M training characters
                 eval_interval=50, eval_batches=8,      # 8 batches: a sample; the final model is
                 log_interval=10)                       # also scored on the whole split

GPU_MODEL = dict(d_model=384, n_layers=6, n_heads=6,    # nanoGPT's shakespeare-char size
                 dropout=0.2,                           # nanoGPT's; 0.3 no better, 0 over-fits
                 check_finite=False)                    # the trainer checks every step already
GPU_OPTIM = dict(lr=1e-3, beta2=0.99, warmup_steps=100,  # nanoGPT's
                 min_lr_ratio=0.1)                      # 1e-3 -> 1e-4, as nanoGPT
#: shared with the NRGPT and benchmark gpu presets
GPU_TRAIN = dict(max_steps=900,                         # 15 epochs; nanoGPT's 5,000 over-fit
                 batch_size=64, context_length=256,     # nanoGPT's
                 eval_interval=225, eval_batches=50,    # four evaluations on 50 batches
                 log_interval=10)


def shakespeare_experiment(name: str, attn: str, mlp: str, what: str, cpu_extra=None,
                           gpu_extra=None) -> Experiment:
    """A :class:`~cemlib.models.lm.LanguageModel` on tiny Shakespeare with attention ``attn`` and
    MLP ``mlp`` (``"llama"`` or ``"cem"``), plus model options for each preset."""
    arch = {"attn": attn, "mlp": mlp}
    cpu = ExperimentConfig(experiment=name, preset="cpu",
                           model={**CPU_MODEL, **arch, **(cpu_extra or {})},
                           optim=OptimConfig(**CPU_OPTIM), train=train_config(**CPU_TRAIN))
    gpu = ExperimentConfig(experiment=name, preset="gpu",
                           model={**GPU_MODEL, **arch, **(gpu_extra or {})},
                           optim=OptimConfig(**GPU_OPTIM), train=train_config(**GPU_TRAIN, compile=True))
    return Experiment(name, f"character-level tiny Shakespeare: {what}", build_lm, {"cpu": cpu, "gpu": gpu})


def _pm_width(d_model: int) -> dict:
    """CEM MLP width ``d_v = 1.5 d_ff``: the tied MLP's 2 d d_v weights match SwiGLU's 3 d d_ff."""
    from cemlib.models.lm import default_d_ff
    return {"d_v": 3 * default_d_ff(d_model) // 2}


EXPERIMENTS = [
    shakespeare_experiment("shakespeare-llama", "llama", "llama", "Llama baseline (RoPE attention, SwiGLU)"),
    shakespeare_experiment("shakespeare-cem", "cem", "cem", "full CEM: CEM attention and CEM MLP, T = 1"),
    shakespeare_experiment("shakespeare-cem-attn", "cem", "llama",
                           "CEM attention (tied, T = 1) with the SwiGLU MLP (CEM Fig. 2a)"),
    shakespeare_experiment("shakespeare-cem-mlp", "llama", "cem",
                           "Llama attention with the CEM MLP, dimension-matched d_v = d_ff (CEM Fig. 2b)"),
    shakespeare_experiment("shakespeare-cem-mlp-pm", "llama", "cem",
                           "Llama attention with the CEM MLP, parameter-matched d_v = 1.5 d_ff (CEM Fig. 2b)",
                           _pm_width(CPU_MODEL["d_model"]), _pm_width(GPU_MODEL["d_model"])),
]

# The ablations of CEM §4 (Figs. 2-4): each one config change away from a model above.
for _name, _base, _what, _model in (
        ("shakespeare-cem-t2", ("cem", "cem"), "full CEM with T = 2 recursive steps in every layer "
         "(eqs. 16-17)", {"T_attn": 2, "T_mlp": 2}),
        ("shakespeare-cem-t3", ("cem", "cem"), "full CEM with T = 3 (the paper reports it unstable)",
         {"T_attn": 3, "T_mlp": 3}),
        ("shakespeare-cem-attn-t2", ("cem", "llama"), "CEM attention with T = 2, SwiGLU MLP (Fig. 2c)",
         {"T_attn": 2}),
        ("shakespeare-cem-mlp-t2", ("llama", "cem"), "Llama attention, CEM MLP with T = 2 (Fig. 2d)",
         {"T_mlp": 2}),
        ("shakespeare-cem-attn-diag-none", ("cem", "llama"), "CEM attention without the KQ diagonal "
         "(Fig. 3b)", {"diag": "none"}),
        ("shakespeare-cem-attn-diag-head", ("cem", "llama"), "CEM attention with a per-head KQ "
         "diagonal (Fig. 3b)", {"diag": "per_head"}),
        ("shakespeare-cem-precond-diag", ("cem", "cem"), "full CEM, T = 2, diagonal preconditioners "
         "(§2.8, Fig. 2c-d)", {"T_attn": 2, "T_mlp": 2, "precond_attn": "diag", "precond_mlp": "diag"}),
        ("shakespeare-cem-precond-dplr", ("cem", "cem"), "full CEM, T = 2, diagonal-plus-low-rank "
         "preconditioners (eq. 13, Fig. 2c-d)",
         {"T_attn": 2, "T_mlp": 2, "precond_attn": "dplr", "precond_mlp": "dplr"}),
        ("shakespeare-llama-reuse2", ("llama", "llama"), "Llama with plain layer reuse: every "
         "residual sublayer applied twice (the Fig. 3c/4 baseline)", {"reuse_attn": 2, "reuse_mlp": 2}),
        ("shakespeare-cem-reuse2", ("cem", "cem"), "full CEM (T = 1) with plain layer reuse x2, "
         "against CEM's T = 2 recursion", {"reuse_attn": 2, "reuse_mlp": 2})):
    EXPERIMENTS.append(shakespeare_experiment(_name, *_base, _what, _model, _model))
