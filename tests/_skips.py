"""Skips, classified: GPU-only or not (not a test module; conftest.py wires the hooks).

A skip is **GPU-only** when the one thing the test lacks is this machine's GPU hardware: a GPU test
on a host with no (or too few) NVIDIA GPUs, or a test of the no-GPU path on a host where a GPU is
visible. Such a skip is raised with :func:`skip_gpu_only` (or :func:`require_host_gpus`), and only
those count as GPU-only: the classification is the exception type, not the wording of a reason.
Every other skip (a missing tool, venv, wheel or service) is a hole in the machine's setup, which
``scripts/test.sh`` fails on.

At the end of a run the hooks print the skips grouped by reason with counts (after pytest's short
summary, before its final line), and write the same table to ``$STACKFORGE_SKIP_REPORT`` when set:
one ``kind<TAB>count<TAB>reason`` line per group.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Generator, Iterable
from pathlib import Path

import pytest

from stackforge.edges.gpus import detect_host_gpus

GPU_ONLY = "gpu-only"
OTHER = "other"
KIND_PROPERTY = "skip_kind"
REPORT_ENV = "STACKFORGE_SKIP_REPORT"


class GpuOnlySkip(pytest.skip.Exception):  # type: ignore[misc,name-defined]
    """A skip caused by the GPU hardware of this machine and nothing else."""


def skip_gpu_only(reason: str) -> None:
    """Skip the test because of this machine's GPU hardware (none where one is needed, or the reverse)."""
    __tracebackhide__ = True   # the skip's location is the caller, as with pytest.skip
    raise GpuOnlySkip(msg=reason)


def host_gpu_count() -> tuple[int, str]:
    """How many NVIDIA GPUs this host has (nvidia-smi), and the evidence."""
    gpus = detect_host_gpus(None)
    return len(gpus.devices), gpus.evidence


def require_host_gpus(count: int = 1) -> None:
    """Skip (GPU-only) unless this host has at least ``count`` NVIDIA GPUs."""
    __tracebackhide__ = True
    found, evidence = host_gpu_count()
    if found < count:
        skip_gpu_only(f"needs {count} NVIDIA GPU(s), this host has {found} ({evidence})")


# --------------------------------------------------------------------------------------------- report

def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason a skipped report gives, on one line (pytest keeps it as ``(path, line, reason)``)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    # pytest prefixes the exception's name: "Skipped: ..." or, for ours, "_skips.GpuOnlySkip: ...".
    for prefix in ("Skipped: ", f"{GpuOnlySkip.__module__}.{GpuOnlySkip.__qualname__}: "):
        reason = reason.removeprefix(prefix)
    return " ".join(reason.split())


def skip_kind(report: pytest.TestReport | pytest.CollectReport) -> str:
    return GPU_ONLY if (KIND_PROPERTY, GPU_ONLY) in getattr(report, "user_properties", ()) else OTHER


def group_skips(reports: Iterable[pytest.TestReport | pytest.CollectReport]) -> list[tuple[str, int, str]]:
    """(kind, count, reason) per distinct skip, most frequent first; the non-GPU-only ones first of all."""
    counts = Counter((skip_kind(r), skip_reason(r)) for r in reports if r.skipped)
    return sorted(((kind, n, reason) for (kind, reason), n in counts.items()),
                  key=lambda row: (row[0] == GPU_ONLY, -row[1], row[2]))


def summary_lines(groups: list[tuple[str, int, str]]) -> list[str]:
    """The table printed at the end of a run, and its totals line."""
    lines = [f"{kind:<9} {count:>4}  {reason}" for kind, count, reason in groups]
    gpu_only = sum(n for kind, n, _ in groups if kind == GPU_ONLY)
    other = sum(n for kind, n, _ in groups if kind != GPU_ONLY)
    lines.append(f"{gpu_only + other} skipped: {gpu_only} {GPU_ONLY}, {other} {OTHER}")
    return lines


# --------------------------------------------------------------------------------------------- hooks
# conftest.py imports these names, so pytest registers them as that conftest's hooks.

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, pytest.TestReport,
                                                                                       pytest.TestReport]:
    report = yield
    if report.skipped and call.excinfo is not None and isinstance(call.excinfo.value, GpuOnlySkip):
        report.user_properties.append((KIND_PROPERTY, GPU_ONLY))
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int,
                            config: pytest.Config) -> Generator[None, None, None]:
    # Outermost wrapper: this runs after pytest's own short summary, just before its final line.
    result = yield
    groups = group_skips(terminalreporter.stats.get("skipped", []))
    terminalreporter.write_sep("=", "skips by reason")
    for line in summary_lines(groups):
        terminalreporter.write_line(line)
    target = os.environ.get(REPORT_ENV)
    if target:
        Path(target).write_text("".join(f"{kind}\t{count}\t{reason}\n" for kind, count, reason in groups),
                                encoding="utf-8")
    return result
