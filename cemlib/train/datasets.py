"""Named datasets -> :class:`~cemlib.train.tasks.Task` objects: ``make_task(cfg)``.

``cfg.data.name`` picks the dataset; ``cfg.task`` holds its keyword arguments (set them with
``--set task.<name>=<value>``; unknown names are an error that lists the known ones). The data
are generated from seeds or shipped with cemlib; nothing is downloaded. ``data_seed`` fixes the
dataset itself, ``train.seed`` the model initialisation and the batch order, so seeds of one
experiment train on the same data.

:func:`check_data_config` validates a config's data side before anything loads (it runs in
:func:`~cemlib.train.registry.get_config`): the dataset name, every ``task.*`` option's name,
type and range (numbers finite, ``data_seed`` >= 0, ``n_*`` >= 1, ``*_fraction`` in (0, 1)), and
that the fields a dataset does not read (:func:`unused_fields`: ``data.path``,
``data.val_fraction``, ``train.context_length``) keep their preset's values instead of being
ignored in silence. Results files leave those fields out. A user's own file (``data.path``: a text file for
``shakespeare``, a ``.npz`` for ``sudoku``, the CIFAR-10 folder) is read without the shipped
file's checksum, checked for completeness, and described in ``task.info["data_source"]``.

=============  ==========================================  ============================================
name           task                                        splits
=============  ==========================================  ============================================
shakespeare    next character (language modelling)         train / val (``data.val_fraction``)
listops        the answer token after ``=`` (NRGPT §3.2)   train / val (``val_fraction`` of train) /
                                                           test
lis            the DP chain and the LIS length (App. A.9)  train / val / test
gp             GP regression on 10-D inputs (Table 3)      train / val / test (one GP draw)
sudoku         a digit per blank cell (Hyper-SET §5.1)     train / val / test (shipped hard set)
digits         8x8 digits as patch sequences               train / val / test (stratified)
cifar10        CIFAR-10 as patch sequences, opt-in         train / val / test, from a local copy
=============  ==========================================  ============================================
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import numpy as np
import torch

from cemlib.train.config import ConfigError, did_you_mean
from cemlib.train.batches import TokenBatches
from cemlib.train.tasks import (IGNORE_INDEX, AnswerTask, ClassificationTask, LanguageModelTask,
                                RegressionTask, Task, TaskDataError, TokenClassificationTask)

__all__ = ["TASKS", "make_task", "split_off", "load_cifar10", "unused_fields", "check_data_config",
           "recorded_config", "CIFAR10_RECORDS", "data_label", "KINDS"]


def split_off(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices ``(keep, held_out)``: a seeded ``fraction`` of ``range(n)`` held out (at least 1)."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"val_fraction must lie in (0, 1), got {fraction!r}")
    perm = torch.from_numpy(np.random.default_rng([seed, 7]).permutation(n))
    k = max(1, round(fraction * n))
    if k >= n:
        raise TaskDataError(f"cannot hold out {k} of {n} examples and keep a training set")
    return perm[k:].sort().values, perm[:k].sort().values


def _stack(ds) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(ds[i] for i in range(len(ds))))
    return torch.stack(xs), torch.stack(ys)


# ------------------------------------------------------------------------------ factories
def _check_file_path(d, what: str) -> None:
    """``data.path`` must name an existing file (not a folder)."""
    if d.path is None:
        return
    p = Path(d.path)
    if p.is_dir():
        raise IsADirectoryError(f"data.path={d.path!r} is a folder; the {d.name!r} data read one file "
                                f"({what})")
    if not p.is_file():
        raise FileNotFoundError(f"data file for data.name={d.name!r} not found: data.path={d.path!r} "
                                f"(leave data.path unset to use the copy shipped with cemlib)")


def _shakespeare(cfg, *, train_chars: int | None = None) -> Task:
    """``train_chars``: train on the first ``train_chars`` characters of the train split only (the
    validation split is unchanged), a scaled-down corpus for pilots of the over-fitting dynamics."""
    d, tc = cfg.data, cfg.train
    if train_chars is not None and (isinstance(train_chars, bool) or not isinstance(train_chars, int)
                                    or train_chars < tc.context_length + 2):
        raise ConfigError(f"task.train_chars must be an integer >= train.context_length + 2 = "
                          f"{tc.context_length + 2}, got {train_chars!r}")
    _check_file_path(d, "a UTF-8 text file, or a .gz of one")
    from cemlib.data.shakespeare import load_shakespeare
    try:  # own text is read without a checksum; the SHA-256 check applies to the shipped file only
        s = load_shakespeare(val_fraction=d.val_fraction, path=d.path)
    except ValueError as err:
        if "cannot decompress" in str(err):
            why = str(err).split("cannot decompress", 1)[1].strip(" ()")
            raise TaskDataError(f"data.path={d.path!r} is a truncated or corrupted gzip file ({why}); replace it "
                                f"with a complete copy, or give the uncompressed text") from None
        raise TaskDataError(f"data.path={d.path!r}: {err}") from None
    if train_chars is not None and train_chars > s.train.numel():
        raise ConfigError(f"task.train_chars={train_chars} exceeds the {s.train.numel()} characters of "
                          f"the train split")
    try:
        train = TokenBatches(s.train if train_chars is None else s.train[:train_chars], tc.context_length,
                             seed=tc.seed, name="train")
        val = TokenBatches(s.val, tc.context_length, seed=tc.seed + 2, name="val")
    except ValueError as err:  # e.g. a corpus too short for the context length
        raise TaskDataError(f"data.path={d.path!r}: {err}") from None
    task = LanguageModelTask(train, val, s.tokenizer.vocab_size, tc.eval_batches,
                             tokenizer=s.tokenizer.to_dict())
    if d.path is not None:
        n = s.train.numel() + s.val.numel()
        task.info["data_source"] = (f"{d.path}: {n:,} characters, {s.tokenizer.vocab_size} distinct; "
                                    f"{s.train.numel():,} train / {s.val.numel():,} val")
    return task


def _listops(cfg, *, n_train: int = 50_000, n_test: int = 2_000, modulus: int = 20, max_depth: int = 2,
             min_args: int = 2, max_args: int = 3, func_prob: float = 0.25, val_fraction: float = 0.1,
             loss_on: str = "answer", hide_answer: bool = False, data_seed: int = 0) -> Task:
    """``loss_on="answer"``: loss on the answer token only; ``"all"``: on every next token of the
    equation (padding excluded); the accuracy always scores the answer. ``hide_answer=True``
    replaces the answer token (and the padding after it) in the *inputs* by ``<pad>``, so that a
    bidirectional model (Hyper-SET) cannot read the answer it predicts at ``=``; a causal model's
    logits at the scored positions are unchanged (it never sees columns after ``=``)."""
    from cemlib.data.listops import make_listops
    if loss_on not in ("answer", "all"):
        raise ConfigError(f"task.loss_on must be 'answer' or 'all', got {loss_on!r}")
    if not isinstance(hide_answer, bool):
        raise ConfigError(f"task.hide_answer must be true or false, got {hide_answer!r}")
    s = make_listops(n_train, n_test, seed=data_seed, modulus=modulus, max_depth=max_depth,
                     min_args=min_args, max_args=max_args, func_prob=func_prob)

    def arrays(ds, idx=None):
        x, y = _stack(ds)
        mask = y != IGNORE_INDEX
        if hide_answer:  # columns answer_pos.. of the inputs (the answer, then padding) -> <pad>
            x = x.masked_fill(torch.arange(x.shape[1]) >= ds.answer_pos[:, None], s.tokenizer.pad_id)
        if loss_on == "all":
            y = ds.tokens[:, 1:].masked_fill(ds.tokens[:, 1:] == s.tokenizer.pad_id, IGNORE_INDEX)
        return (x, y, mask) if idx is None else (x[idx], y[idx], mask[idx])

    keep, val = split_off(len(s.train), val_fraction, data_seed)
    splits = {"train": arrays(s.train, keep), "val": arrays(s.train, val), "test": arrays(s.test)}
    return AnswerTask(splits, s.tokenizer.vocab_size, cfg.train.seed, cfg.train.eval_batches)


def _lis(cfg, *, L: int = 10, n_train: int = 51_200, n_test: int = 5_120, cot: bool = True,
         val_fraction: float = 0.1, score: str = "answer", data_seed: int = 0) -> Task:
    """Loss on every output token (the DP chain and the answer, App. A.9's "answer tokens");
    ``score="answer"`` scores the final LIS length, ``"all"`` the whole output. The accuracy is
    teacher-forced; ``greedy_accuracy`` generates the output (the paper's test metric)."""
    from cemlib.data.lis import make_lis
    if score not in ("answer", "all"):
        raise ConfigError(f"task.score must be 'answer' or 'all', got {score!r}")
    s = make_lis(L, n_train, n_test, seed=data_seed, cot=cot)

    def arrays(ds, idx=None):
        x, y = _stack(ds)
        mask = y != IGNORE_INDEX
        if score == "answer":
            mask = torch.zeros_like(mask)
            mask[:, -1] = True
        return (x, y, mask) if idx is None else (x[idx], y[idx], mask[idx])

    keep, val = split_off(len(s.train), val_fraction, data_seed)
    splits = {"train": arrays(s.train, keep), "val": arrays(s.train, val), "test": arrays(s.test)}
    return AnswerTask(splits, s.vocab.vocab_size, cfg.train.seed, cfg.train.eval_batches, greedy=True)


def _gp(cfg, *, kernel: str = "rbf", n_train: int = 1000, n_val: int = 200, n_test: int = 200, d: int = 10,
        lengthscale: float | None = None, nu: float = 1.5, noise_std: float = 0.0, data_seed: int = 0) -> Task:
    """One GP draw at ``n_train + n_val + n_test`` inputs (:func:`cemlib.data.gp.make_gp_regression`)."""
    from cemlib.data.gp import make_gp_regression
    try:
        g = make_gp_regression(kernel, n_train, n_val + n_test, d, lengthscale, nu, noise_std, data_seed)
    except ValueError as err:
        raise ConfigError(f"gp task: {err}") from None
    splits = {"train": (g.x_train, g.y_train), "val": (g.x_test[:n_val], g.y_test[:n_val]),
              "test": (g.x_test[n_val:], g.y_test[n_val:])}
    return RegressionTask(splits, cfg.train.seed, cfg.train.eval_batches)


def _sudoku(cfg, *, loss_on: str = "all", n_train: int | None = None, n_test: int | None = None,
            val_fraction: float = 0.1, blanks: int | None = None, data_seed: int = 0) -> Task:
    """The shipped hard set (``data.path`` for another ``.npz`` in the same format). Inputs: 81 tokens
    0..9 (0 = blank); classes 0..8 (digit - 1); the accuracies score the blanks. ``blanks``: keep
    only that many blank cells per puzzle, the others filled in from the solution (an easier set
    with the same solutions, :meth:`~cemlib.data.sudoku.SudokuDataset.with_blanks`)."""
    from cemlib.data.sudoku import SudokuSplits, load_sudoku
    _check_file_path(cfg.data, "a .npz in the layout of cemlib.data.sudoku.load_sudoku")
    try:
        s = load_sudoku(cfg.data.path)  # the SHA-256 check applies to the shipped file only
    except ValueError as err:
        if cfg.data.path is None:
            raise
        raise TaskDataError(f"data.path={cfg.data.path!r} cannot be read as a Sudoku set: it is truncated or "
                            f"corrupted, or not a .npz in the layout of cemlib.data.sudoku ({err})") from None
    if blanks is not None:
        if isinstance(blanks, bool) or not isinstance(blanks, int) or not 1 <= blanks <= 81:
            raise ConfigError(f"task.blanks must be an integer in 1..81, got {blanks!r}")
        s = SudokuSplits(s.train.with_blanks(blanks, data_seed), s.test.with_blanks(blanks, data_seed + 1))

    def arrays(ds, idx=None):
        x, y = ds.puzzle, ds.solution - 1
        if idx is not None:
            x, y = x[idx], y[idx]
        return x, y, x == 0

    keep, val = split_off(len(s.train), val_fraction, data_seed)
    if n_train is not None:
        if isinstance(n_train, bool) or not isinstance(n_train, int) or not 1 <= n_train <= len(keep):
            raise ConfigError(f"task.n_train must be an integer in 1..{len(keep)}, got {n_train!r}")
        keep = keep[:n_train]
    test = None
    if n_test is not None:
        if isinstance(n_test, bool) or not isinstance(n_test, int) or not 1 <= n_test <= len(s.test):
            raise ConfigError(f"task.n_test must be an integer in 1..{len(s.test)}, got {n_test!r}")
        test = torch.arange(n_test)
    splits = {"train": arrays(s.train, keep), "val": arrays(s.train, val), "test": arrays(s.test, test)}
    task = TokenClassificationTask(splits, 9, cfg.train.seed, cfg.train.eval_batches, loss_on=loss_on,
                                   vocab_size=10)
    if cfg.data.path is not None:
        task.info["data_source"] = (f"{cfg.data.path}: {len(s.train):,} train and {len(s.test):,} test "
                                    f"puzzles; {len(keep):,} train / {len(val):,} val / "
                                    f"{len(splits['test'][0]):,} test used")
    return task


def _digits(cfg, *, patch_size: int = 2, test_fraction: float = 0.2, val_fraction: float = 0.1,
            data_seed: int = 0) -> Task:
    from cemlib.data.digits import load_digit_patches
    try:
        s = load_digit_patches(patch_size, test_fraction, seed=data_seed)
    except ValueError as err:
        raise ConfigError(f"digits task: {err}") from None
    keep, val = split_off(len(s.train), val_fraction, data_seed)
    splits = {"train": (s.train.patches[keep], s.train.labels[keep]),
              "val": (s.train.patches[val], s.train.labels[val]),
              "test": (s.test.patches, s.test.labels)}
    return ClassificationTask(splits, 10, cfg.train.seed, cfg.train.eval_batches)


#: images per file of the binary CIFAR-10 distribution (data_batch_1..5.bin, test_batch.bin)
CIFAR10_RECORDS = 10_000
_CIFAR10_RECORD = 1 + 3 * 32 * 32  # a label byte, then the channel-major 32x32 pixels


def load_cifar10(path: str | Path, records_per_file: int | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """CIFAR-10 from the *binary* distribution on disk (``data_batch_1.bin`` .. ``_5.bin``,
    ``test_batch.bin``: records of 1 label byte + 3072 pixel bytes, channel-major 32x32). Returns
    ``{"train": (images uint8 (50000, 3, 32, 32), labels), "test": ...}``. Nothing is downloaded
    and nothing is unpickled (the Python distribution is a pickle, so it is not read).

    Every file must hold exactly ``records_per_file`` images (default :data:`CIFAR10_RECORDS`) with
    labels 0..9: an empty, cut or foreign file raises :class:`~cemlib.train.tasks.TaskDataError`
    naming it, instead of training on fewer images."""
    records = CIFAR10_RECORDS if records_per_file is None else records_per_file
    root = Path(path)
    if root.is_file():
        raise NotADirectoryError(f"CIFAR-10 data.path {root} is a file; give the folder that holds "
                                 f"data_batch_1.bin ... test_batch.bin (cifar-10-batches-bin)")
    if not root.is_dir():
        raise FileNotFoundError(f"CIFAR-10 folder not found: {root} (give the folder that holds "
                                f"data_batch_1.bin ... test_batch.bin; cemlib never downloads it)")

    def read(names):
        xs, ys = [], []
        for name in names:
            f = root / name
            if not f.is_file():
                raise FileNotFoundError(f"{f} is missing (the binary CIFAR-10 distribution has "
                                        f"data_batch_1.bin .. data_batch_5.bin and test_batch.bin)")
            raw = np.fromfile(f, dtype=np.uint8)
            if raw.size == 0:
                raise TaskDataError(f"{f} is empty (a CIFAR-10 batch file holds {records:,} images)")
            if raw.size % _CIFAR10_RECORD:
                raise TaskDataError(f"{f} is not a CIFAR-10 binary batch ({raw.size} bytes is not a "
                                    f"multiple of {_CIFAR10_RECORD})")
            raw = raw.reshape(-1, _CIFAR10_RECORD)
            if len(raw) != records:
                raise TaskDataError(f"{f} holds {len(raw):,} images, a CIFAR-10 batch file holds "
                                    f"{records:,}: the file is incomplete (or not CIFAR-10)")
            if int(raw[:, 0].max()) > 9:
                raise TaskDataError(f"{f} has labels up to {int(raw[:, 0].max())}; CIFAR-10 labels are "
                                    f"0..9 (is this CIFAR-100?)")
            ys.append(torch.from_numpy(raw[:, 0].astype(np.int64)))
            xs.append(torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).copy()))
        return torch.cat(xs), torch.cat(ys)

    return {"train": read([f"data_batch_{i}.bin" for i in range(1, 6)]), "test": read(["test_batch.bin"])}


def _cifar10(cfg, *, patch_size: int = 4, val_fraction: float = 0.1, n_train: int | None = None,
             data_seed: int = 0) -> Task:
    """Opt-in: ``--set data.path=/folder/of/cifar-10-batches-bin``. Patches of ``p x p x 3``
    values in [0, 1], per-channel standardised with train statistics; ``n_train`` keeps the first
    ``n_train`` training images (before the validation split)."""
    if cfg.data.path is None:
        raise ConfigError("the cifar10 task reads a local copy only: set data.path to the folder of "
                          "the binary CIFAR-10 distribution (cifar-10-batches-bin)")
    if patch_size < 1 or 32 % patch_size:
        raise ConfigError(f"task.patch_size must divide 32 (1, 2, 4, 8, 16 or 32), got {patch_size}")
    raw = load_cifar10(cfg.data.path)
    x_tr, y_tr = raw["train"]
    if n_train is not None:
        if not 1 <= n_train <= len(y_tr):
            raise ConfigError(f"task.n_train must lie in 1..{len(y_tr):,} (the images read), got {n_train}")
        x_tr, y_tr = x_tr[:n_train], y_tr[:n_train]
    mean = (x_tr.float() / 255).mean((0, 2, 3), keepdim=True)
    std = (x_tr.float() / 255).std((0, 2, 3), keepdim=True)
    flat = [c for c in range(3) if not float(std.flatten()[c]) > 0]
    if flat:
        raise TaskDataError(f"CIFAR-10 in {cfg.data.path}: channel {flat[0]} is constant over the "
                            f"{len(y_tr):,} training images, so it cannot be standardised (are these "
                            f"real images?)")

    def patches(x):
        x = ((x.float() / 255) - mean) / std
        p = patch_size
        x = x.unfold(2, p, p).unfold(3, p, p)                       # (N, 3, H/p, W/p, p, p)
        return x.permute(0, 2, 3, 1, 4, 5).reshape(x.shape[0], -1, 3 * p * p)

    keep, val = split_off(len(y_tr), val_fraction, data_seed)
    splits = {"train": (patches(x_tr[keep]), y_tr[keep]), "val": (patches(x_tr[val]), y_tr[val]),
              "test": (patches(raw["test"][0]), raw["test"][1])}
    task = ClassificationTask(splits, 10, cfg.train.seed, cfg.train.eval_batches)
    task.info["data_source"] = (f"{cfg.data.path}: read {len(raw['train'][1]):,} train and "
                                f"{len(raw['test'][1]):,} test images; {len(keep):,} train / {len(val):,} "
                                f"val / {len(raw['test'][1]):,} test used")
    return task


#: the datasets by name (``data.name``): each a function of the config and its ``task.*`` options
#: that returns the task
TASKS = {"shakespeare": _shakespeare, "listops": _listops, "lis": _lis, "gp": _gp, "sudoku": _sudoku,
         "digits": _digits, "cifar10": _cifar10}
#: the kind of task each dataset makes (:attr:`Task.kind`): a model built for one kind does not
#: fit another
KINDS = {"shakespeare": "language_modelling", "listops": "answer_prediction", "lis": "answer_prediction",
         "gp": "regression", "sudoku": "token_classification", "digits": "classification",
         "cifar10": "classification"}


#: the config fields, besides ``data.name`` and ``task.*``, that each dataset reads
_READS = {"shakespeare": ("data.path", "data.val_fraction", "train.context_length"),
          "sudoku": ("data.path",), "cifar10": ("data.path",), "listops": (), "lis": (), "gp": (),
          "digits": ()}
_OPTIONAL = ("data.path", "data.val_fraction", "train.context_length")
_WHY_UNUSED = {"data.path": "its data are generated or shipped with cemlib",
               "data.val_fraction": "its validation split is set by task.val_fraction",
               "train.context_length": "its examples have a fixed length"}


def unused_fields(name: str) -> tuple[str, ...]:
    """The fields of :data:`_OPTIONAL` that dataset ``name`` does not read (``()`` for a dataset
    cemlib does not know)."""
    reads = _READS.get(name)
    return () if reads is None else tuple(f for f in _OPTIONAL if f not in reads)


def data_label(cfg) -> str:
    """What a run trained on, in a word: the dataset's name (``"shakespeare"``), or the file or
    folder a user gave (``data.path``), e.g. ``"my_text.txt"``."""
    d = cfg["data"] if isinstance(cfg, dict) else cfg.data.__dict__
    path = d.get("path")
    return Path(path).name or str(path) if path else d.get("name", "data")


def recorded_config(cfg) -> dict:
    """``cfg.to_dict()`` without the fields its dataset does not read: what a results file records."""
    d = cfg.to_dict()
    for dotted in unused_fields(cfg.data.name):
        section, name = dotted.split(".")
        d[section].pop(name, None)
    return d


def _option_kind(annotation) -> tuple[str | None, bool]:
    """``("int" | "float" | "bool" | "str" | None, None allowed)`` from a factory's annotation
    (``"int | None"`` -> ``("int", True)``; none or several types: ``None``, not checked)."""
    parts = [t.strip() for t in str(annotation).split("|")]
    kinds = [t for t in parts if t in ("bool", "int", "float", "str")]
    return (kinds[0] if len(kinds) == 1 else None), "None" in parts


def _check_option(key: str, value, annotation) -> None:
    kind, none_ok = _option_kind(annotation)
    if value is None:
        if none_ok or kind is None:
            return
        raise ConfigError(f"task.{key} must be a{'n' if kind == 'int' else ''} {kind}, got none")
    ok = {"bool": isinstance(value, bool), "str": isinstance(value, str),
          "int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool)}.get(kind, True)
    if not ok:
        what = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}[kind]
        raise ConfigError(f"task.{key} must be {what}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"task.{key} must be a finite number, got {value!r}")
    if key == "data_seed" and value < 0:
        raise ConfigError(f"task.data_seed must be a non-negative integer, got {value!r}")
    if key.startswith("n_") and kind == "int" and value < 1:
        raise ConfigError(f"task.{key} must be a positive integer, got {value!r}")
    if key.endswith("_fraction") and kind == "float" and not 0.0 < value < 1.0:
        raise ConfigError(f"task.{key} must lie in (0, 1), got {value!r}")


def check_data_config(cfg, base=None) -> None:
    """Validate the data side of ``cfg`` before anything loads (see the module docstring); raise
    :class:`~cemlib.train.config.ConfigError` naming the field. ``base`` (the preset's config)
    turns on the check of the fields the dataset does not read: one set to a value other than
    ``base``'s is refused (a preset's own value, e.g. a language model's context length after a
    change of ``data.name``, is merely unused)."""
    name = cfg.data.name
    if name not in TASKS:
        raise ConfigError(f"unknown dataset data.name={name!r}{did_you_mean(name, TASKS)}; known: "
                          f"{', '.join(sorted(TASKS))}")
    params = {k: p for k, p in inspect.signature(TASKS[name]).parameters.items() if k != "cfg"}
    unknown = sorted(set(cfg.task) - set(params))
    if unknown:
        raise ConfigError(f"task options {unknown} are not options of the {name!r} data"
                          f"{did_you_mean(unknown[0], params)}; known: {', '.join(params) or 'none'}")
    for key, value in cfg.task.items():
        _check_option(key, value, params[key].annotation)
    for dotted in unused_fields(name) if base is not None else ():
        section, field_name = dotted.split(".")
        value = getattr(getattr(cfg, section), field_name)
        if value != getattr(getattr(base, section), field_name):
            raise ConfigError(f"{dotted}={value!r} is not used by the {name!r} data ({_WHY_UNUSED[dotted]}); "
                              f"leave it unset")
    vf = cfg.data.val_fraction
    if "data.val_fraction" not in unused_fields(name) and (
            isinstance(vf, bool) or not isinstance(vf, (int, float)) or not 0.0 < vf < 1.0):
        raise ConfigError(f"data.val_fraction must lie in (0, 1), got {vf!r}")


def make_task(cfg) -> Task:
    """The task of ``cfg`` (``cfg.data.name`` with keyword arguments ``cfg.task``), after
    :func:`check_data_config`. A generator's own ``ValueError`` (e.g. a LIS length too short for
    the examples asked for) is reported as a :class:`~cemlib.train.config.ConfigError`."""
    check_data_config(cfg)
    try:
        return TASKS[cfg.data.name](cfg, **cfg.task)
    except (ConfigError, TaskDataError):
        raise
    except ValueError as err:
        raise ConfigError(f"the {cfg.data.name!r} data with task options {cfg.task}: {err}") from None
