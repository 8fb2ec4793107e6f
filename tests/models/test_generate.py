"""Sampling text from trained language models (issue "cemlib as a tool people use", item 2).

Before: no ``generate()`` on any model, no command, and the checkpoint did not carry the vocabulary,
so decoding needed the dataset. Now one :func:`cemlib.models.generation.generate` serves every
causal language model of cemlib (every experiment trained on text), checkpoints and results files
store the character vocabulary, and ``cemlib generate`` samples from a checkpoint in a fresh
process, with one-line errors for wrong inputs.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cemlib.data.shakespeare import CharTokenizer, load_text
from cemlib.generate import main as generate_main
from cemlib.models.generation import generate, sample_next
from cemlib.models.newton_transformer import NewtonTransformer
from cemlib.train.cli import main as train_main
from cemlib.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from cemlib.train.registry import EXPERIMENTS, get_config
from cemlib.train.datasets import make_task
from cemlib.train.results import load_results
from cemlib.train.trained import find_checkpoint, load_trained

REPO = Path(__file__).resolve().parents[2]
V, C = 65, 12  # vocabulary and context of the models built here
#: every registered experiment trained on text: the language-model families of cemlib
LM_EXPERIMENTS = sorted(n for n, e in EXPERIMENTS.items() if e.presets["cpu"].data.name == "shakespeare")
TINY = ["--experiment", "shakespeare-llama", "--preset", "cpu", "--set", "model.d_model=16",
        "--set", "model.n_layers=1", "--set", "model.n_heads=2", "--set", "train.batch_size=4",
        "--set", "train.context_length=16", "--set", "train.eval_batches=1", "--set", "optim.warmup_steps=1",
        "--set", "train.max_steps=8", "--set", "train.final_whole_eval=false", "--quiet"]


def _model(name: str) -> torch.nn.Module:
    cfg = get_config(name, "cpu")
    torch.manual_seed(0)
    return EXPERIMENTS[name].build_model(dict(cfg.model), SimpleNamespace(info={"vocab_size": V, "context_length": C}))


def _prompt(batch=2, length=20) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(5))


# ------------------------------------------------------------------------------ every family
def test_the_text_experiments_cover_every_language_model_family():
    classes = {type(_model(n)).__name__ for n in LM_EXPERIMENTS}
    assert {"LanguageModel", "NRGPTModel", "RecurrentGPTModel", "GPTModel", "NewtonTransformer"} <= classes
    variants = {(m.config.attn, m.config.mlp) for m in map(_model, LM_EXPERIMENTS) if hasattr(m, "config")}
    assert variants == {("llama", "llama"), ("cem", "cem"), ("cem", "llama"), ("llama", "cem")}


@pytest.mark.parametrize("name", LM_EXPERIMENTS)
def test_generate_on_every_language_model(name):
    model = _model(name).train()
    prompt = _prompt()                                   # 20 tokens: longer than the context (12)
    state = torch.get_rng_state()
    out = model.generate(prompt, 15, temperature=1.0, seed=0)
    assert torch.equal(torch.get_rng_state(), state)     # a seed draws from its own generator
    assert out.shape == (2, 35) and out.dtype == torch.long and not out.requires_grad
    assert torch.equal(out[:, :20], prompt) and 0 <= int(out.min()) and int(out.max()) < V
    assert model.training                                # its mode is restored
    assert torch.equal(model.generate(prompt, 15, temperature=1.0, seed=0), out)  # same seed, same text
    assert not torch.equal(model.generate(prompt, 15, temperature=1.0, seed=1), out)
    greedy = model.generate(prompt, 15, temperature=0)
    assert torch.equal(model.generate(prompt, 15, top_k=1, seed=3), greedy)  # top-k = 1 is greedy
    # only the last C tokens are fed: the prompt's last C tokens alone give the same continuation
    assert torch.equal(model.generate(prompt[:, -C:], 15, temperature=0)[:, C:], greedy[:, 20:])
    with torch.no_grad():                                # greedy's first token is the eval-mode arg-max
        first = model.eval()(prompt[:, -C:])[:, -1].argmax(-1)
    assert torch.equal(greedy[:, 20], first)


def test_generation_runs_in_eval_mode_without_gradients():
    model = NewtonTransformer(V, C, d_model=16, n_layers=1, n_heads=2, dropout=0.5).train()
    prompt = _prompt(1, 5)
    a = model.generate(prompt, 10, temperature=0)
    assert torch.equal(model.generate(prompt, 10, temperature=0), a)  # dropout off: deterministic
    assert model.training and all(p.grad is None for p in model.parameters())


def test_one_prompt_as_a_vector_and_zero_new_tokens():
    model = _model("shakespeare-llama")
    p = _prompt(1, 4)[0]
    assert model.generate(p, 3, seed=0).shape == (7,)
    assert torch.equal(model.generate(p, 0), p)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=-1), "max_new_tokens"), (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_k=0), "top_k"), (dict(seed=-1), "seed")])
def test_generate_rejects_bad_options(kwargs, match):
    args = {**dict(max_new_tokens=2, temperature=1.0, top_k=None, seed=None), **kwargs}
    n = args.pop("max_new_tokens")
    with pytest.raises(ValueError, match=match):
        generate(_model("shakespeare-llama"), _prompt(1, 3), n, **args)


def test_generate_rejects_bad_prompts_and_models():
    model = _model("shakespeare-llama")
    with pytest.raises(TypeError, match="LongTensor"):
        generate(model, torch.zeros(1, 3), 2)
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 65\)"):
        generate(model, torch.tensor([[3, 70]]), 2)
    with pytest.raises(TypeError, match="not one of cemlib's causal language models"):
        generate(torch.nn.Linear(3, 3), _prompt(1, 3), 2)


# ------------------------------------------------------------------------------ the sampling rule
def test_samples_follow_the_tempered_softmax_and_top_k():
    n = 40_000
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(n, 1)
    g = torch.Generator().manual_seed(0)
    freq = torch.bincount(sample_next(logits, 0.5, generator=g).flatten(), minlength=4) / n
    torch.testing.assert_close(freq, torch.softmax(logits[0] / 0.5, -1), atol=0.01, rtol=0)  # SE < 0.003
    freq = torch.bincount(sample_next(logits, 1.0, top_k=2, generator=g).flatten(), minlength=4) / n
    torch.testing.assert_close(freq, torch.tensor([0.7311, 0.2689, 0.0, 0.0]), atol=0.01, rtol=0)
    assert torch.equal(sample_next(logits[:3], 0.0), torch.zeros(3, 1, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generate_on_cuda_matches_the_cpu():
    model = _model("shakespeare-cem").double()
    prompt = _prompt()
    cpu = model.generate(prompt, 10, temperature=0)
    gpu = model.cuda().generate(prompt.cuda(), 10, temperature=0)
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)
    assert torch.equal(model.generate(prompt.cuda(), 10, seed=0), model.generate(prompt.cuda(), 10, seed=0))


# ------------------------------------------------------------------------------ the stored vocabulary
def test_char_vocabulary_round_trip():
    text = load_text()
    tok = CharTokenizer(text)
    d = json.loads(json.dumps(tok.to_dict()))
    again = CharTokenizer.from_dict(d)
    assert again.chars == tok.chars and len(again.chars) == 65
    assert again.decode(again.encode("ROMEO: O, she doth teach\n")) == "ROMEO: O, she doth teach\n"
    for bad in ({"kind": "bytes", "chars": "ab"}, {"kind": "characters", "chars": "ba"},
                {"kind": "characters", "chars": "aab"}, {"kind": "characters", "chars": ""}, "ab"):
        with pytest.raises(ValueError):
            CharTokenizer.from_dict(bad)


def test_the_text_task_records_its_vocabulary(tmp_path):
    own = tmp_path / "own.txt"
    own.write_text("abc cab\n" * 200)
    for path, chars in ((None, "".join(CharTokenizer(load_text()).chars)), (str(own), "\n abc")):
        overrides = ["train.context_length=16"] + ([f"data.path={path}"] if path else [])
        info = make_task(get_config("shakespeare-llama", "cpu", overrides)).info
        assert info["tokenizer"] == {"kind": "characters", "chars": chars}
        assert info["vocab_size"] == len(chars)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "run"
    assert train_main([*TINY, "--out", str(out)]) == 0
    return out


def test_checkpoint_and_results_carry_the_vocabulary(run_dir):
    chars = "".join(CharTokenizer(load_text()).chars)
    payload = load_checkpoint(run_dir / "last.pt")
    assert payload["task"]["kind"] == "language_modelling"
    assert payload["task"]["info"]["tokenizer"] == {"kind": "characters", "chars": chars}
    assert load_results(run_dir / "results.json")["task"]["info"]["tokenizer"]["chars"] == chars


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "cemlib.generate", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_generate_command_samples_from_a_checkpoint_in_a_fresh_process(run_dir):
    args = ["--checkpoint", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "40",
            "--temperature", "0.8", "--top-k", "10", "--seed", "0"]
    a, b = _cli(*args, cwd=run_dir.parent), _cli(*args, cwd=run_dir.parent)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.startswith("ROMEO:") and len(a.stdout) == 6 + 40 + 1
    assert "step 8" in a.stderr and "seed 0" in a.stderr
    run = load_trained(run_dir)      # the same sample in this process, from the library
    assert not run.model.training and run.notes == []
    ids = run.model.generate(run.tokenizer.encode("ROMEO:")[None], 40, temperature=0.8, top_k=10, seed=0)
    assert run.tokenizer.decode(ids[0]) + "\n" == a.stdout
    greedy = _cli("--checkpoint", str(run_dir / "last.pt"), "--temperature", "0", cwd=run_dir.parent)
    top1 = _cli("--checkpoint", str(run_dir / "last.pt"), "--top-k", "1", cwd=run_dir.parent)
    assert greedy.returncode == 0 and greedy.stdout == top1.stdout


def _strip_task(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint as written before tasks and vocabularies were stored."""
    payload = load_checkpoint(src)
    payload.pop("task")
    payload.pop("checksum")
    dst.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(dst / "last.pt", payload)


def test_old_checkpoint_without_a_vocabulary_is_decoded_and_says_how(run_dir, tmp_path):
    new = load_trained(run_dir)
    ref = new.model.generate(new.tokenizer.encode("KING")[None], 20, seed=4)
    old = load_trained(_strip_task(run_dir / "last.pt", tmp_path / "old"))
    assert old.tokenizer.chars == new.tokenizer.chars and "rebuilt from the tiny Shakespeare" in old.notes[0]
    assert torch.equal(old.model.generate(old.tokenizer.encode("KING")[None], 20, seed=4), ref)
    shutil.copy(run_dir / "results.json", tmp_path / "old" / "results.json")
    assert "read from results.json" in load_trained(tmp_path / "old").notes[0]


def test_old_checkpoint_of_an_own_text_is_rebuilt_from_that_file(tmp_path):
    own = tmp_path / "own.txt"
    own.write_text("to be or not to be, that is the question.\n" * 60)
    run = tmp_path / "own"
    assert train_main([*TINY, "--set", f"data.path={own}", "--out", str(run)]) == 0
    assert load_trained(run).tokenizer.chars == sorted(set(own.read_text()))
    old = _strip_task(run / "last.pt", tmp_path / "old")
    assert "rebuilt from data.path=" in load_trained(old).notes[0]
    own.unlink()
    with pytest.raises(CheckpointError, match="is not there to rebuild it"):
        load_trained(old)


# ------------------------------------------------------------------------------ one-line errors
def _errors(capsys, *args) -> str:
    assert generate_main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_generate_command_one_line_errors(run_dir, tmp_path, capsys):
    gp = tmp_path / "gp"
    assert train_main(["--experiment", "gp-gated", "--preset", "cpu", "--set", "train.max_steps=2",
                       "--set", "optim.warmup_steps=1", "--set", "train.final_whole_eval=false",
                       "--out", str(gp), "--quiet"]) == 0
    assert "not a language model of text" in _errors(capsys, "--checkpoint", str(gp))
    assert "outside the model's vocabulary: '€'" in _errors(capsys, "--checkpoint", str(run_dir),
                                                            "--prompt", "ROMEO€")
    assert "neither a checkpoint file nor a run folder" in _errors(capsys, "--checkpoint", str(tmp_path / "no"))
    assert "is a results file" in _errors(capsys, "--checkpoint", str(run_dir / "results.json"))
    assert "holds 2 runs" in _errors(capsys, "--checkpoint", str(_two_runs(run_dir, tmp_path)))
    assert "the prompt is empty" in _errors(capsys, "--checkpoint", str(run_dir), "--prompt", "")
    assert "--temperature must be" in _errors(capsys, "--checkpoint", str(run_dir), "--temperature", "-1")
    assert "--top-k must be" in _errors(capsys, "--checkpoint", str(run_dir), "--top-k", "0")
    assert "--num-samples" in _errors(capsys, "--checkpoint", str(run_dir), "--num-samples", "0")
    assert "--device nonsense" in _errors(capsys, "--checkpoint", str(run_dir), "--device", "nonsense")
    if not torch.cuda.is_available():
        assert "CUDA is not available" in _errors(capsys, "--checkpoint", str(run_dir), "--device", "cuda")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert "corrupted or truncated" in _errors(capsys, "--checkpoint", str(tmp_path / "junk.pt"))


def _two_runs(run_dir: Path, tmp_path: Path) -> Path:
    grid = tmp_path / "grid"
    for name in ("a", "b"):
        shutil.copytree(run_dir, grid / name)
    return grid


def test_a_run_folder_finds_its_newest_checkpoint(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for step in (40, 120, 80):
        (run / f"ckpt_{step:06d}.pt").write_bytes(b"")
    assert find_checkpoint(run).name == "ckpt_000120.pt"
    (run / "last.pt").write_bytes(b"")
    assert find_checkpoint(run).name == "last.pt"
    assert find_checkpoint(tmp_path).name == "last.pt"    # a folder holding one run
