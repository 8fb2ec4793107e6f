import gzip

import pytest

from cemlib.data.shakespeare import SHA256, ChecksumError, CharTokenizer, load_shakespeare, load_text


def test_shipped_corpus_verifies_and_splits():
    s = load_shakespeare()
    assert s.tokenizer.vocab_size == 65
    n = len(s.train) + len(s.val)
    assert n == 1_115_394
    assert len(s.train) == int(n * 0.9)
    assert s.tokenizer.decode(s.train[:9]) == "First Cit"


def test_tokenizer_round_trip_and_unknown_char():
    tok = CharTokenizer("hello world")
    assert tok.decode(tok.encode("world hello")) == "world hello"
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("z")


def test_corrupted_and_truncated_files_name_file_and_checksum(tmp_path, monkeypatch):
    text = load_text()
    bad = tmp_path / "tinyshakespeare.txt"
    bad.write_text(text[:-1] + "X")
    with pytest.raises(ChecksumError, match=f"tinyshakespeare.txt.*{SHA256}"):
        load_text(bad, sha256=SHA256)  # a copy is checked when asked to
    trunc = tmp_path / "tinyshakespeare.txt.gz"
    trunc.write_bytes(gzip.compress(text.encode())[:5000])
    with pytest.raises(ChecksumError, match=f"tinyshakespeare.txt.gz.*{SHA256}"):
        load_text(trunc, sha256=SHA256)
    with pytest.raises(FileNotFoundError, match="nothere.txt"):
        load_text(tmp_path / "nothere.txt")
    # the shipped file itself is always checked: a corrupted one is refused by name
    import cemlib.data.shakespeare as sh
    monkeypatch.setattr(sh, "_default_path", lambda: trunc)
    with pytest.raises(ChecksumError, match=f"tinyshakespeare.txt.gz.*{SHA256}"):
        load_text()


def test_a_text_of_ones_own_is_read_without_the_shipped_checksum(tmp_path):
    """``load_shakespeare(path=...)`` rejected any text but the shipped one as
    "corrupted"; the checksum now applies to the shipped file only."""
    own = tmp_path / "mine.txt"
    own.write_text("to be or not to be, that is the question\n" * 50)
    s = load_shakespeare(val_fraction=0.2, path=own)
    assert s.tokenizer.vocab_size == len(set(own.read_text()))
    n = len(own.read_text())
    assert len(s.train) == int(n * 0.8) and len(s.train) + len(s.val) == n
    (tmp_path / "mine.txt.gz").write_bytes(gzip.compress(own.read_bytes()))
    assert load_text(tmp_path / "mine.txt.gz") == own.read_text()
    with pytest.raises(IsADirectoryError, match="is a folder"):
        load_text(tmp_path)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt is not UTF-8 text"):
        load_text(tmp_path / "latin1.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty.txt is empty"):
        load_text(tmp_path / "empty.txt")


def test_bad_split_fraction():
    with pytest.raises(ValueError, match="val_fraction"):
        load_shakespeare(val_fraction=1.5)
