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

The text streams: each character is written (and flushed) as soon as it is drawn, so a long
sample is read while it is written, and ``| head`` stops it. ``--num-samples N`` draws the samples
one after another: the first with ``--seed``, the next with ``--seed`` + 1, and so on (any of them
is drawn again alone with its own seed). Ctrl-C stops sampling, keeps what was printed, and says
how far it got in one line (exit status 130). A request longer than the window is timed first:
where it would take more than a minute, a note says about how long (a decode step measured on this
machine) before the text starts; the request is not refused, since the text streams, memory stays
that of the window, and Ctrl-C keeps what was written.

Exit status: 0 on success, 2 for a wrong input (a file that is not a checkpoint, a checkpoint of a
model that does not write text, weights that are not finite, a stored vocabulary that does not
match the model, a prompt with characters outside the vocabulary, a seed or temperature that
cannot be sampled with, a device that is not there), with one line that starts with ``error:``
and names the option; 130 after Ctrl-C; 141 when the reader of the output goes away (a closed pipe).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import sys
import time

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
    p.add_argument("--seed", type=int, default=None,
                   help="random seed, 0 to 2**64 - 1 (default: drawn and printed)")
    p.add_argument("--num-samples", type=int, default=1,
                   help="independent samples, one after another, with seeds --seed, --seed + 1, ... "
                        "(default 1)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:1, ... (default: CUDA when available, else the CPU)")
    p.add_argument("--context-length", type=int, default=None,
                   help="the sampling window in tokens (default: the trained one; LanguageModel only)")
    p.add_argument("--no-cache", action="store_true",
                   help="run the whole window at every step instead of decoding with the cache")
    return p


#: a request expected to take longer than this many seconds is announced with its duration
LONG_REQUEST_S = 60.0
_OPTIONS = ("max_new_tokens", "temperature", "top_k", "seed")


class _Progress:
    """How far sampling got, for the line printed on Ctrl-C."""

    def __init__(self):
        self.started, self.sample, self.samples, self.tokens, self.max_new_tokens = False, 0, 1, 0, 0
        self.mid_line = False   # text written since the last newline


def main(argv: list[str] | None = None, prog: str = "python -m cemlib.generate") -> int:
    args = _parser(prog).parse_args(argv)
    from cemlib.data.shakespeare import ChecksumError
    from cemlib.train.checkpoint import CheckpointError
    from cemlib.train.config import ConfigError
    progress = _Progress()
    try:
        return _generate(args, progress)
    except (CheckpointError, ConfigError, ChecksumError, ValueError, OSError) as err:
        if isinstance(err, BrokenPipeError):
            return _reader_gone()
        _end_line(progress)
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _end_line(progress)
        if not progress.started:
            where = "before any text was written"
        else:
            where = f"{progress.tokens:,} of {progress.max_new_tokens:,} new tokens written"
            if progress.samples > 1:
                where += f" in sample {progress.sample} of {progress.samples}"
            where += "; the text above is kept"
        print(f"interrupted: {where}", file=sys.stderr)
        return 128 + signal.SIGINT


def _end_line(progress: _Progress) -> None:
    """End a line of text cut short, so what follows starts on a line of its own."""
    if progress.mid_line:
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        progress.mid_line = False


def _reader_gone() -> int:
    """The output's reader closed it (``| head``): stop quietly (``python -c`` style status 141)."""
    try:  # Python would complain again when it flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    return 128 + signal.SIGPIPE


def _as_flags(message: str) -> str:
    """A sampling function's message in the command's words: ``temperature ...`` becomes
    ``--temperature ...`` and ``temperature=0`` becomes ``--temperature 0``."""
    for name in _OPTIONS:
        flag = "--" + name.replace("_", "-")
        message = re.sub(rf"(?<![\w-]){name}=", flag + " ", message)
        if message.startswith(name + " "):
            message = flag + message[len(name):]
    return message


def _generate(args, progress: _Progress) -> int:
    from cemlib.train.trained import load_trained
    from cemlib.utils import default_device

    from cemlib.models.generation import MAX_SEED, check_sampling_options

    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be a positive integer, got {args.num_samples}")
    if args.seed is not None and 0 <= args.seed <= MAX_SEED < args.seed + args.num_samples - 1:
        raise ValueError(f"--seed {args.seed} with --num-samples {args.num_samples}: sample i is drawn with "
                         f"seed --seed + i, and the last would be {args.seed + args.num_samples - 1}, past "
                         f"2**64 - 1 (the largest seed); give a smaller --seed")
    try:  # before anything loads
        check_sampling_options(args.max_new_tokens, args.temperature, args.top_k, args.seed)
    except ValueError as err:
        message = _as_flags(str(err))
        if message.startswith("--seed"):
            message = message.replace(" or None", "")   # no seed: leave --seed out
        raise ValueError(message) from None
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
    if not hasattr(run.model, "stream_tokens"):
        raise ValueError(f"{type(run.model).__name__} ({what}) does not generate text")
    _check_weights(run.model, run.checkpoint)
    tok = run.tokenizer
    vocab = run.model.vocab_size
    if len(tok.chars) != vocab:
        fix = (f"ids {len(tok.chars)} to {vocab - 1} would have no character" if len(tok.chars) < vocab
               else f"the characters past the first {vocab} would have no id")
        raise ValueError(f"--checkpoint {run.checkpoint}: its stored vocabulary has {len(tok.chars)} "
                         f"characters but the model writes {vocab} token ids ({fix}): the vocabulary "
                         f"and the weights do not belong together (an edited checkpoint, or one put "
                         f"together from two runs); sample from the run's own checkpoint")
    if args.context_length is not None:
        from cemlib.models.lm import LanguageModel
        if not isinstance(run.model, LanguageModel):
            raise ValueError(f"--context-length: {type(run.model).__name__} ({what}) has a position "
                             f"for each of its {run.model.context_length} tokens; only LanguageModel "
                             f"(Llama and CEM attention) takes another window")
        run.model.config = dataclasses.replace(run.model.config, context_length=args.context_length)
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
    seeds = f"seed {seed}" if args.num_samples == 1 else f"seeds {seed}-{seed + args.num_samples - 1}"
    print(f"{run.checkpoint}: {what}, {n_params:,} parameters, on {device}; {seeds}"
          + ("" if args.seed is not None else f" (--seed {seed} draws this again)"),
          file=sys.stderr, flush=True)
    idx = tok.encode(args.prompt).to(device).unsqueeze(0)
    note = _long_request_note(run.model, idx, args)
    if note:
        print(f"note: {note}", file=sys.stderr, flush=True)
    progress.samples, progress.max_new_tokens, progress.started = args.num_samples, args.max_new_tokens, True
    out = sys.stdout
    for i in range(args.num_samples):
        if i:
            out.write("-" * 40 + "\n")
        progress.sample, progress.tokens = i + 1, 0
        out.write(args.prompt)
        out.flush()
        progress.mid_line = not args.prompt.endswith("\n")
        stream = run.model.stream_tokens(idx, args.max_new_tokens, temperature=args.temperature,
                                         top_k=args.top_k, seed=seed + i, use_cache=not args.no_cache)
        try:
            for nxt in stream:
                text = tok.decode([int(nxt[0])])
                out.write(text)
                out.flush()
                progress.tokens += 1
                progress.mid_line = not text.endswith("\n")
        except ValueError as err:   # what the sampling refused midway (a temperature that overflows)
            message = _as_flags(str(err))
            raise ValueError(message if message.startswith("--") else
                             f"--checkpoint {run.checkpoint}: {message}") from None
        finally:
            stream.close()
        out.write("\n")
        out.flush()
        progress.mid_line = False
    return 0


def _check_weights(model, checkpoint) -> None:
    """Refuse a model with a NaN or infinite weight (or buffer), naming the first and the count."""
    import torch
    bad, total, first = 0, 0, None
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            continue
        total += t.numel()
        n = int((~torch.isfinite(t)).sum())
        if n:
            bad += n
            first = first or name
    if bad:
        raise ValueError(f"--checkpoint {checkpoint}: the weights are not finite: {bad:,} of {total:,} "
                         f"values {'is' if bad == 1 else 'are'} NaN or infinite, the first in {first!r} (a "
                         f"run that diverged, or a damaged file); sample from an earlier checkpoint of the "
                         f"run (a ckpt_<step>.pt, or last_good.pt where training stopped on a non-finite "
                         f"loss)")


def _long_request_note(model, idx, args) -> str | None:
    """A line saying how long the request will take, where that is more than ``LONG_REQUEST_S``.

    Past the window every new token is a forward pass over the whole window (the module docstring
    of :mod:`cemlib.models.generation`); such a step (with the draw) is timed here, the median of
    three after one untimed warm-up, and multiplied by the tokens past the window, over every
    sample. Tokens that fit the window (decoded with the cache) are not counted: the estimate is a
    floor, close for long requests, which are nearly all past the window."""
    import torch

    from cemlib.models.generation import sample_next

    context = model.context_length
    fits = max(0, context - idx.shape[1])
    past = max(0, args.max_new_tokens - fits) * args.num_samples
    if past == 0:
        return None
    window = idx.repeat(1, -(-context // idx.shape[1]))[:, :context]
    sync = torch.cuda.synchronize if idx.device.type == "cuda" else (lambda: None)
    try:
        with torch.no_grad():
            model(window)
            times = []
            for _ in range(3):
                sync()
                start = time.perf_counter()
                sample_next(model(window)[:, -1], 1.0, args.top_k)
                sync()
                times.append(time.perf_counter() - start)
            step = sorted(times)[1]
    except ValueError:   # logits that cannot be sampled: the stream says so, naming the cause
        return None
    total = past * step
    if total <= LONG_REQUEST_S:
        return None
    n = args.max_new_tokens * args.num_samples
    return (f"{n:,} new tokens will take about {_duration(total)} here: past the {context}-token window "
            f"each is a forward pass over the whole window ({step * 1e3:.2g} ms measured); the text "
            f"streams as it is written, and Ctrl-C stops it and keeps what was printed")


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:.0f} seconds"


if __name__ == "__main__":
    sys.exit(main())
