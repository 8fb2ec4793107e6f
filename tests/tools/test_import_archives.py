"""Issue 59, item 3: ``tools/gpu/import_results.py`` reads a campaign archive as a bounded stream.

Before: every member was read whole (a 199 KiB ``.tar.gz`` took 551 MiB of memory) and a damaged
archive ended in a traceback. Now a member over the size limit is refused unread, the results read
from one archive are bounded in total, links and paths outside the target are refused by name, and
a truncated, corrupted or foreign file is one line naming it (exit status 2).
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import tracemalloc
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import import_results  # noqa: E402
from import_results import ArchiveError, read_campaign  # noqa: E402


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **kw) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in kw.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data) if data else None)


def _archive(path: Path, members, mode="w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for m in members:
            _add(tar, *m[:2], **(m[2] if len(m) > 2 else {}))
    return path


def test_a_huge_member_is_refused_unread_and_memory_stays_small(tmp_path):
    zeros = b"\0" * (8 * 2**20)  # compresses to a few kB
    tar = _archive(tmp_path / "bomb.tar.gz", [("grid/run.json", zeros), ("campaign.json", b"{}")])
    assert tar.stat().st_size < 100_000
    tracemalloc.start()
    files, log, refused = read_campaign(tar, max_member=2**20)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert files == {} and log == {}
    assert "more than the 1,048,576 a results file may have; not read" in refused["grid/run.json"]
    assert peak < 4 * 2**20  # the 8 MiB member was never held


def test_the_total_read_from_one_archive_is_bounded(tmp_path):
    tar = _archive(tmp_path / "many.tar.gz", [(f"g/r{i}.json", b"x" * 1000) for i in range(10)])
    with pytest.raises(ArchiveError, match=r"many.tar.gz: its results files hold more than 5,000 bytes"):
        read_campaign(tar, max_member=2000, max_total=5000)


def test_links_and_paths_outside_the_target_are_refused_by_name(tmp_path):
    tar = _archive(tmp_path / "links.tar", [
        ("g/link.json", b"", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}),
        ("g/hard.json", b"", {"type": tarfile.LNKTYPE, "linkname": "g/ok.json"}),
        ("../evil.json", b"{}"), ("/abs/evil.json", b"{}"), ("g/ok.json", b"{}")], mode="w")
    files, _, refused = read_campaign(tar)
    assert list(files) == ["g/ok.json"]
    assert refused["g/link.json"].startswith("a link") and refused["g/hard.json"].startswith("a link")
    assert "outside the import's target" in refused["../evil.json"]
    assert "outside the import's target" in refused["/abs/evil.json"]
    checked = import_results.import_campaign(tar, tmp_path / "dest", repo=None, check_only=True)
    assert {c.file for c in checked if not c.ok} >= {"g/link.json", "../evil.json", "/abs/evil.json"}


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "bad_log"])
def test_a_damaged_archive_is_one_line_naming_the_file(tmp_path, damage, capsys):
    good = _archive(tmp_path / "good.tar.gz", [("g/r.json", json.dumps({"a": 1}).encode() * 2000),
                                               ("campaign.json", b"{}")])
    bad = tmp_path / "campaign.tar.gz"
    raw = good.read_bytes()
    if damage == "truncated":
        bad.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        bad.write_bytes(b"not a tar archive at all" * 50)
    elif damage == "empty":
        bad.write_bytes(b"")
    else:
        bad = _archive(tmp_path / "campaign.tar.gz", [("campaign.json", b"{not json")])
    assert import_results.main([str(bad), "--check-only", "--no-git"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: campaign.tar.gz")
    assert ("truncated or corrupted" in err) or ("campaign log" in err)
