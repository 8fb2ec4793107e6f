"""pytest plugin (loaded with ``-p pytest_timing``, see pyproject.toml): prints the time each part
of the suite took -- one line per test folder (``tests/kernels``, ``tests/train``, ...) and the
chapters -- and each chapter, at the end of every run. A chapter must execute in at most 3 minutes
on CI's 2-core machine. pytest's own ``--durations`` lists single tests; it does not sum a
chapter's cells, which is what the budget is about.

With ``CEMLIB_TEST_LOG=<file>`` it also appends a line to that file as each test starts and as
it ends (its call, and a set-up or tear-down that failed or took a second or more), tab-separated:
seconds since the session started, the pytest-xdist worker, ``start`` or the phase, its outcome
and seconds, the test, and for a failure the exception's first line and where it was raised.
Only the controlling process writes, and each line is on disk at once, so a run stopped by a time
limit still says which tests took the time and which were running (``tools/gpu/run_gpu.sh tests``
uses it on a rented GPU)."""

import os
import time

_PART_SECONDS: dict[str, float] = {}
_CHAPTER_SECONDS: dict[str, float] = {}
_LOG = {"path": None, "t0": time.monotonic()}


def pytest_configure(config):
    # pytest-xdist's workers report to the controller, which runs this plugin's hooks again
    if not hasattr(config, "workerinput"):
        _LOG["path"] = os.environ.get("CEMLIB_TEST_LOG") or None
        _LOG["t0"] = time.monotonic()


def _log(worker: str, what: str, outcome: str, seconds: float, nodeid: str, note: str = "") -> None:
    if _LOG["path"] is None:
        return
    line = "\t".join((f"{time.monotonic() - _LOG['t0']:.1f}", worker, what, outcome,
                      f"{seconds:.1f}", nodeid, note.replace("\t", " ")))
    with open(_LOG["path"], "a") as f:
        f.write(line + "\n")


def _worker(report) -> str:
    node = getattr(report, "node", None)  # pytest-xdist: the worker a report came from
    return getattr(getattr(node, "gateway", None), "id", None) or "main"


def pytest_runtest_logstart(nodeid, location):
    _log("", "start", "", 0.0, nodeid)


def _part(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        return "chapters (nbval, strict)"
    parts = path.split("/")
    return f"tests/{parts[1]}" if len(parts) > 2 and parts[0] == "tests" else "tests (top level)"


def pytest_runtest_logreport(report):
    part = _part(report.nodeid)
    secs = float(getattr(report, "duration", 0.0) or 0.0)
    if _LOG["path"] is not None and (report.when == "call" or report.failed or secs >= 1.0):
        failure = ""
        if report.failed:  # the exception's first line ("E   ...") and where it was raised
            lines = report.longreprtext.strip().splitlines() or [""]
            raised = [line.strip() for line in lines if line.startswith("E ")]
            failure = " | ".join(raised[:1] + lines[-1:])[:400]
        _log(_worker(report), report.when, report.outcome, secs, report.nodeid, failure)
    _PART_SECONDS[part] = _PART_SECONDS.get(part, 0.0) + secs
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        name = path.rsplit("/", 1)[-1]
        _CHAPTER_SECONDS[name] = _CHAPTER_SECONDS.get(name, 0.0) + secs


def pytest_terminal_summary(terminalreporter):
    if not _PART_SECONDS:
        return
    terminalreporter.section("time per part")
    for part, secs in sorted(_PART_SECONDS.items()):
        terminalreporter.write_line(f"{part:40s} {secs:8.1f} s")
    if _CHAPTER_SECONDS:
        terminalreporter.section("time per chapter (nbval)")
        for name, secs in sorted(_CHAPTER_SECONDS.items()):
            terminalreporter.write_line(f"{name:40s} {secs:8.1f} s")


