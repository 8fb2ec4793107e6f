"""The ``cemlib`` command (installed by ``pip install``): one command, two subcommands.

``cemlib train ...`` is ``python -m cemlib.train ...`` (:func:`cemlib.train.cli.main`) and
``cemlib generate ...`` is ``python -m cemlib.generate ...`` (:func:`cemlib.generate.main`) and
``cemlib export ...`` writes a run's weights as safetensors (:func:`cemlib.train.export.main`); the
arguments after the subcommand are passed on unchanged, and so is the exit status.
"""

from __future__ import annotations

import importlib
import inspect
import sys

__all__ = ["main", "COMMANDS"]

#: subcommand -> (module whose ``main(argv) -> int`` runs it, what it does)
COMMANDS = {
    "train": ("cemlib.train.cli", "train a named experiment and preset, or a grid of them"),
    "generate": ("cemlib.generate", "sample text from a trained language model's checkpoint"),
    "export": ("cemlib.train.export", "write a trained run's weights as safetensors (model.safetensors)"),
}

USAGE = """usage: cemlib {train,generate,export} [ARGS ...]
       cemlib --help | --version

Energy-based Transformer layers: train the book's experiments and sample from the models.

commands:
%s

Each command has its own --help (cemlib train --help, cemlib generate --help, cemlib export --help).
`python -m cemlib.train` and `python -m cemlib.generate` are the same commands.

examples:
  cemlib train --list                                      # experiments and their presets
  cemlib train --experiment shakespeare-llama --preset cpu # a character-level model, ~1 min on a CPU
  cemlib train --resume RUN_FOLDER                         # continue a run stopped with Ctrl-C
  cemlib train --experiment shakespeare-llama --preset cpu --set data.path=my_text.txt
  cemlib generate --checkpoint RUN_FOLDER --prompt "ROMEO:" --max-new-tokens 200 \
      --temperature 0.8 --top-k 40 --seed 0
  cemlib export RUN_FOLDER                                 # its weights as RUN_FOLDER/model.safetensors

A run writes results.json (config, metrics, curves, device, the command that reproduces it) and
its checkpoints into one folder, by default under runs/ (named by the experiment, the preset and
the configuration); the last line it prints names the folder.

exit status: 0 success; 2 a wrong input (one line "error: ..."); 1 NaN/Inf in training;
128 + the signal number when training was stopped by a signal after saving a checkpoint (130 for
Ctrl-C; see cemlib train --help).
"""


def _usage() -> str:
    return USAGE % "\n".join(f"  {name:<10} {what}" for name, (_, what) in COMMANDS.items())


def main(argv: list[str] | None = None) -> int:
    """Run ``cemlib <command> ARGS``; returns the command's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage(), end="")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        import cemlib
        print(f"cemlib {cemlib.__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; choose one of: {', '.join(COMMANDS)} (cemlib --help)",
              file=sys.stderr)
        return 2
    run = importlib.import_module(COMMANDS[name][0]).main
    if "prog" in inspect.signature(run).parameters:  # so that its --help says "cemlib <name>"
        return run(rest, prog=f"cemlib {name}")
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
