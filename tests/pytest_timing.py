"""pytest plugin (loaded with ``-p pytest_timing``, see pyproject.toml): prints the time each part
of the suite took -- unit tests, kernels, training engine, chapters -- and each chapter, at the end
of every run. A chapter must execute in at most 3 minutes on CI's 2-core machine."""

_PART_SECONDS: dict[str, float] = {}
_CHAPTER_SECONDS: dict[str, float] = {}


def _part(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        return "chapters (nbval, strict)"
    name = path.rsplit("/", 1)[-1]
    if name.startswith("test_kernels"):
        return "kernels (Triton interpreter / CUDA)"
    if name.startswith("test_benchmarks"):
        return "benchmark scripts (CPU smoke)"
    if name.startswith("test_train"):
        return "training engine"
    if name.startswith("test_stored_results"):
        return "stored results (re-run from their commands)"
    return "cemlib unit tests"


def pytest_runtest_logreport(report):
    part = _part(report.nodeid)
    secs = float(getattr(report, "duration", 0.0) or 0.0)
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


