"""Sampling that behaves (issue 59, item 4): text streams as it is drawn, Ctrl-C keeps it, a very
long request says how long it will take, and misuse ends in one line naming the option.

Each test here failed before the change; the failing input and what it gave then:

- streaming: ``cemlib generate`` printed the whole text at the end (one write); the library had
  no way to see a token before the last one was drawn;
- Ctrl-C: a traceback (``KeyboardInterrupt``), 0 characters printed, exit status -2 / 130 from the
  signal;
- ``--max-new-tokens 1000000000``: accepted, nothing printed until the end, no word on how long;
- a checkpoint with a NaN weight, ``--temperature 1e-45``: a traceback ending in ``RuntimeError:
  probability tensor contains either inf, nan or element < 0``;
- ``--seed 18446744073709551616`` (2**64): ``error: Overflow when unpacking long long``;
  ``cemlib train --seeds 100000000000000000000000``: a traceback ending in the same words;
- a checkpoint whose stored vocabulary is shorter than the model's output: ``IndexError: list
  index out of range`` while decoding;
- ``cemlib generate ... | head -c 20`` (a reader that goes away): the whole text was written at the
  end, exit status 0 (now: stopped at the first write after the pipe closed, status 141).
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from cemlib.generate import main as generate_main
from cemlib.models import generation
from cemlib.models.generation import GenerationMixin, generate, sample_next
from cemlib.models.lm import LanguageModel, LMConfig
from cemlib.train.checkpoint import load_checkpoint, save_checkpoint
from cemlib.train.cli import main as train_main

REPO = Path(__file__).resolve().parents[2]
V, C = 13, 12
TINY = ["--experiment", "shakespeare-llama", "--preset", "cpu", "--set", "model.d_model=16",
        "--set", "model.n_layers=1", "--set", "model.n_heads=2", "--set", "train.batch_size=4",
        "--set", "train.context_length=16", "--set", "train.eval_batches=1", "--set", "optim.warmup_steps=1",
        "--set", "train.max_steps=4", "--set", "train.final_whole_eval=false", "--quiet"]
BILLION = "1000000000"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: the models are tiny and the CPU is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(**kw) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(LMConfig(vocab_size=V, context_length=C, d_model=16, n_layers=2, n_heads=2, **kw))


def _prompt(batch=2, length=5) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("behaviour") / "run"
    assert train_main([*TINY, "--out", str(out)]) == 0
    return out


def _edited(run_dir: Path, dst: Path, edit) -> Path:
    """A copy of the run's checkpoint with ``edit(payload)`` applied (checksum rewritten)."""
    payload = load_checkpoint(run_dir / "last.pt")
    payload.pop("checksum")
    edit(payload)
    dst.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(dst / "last.pt", payload)


def _one_line_error(capsys, *args) -> str:
    assert generate_main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------------------ streaming
@pytest.mark.parametrize("use_cache", [True, False])
def test_stream_tokens_yields_each_token_as_it_is_drawn(use_cache):
    model = _model().train()
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    prompt = _prompt()
    stream = model.stream_tokens(prompt, 2 * C, temperature=0.9, top_k=5, seed=3, use_cache=use_cache)
    first = next(stream)
    assert len(calls) == 1 and first.shape == (2,) and first.dtype == torch.long
    assert not model.training                             # eval mode while it streams
    rest = list(stream)                                   # past the window too (2 C new tokens)
    assert model.training and len(rest) == 2 * C - 1      # its mode is restored at the end
    whole = generate(model, prompt, 2 * C, temperature=0.9, top_k=5, seed=3, use_cache=use_cache)
    assert torch.equal(torch.stack([first, *rest], 1), whole[:, 5:])   # the same text as generate


def test_a_stream_closed_early_restores_the_mode():
    model = _model().train()
    stream = generation.stream_tokens(model, _prompt(1, 3), 100, seed=0)
    next(stream)
    stream.close()
    assert model.training


class _Recorder:
    """A stdout that keeps what had been written at every flush."""

    def __init__(self):
        self.text, self.flushed = "", []

    def write(self, s):
        self.text += s
        return len(s)

    def flush(self):
        self.flushed.append(self.text)

    def isatty(self):
        return False


def test_the_command_writes_each_token_as_it_is_drawn(run_dir, monkeypatch):
    out = _Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    assert generate_main(["--checkpoint", str(run_dir), "--prompt", "KING", "--max-new-tokens", "30",
                          "--seed", "0"]) == 0
    assert len(out.text) == 4 + 30 + 1
    lengths = sorted({len(s) for s in out.flushed})
    assert [n for n in lengths if n <= 34] == list(range(4, 35))   # the prompt, then one token a flush


def test_several_samples_stream_one_after_another_each_with_its_own_seed(run_dir, capsys):
    base = ["--checkpoint", str(run_dir), "--prompt", "KING", "--max-new-tokens", "20"]
    assert generate_main([*base, "--seed", "7", "--num-samples", "3"]) == 0
    texts = capsys.readouterr().out.split("-" * 40 + "\n")
    assert len(texts) == 3
    for i, text in enumerate(texts):                      # sample i is --seed 7 + i alone
        assert generate_main([*base, "--seed", str(7 + i)]) == 0
        assert capsys.readouterr().out == text


# ------------------------------------------------------------------------------ Ctrl-C and long requests
def _interrupt_once(stream_real, n_tokens):
    """A stream_tokens that yields ``n_tokens`` real tokens, then raises KeyboardInterrupt."""
    def fake(self, *args, **kwargs):
        for i, tok in enumerate(stream_real(self, *args, **kwargs)):
            if i == n_tokens:
                raise KeyboardInterrupt
            yield tok
    return fake


def test_ctrl_c_keeps_the_text_and_exits_130_with_one_line(run_dir, monkeypatch, capsys):
    monkeypatch.setattr(GenerationMixin, "stream_tokens", _interrupt_once(GenerationMixin.stream_tokens, 25))
    assert generate_main(["--checkpoint", str(run_dir), "--prompt", "KING", "--max-new-tokens", "100",
                          "--seed", "0"]) == 130
    cap = capsys.readouterr()
    assert len(cap.out) == 4 + 25 + 1 and cap.out.startswith("KING") and cap.out.endswith("\n")
    last = cap.err.splitlines()[-1]
    assert last.startswith("interrupted: ") and "25 of 100 new tokens" in last and "Traceback" not in cap.err


def test_a_very_long_request_says_how_long_before_it_starts(run_dir, monkeypatch, capsys):
    monkeypatch.setattr(GenerationMixin, "stream_tokens", _interrupt_once(GenerationMixin.stream_tokens, 5))
    assert generate_main(["--checkpoint", str(run_dir), "--max-new-tokens", BILLION, "--seed", "0"]) == 130
    err = capsys.readouterr().err.splitlines()
    note = [line for line in err if line.startswith("note: 1,000,000,000 new tokens")]
    assert len(note) == 1 and "Ctrl-C" in note[0] and "measured" in note[0], err
    assert err.index(note[0]) < len(err) - 1              # before the text, not after it
    monkeypatch.undo()
    assert generate_main(["--checkpoint", str(run_dir), "--max-new-tokens", "200", "--seed", "0"]) == 0
    assert "new tokens" not in capsys.readouterr().err    # a usual request: no note


@pytest.fixture(scope="module")
def interrupted(run_dir):
    """``cemlib generate --max-new-tokens 1000000000`` in a fresh process, sent SIGINT once 40
    characters of text have arrived (or after 90 s, whichever is first)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cemlib.generate", "--checkpoint", str(run_dir),
                             "--prompt", "KING", "--max-new-tokens", BILLION, "--seed", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=run_dir.parent,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = bytearray()

    def read():
        while chunk := os.read(proc.stdout.fileno(), 4096):
            seen.extend(chunk)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 90
    while len(seen) < 40 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    before = bytes(seen)
    proc.send_signal(signal.SIGINT)
    try:
        err = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    reader.join(timeout=10)
    return before, bytes(seen).decode(), err.decode(), proc.returncode


def test_text_arrives_while_the_command_still_runs(interrupted):
    before, _, _, _ = interrupted
    assert len(before) >= 40 and before.startswith(b"KING")


def test_sigint_keeps_what_was_printed_and_exits_130(interrupted):
    before, out, err, rc = interrupted
    assert rc == 130, err[-2000:]
    assert "Traceback" not in err and out.startswith(before.decode()) and out.endswith("\n")
    lines = err.splitlines()
    assert lines[-1].startswith("interrupted: ") and "of 1,000,000,000 new tokens" in lines[-1]
    assert any(line.startswith("note: 1,000,000,000 new tokens") for line in lines)


def test_a_reader_that_goes_away_stops_it_quietly(run_dir):
    """``cemlib generate ... | head -c 20``: the pipe closes, the command stops without a traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cemlib.generate", "--checkpoint", str(run_dir),
                             "--max-new-tokens", "2000", "--seed", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=run_dir.parent)
    try:
        assert len(proc.stdout.read(20)) == 20
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err
    finally:
        proc.kill()


# ------------------------------------------------------------------------------ one-line errors
def test_non_finite_weights_are_named_before_sampling(run_dir, tmp_path, capsys):
    def poison(payload):
        name = next(k for k, v in payload["model"].items() if v.is_floating_point())
        payload["model"][name] = payload["model"][name].clone()
        payload["model"][name].view(-1)[0] = float("nan")
    bad = _edited(run_dir, tmp_path / "nan", poison)
    err = _one_line_error(capsys, "--checkpoint", str(bad.parent), "--seed", "0")
    assert f"--checkpoint {bad}" in err and "not finite" in err and "1 of" in err, err
    for temperature in ("0", "1"):                        # greedy too (it took the arg-max of NaNs)
        err = _one_line_error(capsys, "--checkpoint", str(bad), "--temperature", temperature)
        assert "not finite" in err


def test_the_library_refuses_non_finite_logits():
    model = _model().eval()
    with torch.no_grad():
        model.norm_f.weight[0] = float("nan")
    for temperature in (0.0, 1.0):
        with pytest.raises(ValueError, match="logits .* not finite"):
            generate(model, _prompt(), 3, temperature=temperature, seed=0)
    with pytest.raises(ValueError, match="not finite"):
        sample_next(torch.tensor([[0.0, float("inf")]]))
    with pytest.raises(ValueError, match="not finite"):
        sample_next(torch.full((1, 3), float("-inf")))
    g = torch.Generator().manual_seed(0)                   # -inf: a token ruled out, allowed
    assert sample_next(torch.tensor([[float("-inf"), 0.0]]), generator=g).item() == 1


@pytest.mark.parametrize("temperature", ["1e-45", "1e-39", "5e-324"])
def test_a_temperature_that_underflows_float32_is_refused_by_name(run_dir, capsys, temperature):
    err = _one_line_error(capsys, "--checkpoint", str(run_dir), "--temperature", temperature)
    assert err.startswith(f"error: --temperature {temperature}") and "--temperature 0" in err, err
    with pytest.raises(ValueError, match="^temperature"):
        generate(_model(), _prompt(), 2, temperature=float(temperature))


def test_a_temperature_that_overflows_the_logits_is_refused_by_name():
    logits = torch.tensor([[100.0, 1.0, -3.0]])
    with pytest.raises(ValueError, match=r"^temperature 1e-37 overflows"):
        sample_next(logits, temperature=1e-37)
    assert sample_next(logits, temperature=1e-30).item() == 0   # finite: sampled as usual


@pytest.mark.parametrize("seed", [str(2**64), str(10**23)])
def test_a_seed_out_of_range_is_refused_by_name(run_dir, capsys, seed):
    err = _one_line_error(capsys, "--checkpoint", str(run_dir), "--seed", seed)
    assert err.startswith("error: --seed must be") and "2**64 - 1" in err and seed in err, err
    with pytest.raises(ValueError, match="^seed must be"):
        generate(_model(), _prompt(), 2, seed=int(seed))
    assert generate_main(["--checkpoint", str(run_dir), "--seed", str(2**64 - 1),
                          "--max-new-tokens", "3"]) == 0   # the largest seed works


def test_the_last_sample_seed_must_fit_too(run_dir, capsys):
    err = _one_line_error(capsys, "--checkpoint", str(run_dir), "--seed", str(2**64 - 1),
                          "--num-samples", "2")
    assert "--seed" in err and "--num-samples 2" in err


@pytest.mark.parametrize("flag", ["--seeds", "--grid"])
def test_train_refuses_seeds_out_of_range_by_name(tmp_path, capsys, flag):
    big = str(10**23)
    args = ["--seeds", f"0,{big}"] if flag == "--seeds" else ["--grid", f"train.seed=0,{big}"]
    assert train_main([*TINY, *args, "--out", str(tmp_path / "grid")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --seeds") and big in err and "2**63 - 1" in err, err
    assert err.count("\n") == 1
    assert not (tmp_path / "grid").exists()               # refused before any run starts


def test_a_vocabulary_that_does_not_match_the_model_is_refused(run_dir, tmp_path, capsys):
    def shorten(payload):
        tok = payload["task"]["info"]["tokenizer"]
        tok["chars"] = tok["chars"][:40]
    bad = _edited(run_dir, tmp_path / "short", shorten)
    err = _one_line_error(capsys, "--checkpoint", str(bad), "--seed", "0")
    assert f"--checkpoint {bad}" in err and "40 characters" in err and "65" in err, err
