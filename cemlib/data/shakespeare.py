"""Tiny Shakespeare, shipped inside cemlib and verified by SHA-256 on load.

Source: ``data/tinyshakespeare/input.txt`` of the public repository karpathy/char-rnn (public-domain
text, 1,115,394 bytes, 65 distinct characters). It is stored gzip-compressed in
``cemlib/data/files/``; the checksum below is that of the *uncompressed* text. :func:`load_text`
and :func:`load_shakespeare` also read a user's own text file (``path=``; UTF-8, optionally
``.gz``), split and tokenised the same way; the checksum applies to the shipped file only.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

__all__ = ["SHA256", "ChecksumError", "load_text", "is_shipped", "verify_sha256", "CharTokenizer", "load_shakespeare", "CharSplits"]

SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
_FILE = "tinyshakespeare.txt.gz"


class ChecksumError(RuntimeError):
    """A shipped data file is corrupted or truncated."""


def _default_path() -> Path:
    return Path(str(resources.files("cemlib.data") / "files" / _FILE))


def is_shipped(path: str | Path | None) -> bool:
    """Whether ``path`` (``None``: the default) is the file shipped with cemlib."""
    if path is None:
        return True
    try:
        return Path(path).resolve() == _default_path().resolve()
    except OSError:
        return False


_SHIPPED_ONLY = "shipped file only"


def verify_sha256(path: Path, data: bytes, sha256: str) -> None:
    """Raise :class:`ChecksumError` naming ``path`` unless ``data`` (its contents) hash to ``sha256``."""
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ChecksumError(f"{path.name}: SHA-256 {got} does not match the expected {sha256} "
                            f"({len(data)} bytes); the file is corrupted or truncated")


def load_text(path: str | Path | None = None, sha256: str | None = _SHIPPED_ONLY) -> str:
    """Return the corpus as a string, the shipped copy after checking its SHA-256.

    ``path`` may point to a ``.gz`` or a plain UTF-8 text file; by default the shipped copy is
    used. ``sha256``: by default the shipped file is checked against :data:`SHA256` and a file of
    one's own is not checked; a SHA-256 given as hex checks any file, ``None`` none. Raises
    :class:`ChecksumError` naming the file and the expected checksum if it does not match, and
    ``ValueError`` for a file that is empty or not (gzipped) UTF-8 text.
    """
    p = Path(path) if path is not None else _default_path()
    if sha256 == _SHIPPED_ONLY:
        sha256 = SHA256 if is_shipped(path) else None
    if p.is_dir():
        raise IsADirectoryError(f"text path {p} is a folder; give the text file itself")
    if not p.exists():
        raise FileNotFoundError(f"text file not found: {p.name}")
    raw = p.read_bytes()
    try:
        data = gzip.decompress(raw) if p.suffix == ".gz" else raw
    except (OSError, EOFError) as err:  # truncated or corrupted gzip stream
        if sha256 is None:
            raise ValueError(f"{p.name}: cannot decompress ({err})") from None
        raise ChecksumError(f"{p.name}: cannot decompress ({err}); expected SHA-256 {sha256}") from err
    if sha256 is not None:
        verify_sha256(p, data, sha256)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{p.name} is not UTF-8 text (byte {err.start}: {err.reason})") from None
    if not text:
        raise ValueError(f"{p.name} is empty")
    return text


class CharTokenizer:
    """Character-level tokenizer: one id per distinct character, ids in sorted character order.

    ``to_dict()`` is what checkpoints and results files store (``{"kind": "characters", "chars":
    the vocabulary as one string}``), so a trained model can be decoded without its text;
    ``CharTokenizer.from_dict`` rebuilds the same ids."""

    KIND = "characters"

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    def to_dict(self) -> dict:
        """``{"kind": "characters", "chars": "<every character, in id order>"}`` (JSON-safe)."""
        return {"kind": self.KIND, "chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        """The tokenizer :meth:`to_dict` described; raises ``ValueError`` for anything else."""
        if not isinstance(d, dict) or d.get("kind") != cls.KIND or not isinstance(d.get("chars"), str):
            raise ValueError(f"not a stored character vocabulary: {d!r:.80}")
        chars = d["chars"]
        if not chars or list(chars) != sorted(set(chars)):
            raise ValueError("a stored character vocabulary must be distinct characters in sorted order")
        return cls(chars)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        try:
            return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)
        except KeyError as err:
            raise ValueError(f"character {err.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


@dataclass
class CharSplits:
    """Encoded train/validation token streams and their tokenizer."""

    train: torch.Tensor
    val: torch.Tensor
    tokenizer: CharTokenizer


def load_shakespeare(val_fraction: float = 0.1, path: str | Path | None = None) -> CharSplits:
    """Tiny Shakespeare (or the text file ``path``, see :func:`load_text`) as character ids with
    the usual split: the first ``1 - val_fraction`` train, the rest validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    text = load_text(path)
    tok = CharTokenizer(text)
    ids = tok.encode(text)
    n = int(len(ids) * (1.0 - val_fraction))
    return CharSplits(train=ids[:n], val=ids[n:], tokenizer=tok)
