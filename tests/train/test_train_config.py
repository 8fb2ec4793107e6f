"""cemlib.train configuration, schedule, parameter groups and batching (no training here)."""

import math

import pytest
import torch
from torch import nn

from cemlib.train.cli import main
from cemlib.train.config import (ConfigError, ExperimentConfig, OptimConfig, TrainConfig,
                                 apply_overrides, micro_batch_size)
from cemlib.train.batches import DataMismatchError, TokenBatches
from cemlib.train.registry import build, get_config, load_data
from cemlib.train.optim import WarmupCosine, make_scheduler, param_groups


def test_unknown_experiment_and_preset_name_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown experiment 'nope' \(cemlib train --list shows all \d+\)"):
        get_config("nope", "cpu")
    with pytest.raises(ConfigError, match="unknown preset 'huge'.*known: cpu, gpu"):
        get_config("shakespeare-llama", "huge")


def test_typos_get_a_did_you_mean_not_every_name():
    """Issue 59, papercut: a typo of an experiment printed all 56 names; now the nearest ones."""
    with pytest.raises(ConfigError) as err:
        get_config("shakespeare-lama", "cpu")
    msg = str(err.value)
    assert "did you mean 'shakespeare-llama'" in msg and "gp-gated" not in msg
    with pytest.raises(ConfigError, match=r"preset 'cpux' .*\(did you mean 'cpu'\?\)"):
        get_config("shakespeare-llama", "cpux")
    with pytest.raises(ConfigError, match=r"optim has no field 'lrr' \(did you mean 'lr'\?\)"):
        get_config("shakespeare-llama", "cpu", ["optim.lrr=0.1"])
    with pytest.raises(ConfigError, match=r"\['d_modle'\].*\(did you mean 'd_model'\?\)"):
        get_config("shakespeare-llama", "cpu", ["model.d_modle=8"])
    with pytest.raises(ConfigError, match=r"data.name='gpp' \(did you mean 'gp'\?\)"):
        get_config("shakespeare-llama", "cpu", ["data.name=gpp"])
    with pytest.raises(ConfigError, match=r"\['kernal'\].*\(did you mean 'kernel'\?\)"):
        get_config("gp-gated", "cpu", ["task.kernal=rbf"])


def test_cli_reports_config_errors_with_exit_code_2(capsys):
    assert main(["--experiment", "shakespeare-cem", "--preset", "tpu"]) == 2
    assert "unknown preset 'tpu'" in capsys.readouterr().err
    assert main(["--experiment", "shakespeare-llama", "--set", "train.batch_size=30",
                 "--set", "train.grad_accum=4"]) == 2
    assert "impossible batch split" in capsys.readouterr().err


def test_impossible_batch_accumulation_split():
    with pytest.raises(ConfigError, match=r"batch_size=30 must be divisible by .*grad_accum \(4\)"):
        TrainConfig(batch_size=30, grad_accum=4)
    cfg = TrainConfig(batch_size=12, grad_accum=2)
    assert micro_batch_size(cfg, 1) == 6 and micro_batch_size(cfg, 3) == 2
    with pytest.raises(ConfigError, match=r"world_size \(4\) = 8"):
        micro_batch_size(cfg, 4)


@pytest.mark.parametrize("field,value,match", [
    ("max_steps", 0, "train.max_steps must be a positive integer"),
    ("batch_size", 2.5, "train.batch_size must be a positive integer"),
    ("precision", "fp8", "train.precision must be"),
    ("seed", -1, "train.seed must be a non-negative integer"),
    ("compile_mode", "reduce_overhead", "train.compile_mode must be one of default, reduce-overhead"),
])
def test_bad_train_values_are_named(field, value, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**{field: value})


def test_bad_optim_values_are_named():
    with pytest.raises(ConfigError, match="optim.beta2 must lie in"):
        OptimConfig(beta2=1.0)
    with pytest.raises(ConfigError, match="optim.lr must be a positive"):
        OptimConfig(lr=float("nan"))
    with pytest.raises(ConfigError, match="warmup_steps=10 must be smaller than train.max_steps=10"):
        ExperimentConfig("e", "p", optim=OptimConfig(warmup_steps=10), train=TrainConfig(max_steps=10))


def test_overrides_apply_and_reject_unknown_fields():
    cfg = get_config("shakespeare-llama", "cpu", ["train.max_steps=70", "optim.lr=1", "model.d_model=32"])
    assert cfg.train.max_steps == 70 and cfg.optim.lr == 1.0 and cfg.model["d_model"] == 32
    assert get_config("shakespeare-llama", "cpu").train.max_steps != 70  # presets are not mutated
    with pytest.raises(ConfigError, match="train has no field 'max_step'"):
        apply_overrides(cfg, ["train.max_step=3"])
    with pytest.raises(ConfigError, match="unknown section 'optimizer'"):
        apply_overrides(cfg, ["optimizer.lr=3"])
    with pytest.raises(ConfigError, match="section.field=value"):
        apply_overrides(cfg, ["lr=3"])


def test_config_dict_round_trip():
    cfg = get_config("shakespeare-cem", "gpu")
    assert ExperimentConfig.from_dict(cfg.to_dict()) == cfg


def test_missing_data_file_and_unknown_dataset(tmp_path):
    cfg = get_config("shakespeare-llama", "cpu", [f"data.path={tmp_path / 'missing.txt'}"])
    with pytest.raises(FileNotFoundError, match="data file for data.name='shakespeare' not found"):
        load_data(cfg)
    with pytest.raises(FileNotFoundError, match="not found"):
        build(cfg)
    with pytest.raises(ConfigError, match="unknown dataset data.name='wikitext'"):
        load_data(get_config("shakespeare-llama", "cpu", ["data.name=wikitext"]))


def test_warmup_cosine_schedule_values():
    f = WarmupCosine(warmup_steps=4, max_steps=14, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.2, 0.4, 0.6, 0.8]
    assert f(4) == 1.0
    assert math.isclose(f(9), 0.1 + 0.9 * 0.5)  # half-way through the decay
    assert math.isclose(f(14), 0.1) and math.isclose(f(100), 0.1)
    assert all(f(s) >= f(s + 1) for s in range(4, 20))


def test_scheduler_drives_optimizer_lr():
    p = nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = make_scheduler(opt, OptimConfig(lr=1.0, warmup_steps=1, min_lr_ratio=0.5), max_steps=3)
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == [0.5, 1.0, 0.75, 0.5]


def test_param_groups_decay_matrices_only_and_count_shared_once():
    m = nn.Sequential(nn.Embedding(5, 4), nn.LayerNorm(4), nn.Linear(4, 5))
    m[2].weight = m[0].weight  # tied (shape 5 x 4)
    decay, no_decay = param_groups(m, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [tuple(p.shape) for p in decay["params"]] == [(5, 4)]
    assert sorted(tuple(p.shape) for p in no_decay["params"]) == [(4,), (4,), (5,)]


def test_batches_are_deterministic_and_micro_batches_tile_the_global_batch():
    tokens = torch.arange(1000)
    data = TokenBatches(tokens, context_length=8, seed=3)
    x, y = data.batch(5, 6)
    assert x.shape == (6, 8) and torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y, x + 1)
    assert torch.equal(x, TokenBatches(tokens, 8, seed=3).batch(5, 6)[0])
    assert not torch.equal(x, data.batch(6, 6)[0])
    assert not torch.equal(x, TokenBatches(tokens, 8, seed=4).batch(5, 6)[0])
    parts = [data.micro_batch(5, 6, m, 2)[0] for m in range(3)]
    assert torch.equal(torch.cat(parts), x)


def test_batches_reject_bad_streams_and_detect_mismatch():
    with pytest.raises(ValueError, match="1-D integer tensor"):
        TokenBatches(torch.rand(100), 8)
    with pytest.raises(ValueError, match="too few for windows"):
        TokenBatches(torch.arange(5), 8)
    a = TokenBatches(torch.arange(100), 8, seed=1)
    with pytest.raises(DataMismatchError, match="seed = 2"):
        a.check_state(TokenBatches(torch.arange(100), 8, seed=2).state_dict())
    a.check_state(TokenBatches(torch.arange(100), 8, seed=1).state_dict())


def test_compile_modes_that_replay_cuda_graphs():
    """train.compile_mode: which of torch.compile's modes replay CUDA graphs (the trainer then
    marks each forward as a new step); ``default`` passes no mode at all."""
    from cemlib.train.config import COMPILE_MODES, uses_cuda_graphs
    assert {m: uses_cuda_graphs(m) for m in COMPILE_MODES} == {
        "default": False, "reduce-overhead": True, "max-autotune": True,
        "max-autotune-no-cudagraphs": False}
    assert TrainConfig(compile=True, compile_mode="reduce-overhead").compile_mode == "reduce-overhead"


def test_each_forward_is_a_new_cuda_graph_step_when_graphs_replay(monkeypatch):
    """Under CUDA graphs (train.compile_mode "reduce-overhead") the trainer marks every forward
    of the model, each micro-step's and each evaluation batch's, as a new step for PyTorch's
    graph trees, and none otherwise. Checked on the CPU by counting the marks against the
    forwards of a short run with gradient accumulation and evaluations (failing input: a forward
    without its mark, e.g. the evaluation's)."""
    import cemlib.train.trainer as trainer_mod
    from cemlib.train.registry import build
    cfg = get_config("shakespeare-llama", "cpu", [
        "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "train.batch_size=4",
        "train.grad_accum=2", "train.context_length=16", "train.eval_batches=2",
        "train.eval_interval=2", "train.max_steps=4", "optim.warmup_steps=1",
        "train.final_whole_eval=false"])
    model, task = build(cfg, load_data(cfg))
    marks, forwards = [], []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    model.register_forward_pre_hook(lambda *_: forwards.append(1))
    for graphs in (False, True):
        marks.clear(), forwards.clear()
        t = trainer_mod.Trainer(model, task, cfg, verbose=False)
        t._graphs = graphs  # as on CUDA with compile_mode="reduce-overhead"
        t.fit()
        assert len(forwards) > 4 * 2  # the micro-steps and the evaluations
        assert len(marks) == (len(forwards) if graphs else 0)


def test_compile_mode_at_its_default_keeps_earlier_runs_ids():
    """``train.compile_mode`` came after runs were stored: at ``"default"`` it is left out of a
    run's identity, so a config stored without it (a results file, a run folder to resume) is
    the same run with the same id; another mode is another run (failing input: the field in the
    identity at its default, "train.compile_mode: '(unset)' vs 'default'")."""
    from dataclasses import asdict

    from cemlib.train.folders import identity_differences, run_id
    cfg = get_config("shakespeare-llama", "cpu", [])
    stored = asdict(cfg)
    del stored["train"]["compile_mode"]  # as written before the field existed
    assert identity_differences(stored, cfg) == [] and run_id(stored) == run_id(cfg)
    graphs = get_config("shakespeare-llama", "cpu", ["train.compile_mode=reduce-overhead"])
    assert identity_differences(stored, graphs) == [
        "train.compile_mode: '(unset)' vs 'reduce-overhead'"]
    assert run_id(graphs) != run_id(cfg)
