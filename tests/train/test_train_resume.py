"""Checkpoints (exact resume, corrupted and mismatched files) and NaN/Inf detection."""

import pytest
import torch
from torch import nn

from cemlib.train.checkpoint import CheckpointError, load_checkpoint
from cemlib.train.config import ExperimentConfig, OptimConfig, TrainConfig
from cemlib.train.batches import TokenBatches
from cemlib.train.trainer import NonFiniteError, Trainer

V, L = 13, 12


class TinyLM(nn.Module):
    """Embedding, dropout, a causal mixing layer and a head: enough to exercise every state."""

    def __init__(self, d=8):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.drop = nn.Dropout(0.2)
        self.mix = nn.Linear(2 * d, d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, V, bias=False)

    def forward(self, idx):
        h = self.drop(self.emb(idx))
        prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
        return self.head(self.norm(h + torch.tanh(self.mix(torch.cat([h, prev], -1)))))


def make(max_steps=12, d=8, **train):
    torch.manual_seed(0)
    tokens = torch.randint(0, V, (3000,), generator=torch.Generator().manual_seed(1))
    tc = dict(max_steps=max_steps, batch_size=8, grad_accum=2, context_length=L, eval_interval=4,
              eval_batches=2, log_interval=1, seed=5)
    tc.update(train)
    cfg = ExperimentConfig("tiny", "test", model={"d": d}, optim=OptimConfig(lr=3e-2, warmup_steps=2),
                           train=TrainConfig(**tc))
    model = TinyLM(d).double()
    return model, TokenBatches(tokens[:2500], L, seed=5, name="train"), \
        TokenBatches(tokens[2500:], L, seed=7, name="val"), cfg


def trainer(tmp, **kw):
    model, tr, va, cfg = make(**kw)
    return Trainer(model, tr, va, cfg, out_dir=tmp, verbose=False)


def test_resume_is_bit_identical(tmp_path):
    full = trainer(tmp_path / "full")
    res_full = full.fit()
    part = trainer(tmp_path / "part")
    part.fit(until=7)  # stop mid-run (not on an eval step), checkpoint written
    resumed = trainer(tmp_path / "resumed")
    res_resumed = resumed.fit(resume=tmp_path / "part" / "ckpt_000007.pt")
    for (name, a), b in zip(full.raw_model.state_dict().items(), resumed.raw_model.state_dict().values()):
        assert torch.equal(a, b), name
    sa, sb = full.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)
    assert res_full["curves"] == res_resumed["curves"]
    # and the run really depends on the restored state: a fresh model trained from step 7 differs
    fresh = trainer(tmp_path / "fresh")
    fresh.step = 7
    fresh.fit()
    assert not torch.equal(fresh.raw_model.head.weight, full.raw_model.head.weight)


def test_checkpoint_loads_weights_only_and_holds_everything(tmp_path):
    t = trainer(tmp_path)
    t.fit(until=3)
    payload = torch.load(tmp_path / "ckpt_000003.pt", weights_only=True)
    assert payload["step"] == 3 and payload["data"]["position"] == 3
    assert set(payload) >= {"model", "optimizer", "scheduler", "rng", "config", "history"}
    assert payload["scheduler"]["last_epoch"] == 3


def test_corrupted_and_foreign_checkpoints_give_clear_errors(tmp_path):
    t = trainer(tmp_path)
    t.fit(until=2)
    good = (tmp_path / "ckpt_000002.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="'trunc.pt' is corrupted or truncated"):
        trainer(tmp_path).fit(resume=tmp_path / "trunc.pt")
    (tmp_path / "noise.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_checkpoint(tmp_path / "noise.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not a cemlib.train checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "absent.pt")


def test_mismatched_checkpoints_name_the_difference(tmp_path):
    trainer(tmp_path).fit(until=2)
    path = tmp_path / "ckpt_000002.pt"
    with pytest.raises(CheckpointError, match=r"optim.lr: checkpoint 0.03 vs now"):
        model, tr, va, cfg = make()
        cfg.optim.lr = 1e-3
        Trainer(model, tr, va, cfg, verbose=False).fit(resume=path)
    with pytest.raises(CheckpointError, match="model.d: checkpoint 8 vs now 6"):
        trainer(None, d=6).fit(resume=path)
    model, tr, va, cfg = make()  # same config, but a model whose tensors differ
    model.head = nn.Linear(8, V, bias=True).double()
    with pytest.raises(CheckpointError, match=r"model tensors absent from the checkpoint \['head.bias'\]"):
        Trainer(model, tr, va, cfg, verbose=False).fit(resume=path)
    t = trainer(None)  # eval settings may change on resume
    t.cfg.train.eval_interval = 3
    t.fit(resume=path, until=3)


def test_nan_loss_stops_naming_step_and_saves_last_good(tmp_path):
    t = trainer(tmp_path)
    calls = {"n": 0}

    def poison(module, args, out):  # NaN activations from the 6th training step on
        if module.training:
            calls["n"] += 1
            if calls["n"] > 2 * 5:  # grad_accum = 2 forward passes per step
                return out * float("nan")
    t.raw_model.norm.register_forward_hook(poison)
    with pytest.raises(NonFiniteError, match=r"at step 5: loss nan.*first offending: parameter "
                                             r"'emb.weight' \(its gradient\).*before step 5"):
        t.fit()
    payload = load_checkpoint(tmp_path / "last_good.pt")
    assert payload["step"] == 5
    ref = trainer(tmp_path / "ref")
    ref.fit(until=5)  # the saved state equals that of a clean run stopped at step 5
    for (name, a), b in zip(ref.raw_model.state_dict().items(), payload["model"].values()):
        assert torch.equal(a, b), name
    assert all(torch.isfinite(v).all() for v in payload["model"].values())


def test_inf_gradient_names_the_first_offending_parameter(tmp_path):
    t = trainer(tmp_path)
    state = {"step": 0}
    t.raw_model.mix.weight.register_hook(lambda g: g * float("inf") if state["step"] >= 3 else g)
    orig = t.train_step

    def counted():
        state["step"] = t.step
        return orig()
    t.train_step = counted
    with pytest.raises(NonFiniteError, match=r"at step 3: loss [0-9.]+, gradient norm (inf|nan); "
                                             r"first offending: parameter 'mix.weight' \(its gradient\)"):
        t.fit()
    assert load_checkpoint(tmp_path / "last_good.pt")["step"] == 3


def test_out_dir_that_is_a_file_fails_before_training(tmp_path):
    """``--out`` names a folder; a file there is refused at once, not after training."""
    f = tmp_path / "results.json"
    f.write_text("{}")
    with pytest.raises(NotADirectoryError, match="out_dir must be a folder"):
        trainer(f)
