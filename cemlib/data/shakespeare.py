"""Tiny Shakespeare, shipped inside cemlib and verified by SHA-256 on load.

Source: ``data/tinyshakespeare/input.txt`` of the public repository karpathy/char-rnn (public-domain
text, 1,115,394 bytes, 65 distinct characters). It is stored gzip-compressed in
``cemlib/data/files/``; the checksum below is that of the *uncompressed* text.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

__all__ = ["SHA256", "ChecksumError", "load_text", "CharTokenizer", "load_shakespeare", "CharSplits"]

SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
_FILE = "tinyshakespeare.txt.gz"


class ChecksumError(RuntimeError):
    """A shipped data file is corrupted or truncated."""


def _default_path() -> Path:
    return Path(str(resources.files("cemlib.data") / "files" / _FILE))


def load_text(path: str | Path | None = None, sha256: str = SHA256) -> str:
    """Return the corpus as a string after checking its SHA-256.

    ``path`` may point to a ``.gz`` or a plain text file; by default the shipped copy is used.
    Raises :class:`ChecksumError` naming the file and the expected checksum if it does not match.
    """
    p = Path(path) if path is not None else _default_path()
    if not p.exists():
        raise FileNotFoundError(f"tiny Shakespeare file not found: {p.name}")
    raw = p.read_bytes()
    try:
        data = gzip.decompress(raw) if p.suffix == ".gz" else raw
    except (OSError, EOFError) as err:  # truncated or corrupted gzip stream
        raise ChecksumError(f"{p.name}: cannot decompress ({err}); expected SHA-256 {sha256}") from err
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ChecksumError(f"{p.name}: SHA-256 {got} does not match the expected {sha256} "
                            f"({len(data)} bytes); the file is corrupted or truncated")
    return data.decode("utf-8")


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
    """Tiny Shakespeare as character ids with the usual split: first 90 % train, last 10 % validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    text = load_text(path)
    tok = CharTokenizer(text)
    ids = tok.encode(text)
    n = int(len(ids) * (1.0 - val_fraction))
    return CharSplits(train=ids[:n], val=ids[n:], tokenizer=tok)
