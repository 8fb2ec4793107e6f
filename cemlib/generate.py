"""Sample text from a trained language model: ``cemlib generate`` (or ``python -m cemlib.generate``).

    cemlib generate --checkpoint RUN_FOLDER --prompt "ROMEO:" \\
        --max-new-tokens 200 --temperature 0.8 --top-k 40 --seed 0

``--checkpoint`` takes a checkpoint file or a run folder (its ``last.pt``, else its newest
``ckpt_<step>.pt``). The vocabulary comes from the checkpoint itself, so the text the model was
trained on is not needed (an older checkpoint without one: see :mod:`cemlib.train.trained`). The
prompt and what the model writes after it go to standard output; what was loaded, and the seed, to
standard error. ``--temperature 0`` is greedy decoding (the most likely character every time);
without ``--seed`` a random seed is drawn and printed, so any sample can be drawn again.

Sampling decodes with the model's cache (the prompt once, then one token at a time; see
:mod:`cemlib.models.generation`); ``--no-cache`` runs the whole window at every step instead (the
same text, slower). ``--context-length N`` samples with a window of ``N`` tokens instead of the one
the model was trained with: only for the models of ``LanguageModel`` (Llama and CEM attention),
whose positions (RoPE, ALiBi) have no learned table; past the trained length the text is
extrapolation.

Exit status: 0 on success, 2 for a wrong input (a file that is not a checkpoint, a checkpoint of a
model that does not write text, a prompt with characters outside the vocabulary, a device that is
not there), with one line that starts with ``error:``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

__all__ = ["main"]


def _plain(text: str) -> str:
    """The module docstring as plain text for ``--help`` (no reST markup)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def _parser(prog: str) -> argparse.ArgumentParser:
    doc = _plain(__doc__)
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0],
                                epilog="\n".join(doc.splitlines()[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, metavar="PATH_OR_RUN_DIR",
                   help="a checkpoint file (last.pt, ckpt_<step>.pt) or a run folder")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens (characters) to write (default 200)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="softmax temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None,
                   help="sample among the k most likely tokens only (default: all)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: drawn and printed)")
    p.add_argument("--num-samples", type=int, default=1, help="independent samples (default 1)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:1, ... (default: CUDA when available, else the CPU)")
    p.add_argument("--context-length", type=int, default=None,
                   help="the sampling window in tokens (default: the trained one; LanguageModel only)")
    p.add_argument("--no-cache", action="store_true",
                   help="run the whole window at every step instead of decoding with the cache")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m cemlib.generate") -> int:
    args = _parser(prog).parse_args(argv)
    from cemlib.data.shakespeare import ChecksumError
    from cemlib.train.checkpoint import CheckpointError
    from cemlib.train.config import ConfigError
    try:
        return _generate(args)
    except (CheckpointError, ConfigError, ChecksumError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _generate(args) -> int:
    from cemlib.train.trained import load_trained
    from cemlib.utils import default_device

    from cemlib.models.generation import check_sampling_options

    try:  # before anything loads
        check_sampling_options(args.max_new_tokens, args.temperature, args.top_k, args.seed)
    except ValueError as err:
        raise ValueError(f"--{str(err).replace('_', '-')}") from None
    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be a positive integer, got {args.num_samples}")
    if args.context_length is not None and args.context_length < 1:
        raise ValueError(f"--context-length must be a positive integer, got {args.context_length}")
    try:
        device = default_device(args.device)
    except RuntimeError as err:  # an unknown device string, or CUDA asked for where there is none
        raise ValueError(f"--device {args.device}: {err}") from None
    run = load_trained(args.checkpoint, device)
    cfg = run.config
    what = f"{cfg.get('experiment')} ({cfg.get('preset')} preset), step {run.step}"
    if run.task_kind != "language_modelling" or run.tokenizer is None:
        data = cfg.get("data", {}).get("name")
        raise ValueError(f"checkpoint {run.checkpoint} is {what}, trained on {data!r} "
                         f"({run.task_kind or 'unknown task'}), not a language model of text: generate "
                         f"samples from models trained on a text (data.name=shakespeare, or your own "
                         f"file with data.path)")
    if not hasattr(run.model, "generate"):
        raise ValueError(f"{type(run.model).__name__} ({what}) does not generate text")
    if args.context_length is not None:
        from cemlib.models.lm import LanguageModel
        if not isinstance(run.model, LanguageModel):
            raise ValueError(f"--context-length: {type(run.model).__name__} ({what}) has a position "
                             f"for each of its {run.model.context_length} tokens; only LanguageModel "
                             f"(Llama and CEM attention) takes another window")
        run.model.config = dataclasses.replace(run.model.config, context_length=args.context_length)
    tok = run.tokenizer
    unknown = sorted({c for c in args.prompt if c not in tok.stoi})
    if unknown:
        raise ValueError(f"the prompt has characters outside the model's vocabulary: "
                         f"{''.join(unknown)!r} (the vocabulary: {''.join(tok.chars)!r})")
    if not args.prompt:
        raise ValueError("the prompt is empty: give at least one character (the default is a newline)")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") % 2**31
    n_params = sum(p.numel() for p in run.model.parameters())
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{run.checkpoint}: {what}, {n_params:,} parameters, on {device}; seed {seed}"
          + ("" if args.seed is not None else f" (--seed {seed} draws this sample again)"),
          file=sys.stderr, flush=True)
    idx = tok.encode(args.prompt).to(device).unsqueeze(0).repeat(args.num_samples, 1)
    out = run.model.generate(idx, args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, seed=seed, use_cache=not args.no_cache)
    for i, row in enumerate(out.tolist()):
        if i:
            print("-" * 40)
        print(tok.decode(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
