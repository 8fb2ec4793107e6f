"""The trainer under misuse: each test pins one fault of the review (an unwritable ``--out``,
Ctrl-C, a flipped bit, a layer's NaN, resumed timing, a full disk, a foreign ``--resume`` file,
the token-id check without ``check_finite``, config errors) or one usability fix."""

import errno
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cemlib.train.checkpoint as ckpt_mod
import cemlib.train.trainer as trainer_mod
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.train.cli import main
from cemlib.train.checkpoint import CheckpointError, load_checkpoint
from cemlib.train.config import ConfigError, ExperimentConfig, OptimConfig, TrainConfig
from cemlib.train.batches import TokenBatches
from cemlib.train.registry import EXPERIMENTS, get_config
from cemlib.train.datasets import make_task
from cemlib.train.results import load_results, save_results
from cemlib.train.trainer import NonFiniteError, Trainer, TrainingInterrupted

V, L = 11, 8
REPO = Path(__file__).resolve().parents[2]


class TinyLM(nn.Module):
    """Embedding, one CEM MLP (with its own finite check) and a head."""

    def __init__(self, d=8):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.mlp = CEMMLP(d, 16, check_finite=True)
        self.head = nn.Linear(d, V, bias=False)

    def forward(self, idx):
        return self.head(self.mlp(self.emb(idx)))


def make_trainer(out_dir=None, max_steps=6, verbose=False, model=None, **train):
    torch.manual_seed(0)
    tokens = torch.randint(0, V, (1200,), generator=torch.Generator().manual_seed(1))
    tc = dict(max_steps=max_steps, batch_size=4, context_length=L, eval_interval=3, eval_batches=2,
              log_interval=2, seed=3)
    tc.update(train)
    cfg = ExperimentConfig("tiny", "test", optim=OptimConfig(lr=1e-2, warmup_steps=1),
                           train=TrainConfig(**tc))
    model = (model or TinyLM()).double()
    C = tc["context_length"]
    return Trainer(model, TokenBatches(tokens[:1000], C, seed=3, name="train"),
                   TokenBatches(tokens[1000:], C, seed=4, name="val"), cfg, out_dir=out_dir, verbose=verbose)


TINY_CLI = ["--experiment", "shakespeare-llama", "--preset", "cpu", "--set", "model.d_model=16",
            "--set", "model.n_layers=1", "--set", "model.n_heads=2", "--set", "train.batch_size=4",
            "--set", "train.context_length=16", "--set", "train.eval_batches=1",
            "--set", "optim.warmup_steps=1"]


# ------------------------------------------------------------------------------ 1. unwritable --out
def test_out_dir_under_a_file_fails_before_the_first_step(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError, match=r"cannot be created: .*a_file is a file"):
        make_trainer(blocker / "run")


def test_read_only_out_dir_fails_before_the_first_step(tmp_path, monkeypatch):
    out = tmp_path / "ro"
    out.mkdir()
    real_open = open

    def no_write(path, mode="r", *a, **k):  # a read-only folder (tests may run as root)
        if "w" in mode and Path(path).parent == out:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, mode, *a, **k)
    monkeypatch.setattr(trainer_mod, "open", no_write, raising=False)
    with pytest.raises(PermissionError, match=r"out_dir .*ro is not writable \(Permission denied\)"):
        make_trainer(out)


def test_cli_rejects_unusable_out_in_one_line_before_loading_data(tmp_path, capsys, monkeypatch):
    (tmp_path / "f").write_text("x")
    import cemlib.train.registry as ex
    monkeypatch.setattr(ex, "make_task", lambda cfg: pytest.fail("data loaded before --out was checked"))
    assert main(TINY_CLI + ["--quiet", "--out", str(tmp_path / "f" / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: out_dir") and "is a file" in err[0]


# ------------------------------------------------------------------------------ 2. SIGINT / SIGTERM
@pytest.mark.slow  # a subprocess
def test_sigint_saves_checkpoint_and_results_and_exits_nonzero(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "cemlib.train", *TINY_CLI, "--set", "train.max_steps=100000",
           "--set", "train.log_interval=1", "--set", "train.eval_interval=100000", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("CI", None)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # wait for the per-step training line (printed without a TTY)
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready and proc.poll() is None, "no training line"
            line = proc.stdout.readline()
            if line.startswith("step") and "tokens/s" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "interrupted: SIGINT at step" in err and "Traceback" not in err
    ckpts = sorted(out.glob("ckpt_*.pt"))
    assert ckpts, list(out.iterdir())
    payload = load_checkpoint(ckpts[-1])
    res = load_results(out / "results.json")
    assert res["status"] == "interrupted" and res["metrics"]["steps"] == payload["step"] >= 1
    assert res["timing"]["startup_from"] == "process start" and 0 < res["timing"]["startup_s"] < 120
    assert not list(out.glob("*.tmp"))


def test_sigterm_in_process_stops_after_the_step_with_a_checkpoint(tmp_path):
    class Unhandled(Exception):
        pass

    def outside(signum, frame):  # what SIGTERM does outside fit (here: fail the test, not kill it)
        raise Unhandled
    previous = signal.signal(signal.SIGTERM, outside)
    try:
        _sigterm_run(tmp_path)
        assert signal.getsignal(signal.SIGTERM) is outside  # the trainer restored the handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sigterm_run(tmp_path):
    t = make_trainer(tmp_path, max_steps=50)
    orig = t.train_step

    def step_then_signal():
        out = orig()
        if t.step == 3:  # delivered in the middle of step 4 (0-based step 3)
            os.kill(os.getpid(), signal.SIGTERM)
        return out
    t.train_step = step_then_signal
    with pytest.raises(TrainingInterrupted, match="SIGTERM at step 4/50") as info:
        t.fit()
    assert info.value.signum == signal.SIGTERM and info.value.step == 4
    assert load_checkpoint(tmp_path / "ckpt_000004.pt")["step"] == 4
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "interrupted"
    # and the run resumes from it to the end
    res = make_trainer(tmp_path / "resumed", max_steps=50).fit(resume=tmp_path / "ckpt_000004.pt")
    assert res["status"] == "complete" and res["metrics"]["steps"] == 50


def test_presets_write_periodic_checkpoints():
    for name, exp in EXPERIMENTS.items():
        for preset, cfg in exp.presets.items():
            ci = cfg.train.checkpoint_interval
            assert 0 < ci <= cfg.train.max_steps and cfg.train.max_steps // ci <= 5, (name, preset, ci)


# ------------------------------------------------------------------------------ 3. checksum
def _flip_one_bit_in_largest_tensor(path: Path) -> None:
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    raw = bytearray(path.read_bytes())
    off = info.header_offset
    name_len = int.from_bytes(raw[off + 26:off + 28], "little")
    extra_len = int.from_bytes(raw[off + 28:off + 30], "little")
    data = off + 30 + name_len + extra_len
    raw[data + info.file_size // 2] ^= 0x04
    path.write_bytes(bytes(raw))


def test_flipped_bit_in_the_weights_is_detected(tmp_path):
    make_trainer(tmp_path).fit(until=2)
    path = tmp_path / "ckpt_000002.pt"
    assert load_checkpoint(path)["step"] == 2  # intact: loads
    _flip_one_bit_in_largest_tensor(path)
    with pytest.raises(CheckpointError, match="'ckpt_000002.pt' is corrupted: the checksum"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="checksum"):
        make_trainer().fit(resume=path)


# ------------------------------------------------------------------------------ 4. a layer's NaN
def test_nan_found_by_a_layer_check_goes_through_the_nan_report(tmp_path):
    t = make_trainer(tmp_path)

    def poison(module, args, out):  # NaN embeddings from training step 3 on
        if module.training and t.step >= 3:
            return out * float("nan")
    t.raw_model.emb.register_forward_hook(poison)
    with pytest.raises(NonFiniteError, match=r"at step 3: a layer's finite check found them .*x contains "
                                             r"\d+ NaN/Inf value\(s\).*first offending: no parameter "
                                             r"\(the activations\); last good state \(before step 3\) "
                                             r"saved to last_good.pt"):
        t.fit()
    assert load_checkpoint(tmp_path / "last_good.pt")["step"] == 3


# ------------------------------------------------------------------------------ 5. cumulative timing
def test_resume_keeps_wall_time_and_tokens_cumulative(tmp_path):
    full = make_trainer(tmp_path / "full")
    res_full = full.fit()
    part = make_trainer(tmp_path / "part")
    part.fit(until=4)
    first_wall = load_checkpoint(tmp_path / "part" / "ckpt_000004.pt")["timing"]["wall_time_s"]
    resumed = make_trainer(tmp_path / "part")
    res = resumed.fit(resume=tmp_path / "part" / "ckpt_000004.pt")
    assert resumed.timed_tokens == full.timed_tokens == 5 * full.tokens_per_step  # steps 1..5
    assert res["metrics"]["wall_time_s"] > first_wall > 0
    assert res["timing"]["segments"] == 2 and res["curves"] == res_full["curves"]
    # resuming the finished run keeps its numbers (it used to write 0 tokens/s)
    again = make_trainer(tmp_path / "part").fit(resume=tmp_path / "part" / "last.pt")
    assert res["metrics"]["tokens_per_s"] > 0
    assert again["metrics"]["tokens_per_s"] == pytest.approx(res["metrics"]["tokens_per_s"])
    assert again["metrics"]["wall_time_s"] >= res["metrics"]["wall_time_s"]
    stored = load_results(tmp_path / "part" / "results.json")
    assert stored["metrics"]["tokens_per_s"] > 0 and stored["metrics"]["tokens"] == res["metrics"]["tokens"]


# ------------------------------------------------------------------------------ 7. full disk
def _disk_full(path, data):
    with open(path, "wb") as f:
        f.write(bytes(data)[: len(data) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_names_the_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    t = make_trainer(tmp_path)
    t.fit(until=2)
    before = (tmp_path / "ckpt_000002.pt").read_bytes()
    monkeypatch.setattr(ckpt_mod, "_write_file", _disk_full)
    with pytest.raises(OSError, match=r"cannot write the checkpoint .*ckpt_000002.pt: no space left on "
                                      r"device; the previous ckpt_000002.pt is intact") as info:
        t.save_checkpoint(tmp_path / "ckpt_000002.pt")
    assert info.value.errno == errno.ENOSPC
    assert (tmp_path / "ckpt_000002.pt").read_bytes() == before
    assert load_checkpoint(tmp_path / "ckpt_000002.pt")["step"] == 2
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(OSError, match=r"results file .*r.json: no space left on device"):
        save_results(tmp_path / "r.json", {k: 0 for k in ("schema", "experiment", "preset", "config",
                                                         "metrics", "curves", "num_parameters", "device",
                                                         "versions", "git_commit", "command")})
    assert not list(tmp_path.glob("*.tmp"))  # results files are written the same way


def test_stale_tmp_files_are_removed(tmp_path):
    (tmp_path / "ckpt_000002.pt.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / "results.json.tmp").write_text("{")
    (tmp_path / "keep.txt").write_text("mine")
    make_trainer(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


# ------------------------------------------------------------------------------ 8. foreign --resume
@pytest.mark.parametrize("content", [b"1" + b"\x00" * 64,  # a pickle opcode that used to give IndexError
                                     b"hello world\n" * 100, b"", b'{"schema": "cemlib.train.results/1"}'])
def test_resume_from_a_file_that_is_not_a_checkpoint(tmp_path, content):
    path = tmp_path / "not_a_checkpoint.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="'not_a_checkpoint.pt' is corrupted or truncated"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError):
        make_trainer().fit(resume=path)


def test_resume_from_a_folder_says_so(tmp_path):
    with pytest.raises(CheckpointError, match="is a folder"):
        load_checkpoint(tmp_path)


# ------------------------------------------------------------------------------ 9. token-id check
def test_token_ids_are_checked_without_check_finite():
    from cemlib.models.lm import LanguageModel, LMConfig
    for name in ("shakespeare-llama", "shakespeare-cem"):
        gpu = dict(get_config(name, "gpu").model)
        assert gpu["check_finite"] is False
        gpu.update(d_model=12, n_layers=1, n_heads=2)
        model = LanguageModel(LMConfig(vocab_size=5, context_length=8, **gpu)).eval()
        with pytest.raises(ValueError, match=r"token ids must be in \[0, 5\), got range \[0, 5\]"):
            model(torch.tensor([[0, 1, 5]]))
        with pytest.raises(ValueError, match=r"got range \[-1, 1\]"):
            model(torch.tensor([[-1, 1]]))


# ------------------------------------------------------------------------------ 10. config errors
def test_print_config_rejects_a_model_field_typo(capsys):
    assert main(["--experiment", "shakespeare-llama", "--print-config", "--set", "model.d_modle=64"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: model fields ['d_modle'] are not options of 'shakespeare-llama' (did you mean "
                          "'d_model'?); known:")
    with pytest.raises(ConfigError, match=r"model fields \['n_step'\]"):
        get_config("listops-nrgpt", "cpu", ["model.n_step=3"])
    with pytest.raises(ConfigError, match="model.arch must be one of"):
        get_config("sudoku-hyperset", "cpu", ["model.arch=rnn"])
    get_config("listops-nrgpt", "cpu", ["model.norm_eps=1e-4"])  # a block option: accepted


def test_invalid_model_value_is_one_line(tmp_path, capsys):
    assert main(TINY_CLI + ["--set", "model.n_heads=3", "--quiet", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: the model options of 'shakespeare-llama' are invalid: d_model=16 is not "
                          "divisible by n_heads=3")


def test_own_corpus_as_data_path_is_not_checked_against_shakespeare(tmp_path):
    text = "the quick brown fox jumps over the lazy dog. " * 40
    (tmp_path / "mine.txt").write_text(text)
    cfg = get_config("shakespeare-llama", "cpu", [f"data.path={tmp_path / 'mine.txt'}",
                                                  "train.context_length=16"])
    task = make_task(cfg)
    assert task.info["vocab_size"] == len(set(text))
    assert task.splits["train"].tokens.numel() + task.splits["val"].tokens.numel() == len(text)
    (tmp_path / "tiny.txt").write_text("abc")
    with pytest.raises(Exception, match="too few"):
        make_task(get_config("shakespeare-llama", "cpu", [f"data.path={tmp_path / 'tiny.txt'}"]))


# ------------------------------------------------------------------------------ usability
def test_training_lines_without_a_tty(capsys):
    make_trainer(verbose=True).fit()
    out = capsys.readouterr().out.splitlines()
    train_lines = [x for x in out if "tokens/s" in x]
    assert [x.split()[1] for x in train_lines] == ["2/6", "4/6", "6/6"]
    assert all(" loss " in x and " lr " in x for x in train_lines)


def test_results_record_wall_clock_start_end_and_startup(tmp_path):
    res = make_trainer(tmp_path).fit()
    tm = res["timing"]
    assert tm["start_utc"] < tm["end_utc"] and tm["start_utc"].endswith("Z")
    assert tm["startup_s"] >= 0 and tm["wall_time_s"] == res["metrics"]["wall_time_s"] > 0
    assert tm["final_eval_s"] >= 0 and tm["segments"] == 1
    assert load_results(tmp_path / "results.json")["timing"] == tm


def test_short_runs_clamp_the_preset_warmup_and_say_so():
    notes = []
    cfg = get_config("shakespeare-llama", "cpu", ["train.max_steps=10"], notes)
    assert cfg.optim.warmup_steps == 9 and cfg.optim.warmup(10) == 9
    assert notes == ["the cpu preset's optim.warmup_steps=20 does not fit train.max_steps=10: warm-up "
                     "clamped to 9 steps (set optim.warmup_steps to choose another)"]
    assert get_config("shakespeare-llama", "cpu", ["train.max_steps=1"]).optim.warmup_steps == 0
    with pytest.raises(ConfigError, match="warmup_steps=10 must be smaller"):  # chosen: still an error
        get_config("shakespeare-llama", "cpu", ["train.max_steps=10", "optim.warmup_steps=10"])


def test_help_lists_the_model_fields(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "model fields" in out and "T_attn" in out and "eta_attn" in out and "n_iter" in out


def test_model_typo_fails_before_the_data_loads(tmp_path, capsys, monkeypatch):
    import cemlib.train.registry as ex
    monkeypatch.setattr(ex, "make_task", lambda cfg: pytest.fail("data loaded"))
    assert main(TINY_CLI + ["--set", "model.n_layer=2", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: model fields ['n_layer']")


class Bigram(nn.Module):
    """Logits depend on the current token only, so a window's context does not matter."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(V, V)

    def forward(self, idx):
        return self.table(idx)


def test_final_evaluation_on_the_whole_validation_split(tmp_path):
    t = make_trainer(tmp_path, model=Bigram(), context_length=7)  # 199 targets: 28 windows + a tail
    assert t.cfg.train.context_length == t.task.splits["val"].context_length == 7
    res = t.fit()
    m = res["metrics"]
    val = t.task.splits["val"].tokens
    with torch.no_grad():
        exact = F.cross_entropy(t.raw_model(val[:-1]), val[1:]).item()  # every target once
    assert m["final_whole_val"]["val_loss"] == pytest.approx(exact, rel=1e-6)  # float32 loss
    assert m["final_val_loss"] == res["curves"]["eval"][-1]["val_loss"] != m["final_whole_val"]["val_loss"]
    est = m["estimates"]
    assert est["final_val_loss"].startswith("a sample: 2 fixed batches of 4 random windows of 7 tokens")
    assert est["final_whole_val"].startswith("the whole val split: each of its 199 next-token targets once")
    n = sum(int((y != -100).sum()) for w, (x, y) in t.task.whole_batches("val", 4) if w)
    assert n == val.numel() - 1


def test_the_whole_split_evaluation_can_be_turned_off(tmp_path):
    """Where a forward pass is expensive (the Triton interpreter on a CPU), a run may skip it; the
    results then say so instead of holding a stale or missing number without a word."""
    res = make_trainer(tmp_path, model=Bigram(), context_length=7, final_whole_eval=False).fit()
    m = res["metrics"]
    assert m["final_whole_val"] is None
    assert m["estimates"]["final_whole_val"] == "not evaluated (train.final_whole_eval is false)"
    assert res["timing"]["final_eval_s"] is None
    with pytest.raises(ConfigError, match="final_whole_eval"):
        TrainConfig(final_whole_eval="no")


def test_fixed_dataset_tasks_say_their_val_metrics_are_whole():
    cfg = get_config("gp-gated", "cpu", ["train.max_steps=2", "train.eval_interval=2", "train.batch_size=10",
                                         "task.n_train=40", "model.d_model=8", "model.d_ff=8"])
    from cemlib.train.registry import build
    model, task = build(cfg)
    res = Trainer(model, task, cfg, verbose=False).fit()
    m = res["metrics"]
    assert m["final_whole_val"] == {k: v for k, v in m["final"].items() if k.startswith("val_")}
    assert m["estimates"]["final_val_loss"] == "the whole val split (200 examples)"
    assert not math.isnan(m["final_whole_val"]["val_rmse"])
