"""pytest plugin (loaded with ``-p pytest_timing``, see pyproject.toml): prints the time each part
of the suite took -- unit tests, kernels, training engine, chapters -- at the end of every run."""

_PART_SECONDS: dict[str, float] = {}


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
    _PART_SECONDS[part] = _PART_SECONDS.get(part, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)


def pytest_terminal_summary(terminalreporter):
    if not _PART_SECONDS:
        return
    terminalreporter.section("time per part")
    for part, secs in sorted(_PART_SECONDS.items()):
        terminalreporter.write_line(f"{part:40s} {secs:8.1f} s")


