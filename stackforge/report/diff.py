"""``matrix diff A B``: cells that changed status, and metrics that moved beyond the runs' own noise.

A and B are run folders (records) or matrix JSON files (``stackforge matrix --format json``).
Both are reduced to a :class:`Snapshot`: per (target, stack, feature) a cell status, decided by
the same :func:`stackforge.report.compat_matrix.decide_cell` as the matrix, and per (target, stack, probe,
metric) the metric's centre and spread.

When is a metric change real? (sglang#24563: fixed thresholds are brittle and "bugs can hide
within the noise".) Each measurement carries its own spread: a summary ``{median, min|minimum,
max|maximum, cv, stdev}`` or the raw ``samples``. With ``delta = centre_B - centre_A``, a change is
*significant* when all three hold:

1. ``|delta| > NOISE_K * max(spread_A, spread_B)`` where spread is the observed range
   ``max - min`` (else ``2 * stdev``, else ``2 * cv * |centre|``) and ``NOISE_K = 1.0``;
2. the ``[min, max]`` ranges of A and B do not overlap (no repeat of A is as good as one of B);
3. ``|delta| > REL_THRESHOLD * |centre_A|`` with ``REL_THRESHOLD = 0.02`` (2 %), so a
   very tight benchmark does not report a 0.1 % wobble.

A metric recorded as a single number has no known noise: then only a larger relative change
counts, ``NO_SPREAD_REL_THRESHOLD = 0.10`` (10 %), and the change says "noise unknown".
Run parameters recorded among the metrics (:data:`PARAMETER_NAMES`, ``*_bytes``, ``*_size``) are
not compared: changing them makes a different experiment, not a regression.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge.core.envelope import check_envelope, report_json_text
from stackforge.core.errors import RecordError, SpecError
from stackforge.core.records import ResultRecord
from stackforge.plan.features import load_feature_catalog
from stackforge.report.compat_matrix import (
    COMPAT_MATRIX_SCHEMA,
    COMPAT_MATRIX_SCHEMA_VERSION,
    CellJudge,
    decide_cell,
    one_line,
)
from stackforge.core.markdown import md_text
from stackforge.results.store import LoadedResults, load_results

__all__ = ["NOISE_K", "NO_SPREAD_REL_THRESHOLD", "REL_THRESHOLD", "WITHIN_NOISE", "CellState", "MatrixDiff",
           "MetricChange", "MetricStats", "Snapshot", "StatusChange", "check_target", "compare_metric",
           "diff_snapshots", "load_snapshot", "lower_is_better", "metric_stats", "write_diff",
           "snapshot_from_matrix_json", "snapshot_from_records"]

NOISE_K = 1.0
REL_THRESHOLD = 0.02
NO_SPREAD_REL_THRESHOLD = 0.10
#: The trend of a metric change that stays within the runs' own noise.
WITHIN_NOISE = "within noise"
DIFF_SCHEMA = "stackforge.matrix-diff"
DIFF_SCHEMA_VERSION = 1
FORMATS = ("md", "json", "text")
# Metric names that get better when they go down (latencies, times).
_LOWER_IS_BETTER = ("latency", "ttft", "tpot", "itl", "e2e", "duration", "time")
_HIGHER_IS_BETTER = ("throughput", "bw", "flops", "per_s", "tok_s", "speedup")
_TIME_UNITS = ("_ms", "_us", "_s")
_MAX_NESTING = 3
# Numbers the bench scripts record beside their measurements that describe the run, not its speed:
# a change there is a different experiment, not a regression (shown in the run's own metadata).
PARAMETER_NAMES = frozenset({
    "world_size", "busbw_factor", "iters", "repeats", "warmup", "tp", "n", "signal", "request_rate",
    "max_concurrency", "concurrency", "random_input_len", "random_output_len", "random_range_ratio",
    "duration", "completed", "total_input_tokens", "total_output_tokens", "total_output_tokens_retokenized",
})
_PARAMETER_SUFFIXES = ("_bytes", "_size")
# A passing cell that turns into one of these is a regression. ``undecided`` (and ``skip``,
# ``untested``) is no verdict at all: the change is listed, but nothing measured a breakage.
_BROKEN = frozenset({"fail", "crash", "timeout", "error", "unavailable", "pruned"})
#: A cell that worked, measured (``pass``), built for the target (``built``) or as far as the code shows
#: (``admitted``).
_WORKED = frozenset({"pass", "built", "admitted"})

CellKey = tuple[str, str, str]            # target, stack_id, feature
MetricKey = tuple[str, str, str, str]     # target, stack_id, probe, metric (dotted when nested)


@dataclass(frozen=True, slots=True)
class CellState:
    """A cell's status and how it was decided."""

    status: str
    source: str
    tier: str | None
    reason: str

    def text(self) -> str:
        how = f" ({self.tier or self.source})" if self.source != "none" else ""
        return f"{self.status}{how}"


@dataclass(frozen=True, slots=True)
class MetricStats:
    """A metric's centre and spread (``low``/``high``/``spread`` are None when unknown)."""

    center: float
    low: float | None = None
    high: float | None = None
    spread: float | None = None
    n: int = 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A run or a matrix, reduced to what a diff compares."""

    label: str
    cells: dict[CellKey, CellState]
    metrics: dict[MetricKey, MetricStats]
    #: every target the input holds, before any --target filter (to tell a typo from an empty target)
    targets: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class StatusChange:
    """A cell whose status changed (``None`` on one side: the cell appeared or disappeared)."""

    key: CellKey
    before: CellState | None
    after: CellState | None

    @property
    def regression(self) -> bool:
        """A cell that passed and now fails, crashes, hangs, breaks its probe or is ruled out."""
        return (self.before is not None and self.before.status in _WORKED and self.after is not None
                and self.after.status in _BROKEN)


@dataclass(frozen=True, slots=True)
class MetricChange:
    """A metric from A to B (``diff_snapshots`` keeps those that moved beyond noise)."""

    key: MetricKey
    before: MetricStats
    after: MetricStats
    delta: float
    relative: float | None
    noise: float | None          # the spread the delta was compared with (None: unknown)
    trend: str                   # regression | improvement | within noise


@dataclass(frozen=True, slots=True)
class MatrixDiff:
    """What changed from A to B."""

    a: str
    b: str
    status_changes: tuple[StatusChange, ...]
    metric_changes: tuple[MetricChange, ...]
    metrics_compared: int
    within_noise: int

    @property
    def changed(self) -> bool:
        return bool(self.status_changes or self.metric_changes)

    @property
    def regressions(self) -> tuple[StatusChange | MetricChange, ...]:
        """Cells that stopped working, and metrics that got worse beyond noise."""
        return (tuple(c for c in self.status_changes if c.regression)
                + tuple(c for c in self.metric_changes if c.trend == "regression"))


# ---------------------------------------------------------------------------------------------- snapshots


def snapshot_from_records(records: Sequence[ResultRecord], label: str, *,
                          target: str | None = None) -> Snapshot:
    """Cells (measured only) and metrics of a set of records."""
    chosen = [r for r in records if target is None or r.target == target]
    groups: dict[CellKey, list[ResultRecord]] = {}
    for record in chosen:
        groups.setdefault((record.target, record.stack_id, record.feature), []).append(record)
    catalog = load_feature_catalog()
    cells = {key: _state(decide_cell(key[2], group, judge=CellJudge(catalog.spec(key[2]))))
             for key, group in groups.items()}
    metrics: dict[MetricKey, MetricStats] = {}
    for record in chosen:
        for name, stats in _flatten_metrics(record.outcome.metrics):
            metrics[(record.target, record.stack_id, record.probe, name)] = stats
    return Snapshot(label=label, cells=cells, metrics=metrics, targets=frozenset(r.target for r in records))


def snapshot_from_matrix_json(data: Any, label: str, *, target: str | None = None) -> Snapshot:
    """Cells (measured and predicted) and metrics of a ``stackforge.matrix`` JSON document.

    Raises:
        RecordError: not a matrix JSON, or a newer schema version.
    """
    check_envelope(data, schema=COMPAT_MATRIX_SCHEMA, supported=COMPAT_MATRIX_SCHEMA_VERSION, what="matrix JSON",
                   path=label)
    name = str((data.get("target") or {}).get("name", ""))
    if target is not None and name != target:
        return Snapshot(label=label, cells={}, metrics={}, targets=frozenset({name}))
    cells: dict[CellKey, CellState] = {}
    metrics: dict[MetricKey, MetricStats] = {}
    try:
        for row in data.get("rows", ()):
            for cell in row.get("cells", ()):
                cells[(name, row["stack_id"], cell["feature"])] = CellState(
                    cell["status"], cell["source"], cell.get("tier"), str(cell.get("reason", "")))
                for measurement in cell.get("measurements", ()):
                    for metric, stats in _flatten_metrics(measurement.get("metrics") or {}):
                        metrics[(name, row["stack_id"], measurement["probe"], metric)] = stats
    except (KeyError, TypeError, AttributeError) as exc:
        raise RecordError(f"malformed matrix JSON: {type(exc).__name__}: {exc}", path=label) from None
    return Snapshot(label=label, cells=cells, metrics=metrics, targets=frozenset({name}))


def check_target(target: str | None, *snapshots: Snapshot) -> None:
    """Refuse a ``--target`` that none of the inputs holds: a typo must not read as "no regressions".

    Raises:
        SpecError: the target is in none of ``snapshots`` (the message lists the ones there are).
    """
    known = sorted(set().union(*(s.targets for s in snapshots)))
    if target is not None and target not in known:
        inputs = " or ".join(s.label for s in snapshots)
        raise SpecError(f"unknown target {target!r}: no cells for it in {inputs}; "
                        f"targets there: {', '.join(known) or '(none)'}",
                        remedy="pass one of those to --target, or leave it out to compare every target")


def load_snapshot(path: Path, *, target: str | None = None, skip_bad: bool = False,
                  warn: Any = None) -> Snapshot:
    """A run folder / results root (records) or a matrix JSON file, as a snapshot.

    Args:
        warn: called with a message when ``skip_bad`` lets unusable records through.

    Raises:
        RecordError: unusable input (unless ``skip_bad`` for record files).
    """
    if path.is_dir():
        loaded = load_results(path)
        _check_problems(loaded, skip_bad, warn)
        return snapshot_from_records(loaded.records, str(path), target=target)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError("no such file or folder", path=str(path)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"cannot read matrix JSON: {exc}", path=str(path)) from None
    return snapshot_from_matrix_json(data, str(path), target=target)


def _check_problems(loaded: LoadedResults, skip_bad: bool, warn: Any) -> None:
    if not loaded.problems:
        return
    if not skip_bad:
        loaded.raise_for_problems()
    if warn is not None:
        warn(f"skipping {len(loaded.problems)} unusable file(s) in {loaded.source}: "
             + "; ".join(p.message for p in loaded.problems))


def _state(cell: Any) -> CellState:
    tier = cell.tier.value if cell.tier else None
    return CellState(cell.status.value, cell.source.value, tier, cell.reason)


# ---------------------------------------------------------------------------------------------- metrics


def metric_stats(value: Any) -> MetricStats | None:
    """Centre and spread of one metric value; None when it is not a number or a summary."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return MetricStats(center=float(value)) if math.isfinite(value) else None
    if isinstance(value, list):
        return _from_samples(value)
    if isinstance(value, Mapping):
        return _from_summary(value)
    return None


def _from_samples(values: Sequence[Any]) -> MetricStats | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return None
    low, high = min(numbers), max(numbers)
    return MetricStats(center=statistics.median(numbers), low=low, high=high,
                       spread=high - low if len(numbers) > 1 else None, n=len(numbers))


def _from_summary(summary: Mapping[str, Any]) -> MetricStats | None:
    samples = _from_samples(summary["samples"]) if isinstance(summary.get("samples"), list) else None
    center = _number(summary, "median", "mean", "value")
    if center is None:
        return samples
    low, high = _number(summary, "min", "minimum"), _number(summary, "max", "maximum")
    if (low is None or high is None) and samples is not None:
        low, high = samples.low, samples.high
    counted = _number(summary, "n", "repeats")
    n = int(counted) if counted is not None else (samples.n if samples else 0)   # 0: not recorded
    return MetricStats(center=center, low=low, high=high, spread=_spread(summary, center, low, high, n),
                       n=n or 1)


def _spread(summary: Mapping[str, Any], center: float, low: float | None, high: float | None,
            n: int) -> float | None:
    """Observed range, else 2 x stdev, else 2 x cv x centre; None when one sample or nothing recorded."""
    if n == 1:
        return None
    if low is not None and high is not None:
        return high - low
    stdev = _number(summary, "stdev", "std")
    if stdev is not None:
        return 2 * stdev
    cv = _number(summary, "cv")
    return 2 * cv * abs(center) if cv is not None else None


def _number(data: Mapping[str, Any], *names: str) -> float | None:
    for name in names:
        value = data.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _flatten_metrics(metrics: Mapping[str, Any], prefix: str = "",
                     depth: int = 0) -> Iterable[tuple[str, MetricStats]]:
    """``{"busbw": {"1048576": {...summary...}}}`` -> ``("busbw.1048576", stats)``."""
    for name, value in sorted(metrics.items()):
        if not prefix and (name in PARAMETER_NAMES or name.endswith(_PARAMETER_SUFFIXES)):
            continue
        full = f"{prefix}{name}"
        stats = metric_stats(value)
        if stats is not None:
            yield full, stats
        elif isinstance(value, Mapping) and depth < _MAX_NESTING:
            yield from _flatten_metrics(value, f"{full}.", depth + 1)


def _significant(a: MetricStats, b: MetricStats) -> tuple[bool, float | None]:
    """Whether A -> B is beyond noise (see the module docstring), and the noise used."""
    delta = abs(b.center - a.center)
    spreads = [s for s in (a.spread, b.spread) if s is not None]
    if not spreads:
        return delta > NO_SPREAD_REL_THRESHOLD * abs(a.center), None
    noise = max(spreads)
    a_low, a_high = _range(a)
    b_low, b_high = _range(b)
    disjoint = a_high < b_low or b_high < a_low
    return (delta > NOISE_K * noise and disjoint and delta > REL_THRESHOLD * abs(a.center)), noise


def _range(stats: MetricStats) -> tuple[float, float]:
    if stats.low is not None and stats.high is not None:
        return stats.low, stats.high
    half = (stats.spread or 0.0) / 2
    return stats.center - half, stats.center + half


def lower_is_better(name: str) -> bool:
    """As the bench catalog declares the metric; else latencies and durations improve downwards,
    rates, bandwidths and throughputs upwards (metrics no bench declares, from other writers)."""
    from stackforge.bench.catalog import metric_direction

    leaf = name.split(".")[0].lower()
    declared = metric_direction(leaf)
    if declared is not None:
        return declared == "lower"
    if any(token in leaf for token in _HIGHER_IS_BETTER):
        return False
    return any(token in leaf for token in _LOWER_IS_BETTER) or leaf.endswith(_TIME_UNITS)


# ---------------------------------------------------------------------------------------------- diff


def diff_snapshots(a: Snapshot, b: Snapshot) -> MatrixDiff:
    """Status changes of every cell in A or B, and metric changes beyond noise of metrics in both."""
    status_changes = tuple(StatusChange(key, a.cells.get(key), b.cells.get(key))
                           for key in sorted(set(a.cells) | set(b.cells))
                           if _status_of(a.cells.get(key)) != _status_of(b.cells.get(key)))
    shared = sorted(set(a.metrics) & set(b.metrics))
    compared = (compare_metric(key, a.metrics[key], b.metrics[key]) for key in shared)
    changes = [change for change in compared if change.trend != WITHIN_NOISE]
    return MatrixDiff(a=a.label, b=b.label, status_changes=status_changes, metric_changes=tuple(changes),
                      metrics_compared=len(shared), within_noise=len(shared) - len(changes))


def compare_metric(key: MetricKey, before: MetricStats, after: MetricStats) -> MetricChange:
    """One metric from A to B: its delta, the noise it was compared with, and its trend
    (``regression``, ``improvement``, or :data:`WITHIN_NOISE` by the rule of the module docstring)."""
    significant, noise = _significant(before, after)
    delta = after.center - before.center
    worse = delta > 0 if lower_is_better(key[3]) else delta < 0
    trend = ("regression" if worse else "improvement") if significant else WITHIN_NOISE
    return MetricChange(key, before, after, delta, delta / before.center if before.center else None, noise,
                        trend)


def _status_of(state: CellState | None) -> str | None:
    return None if state is None else state.status


# ---------------------------------------------------------------------------------------------- rendering


def write_diff(diff: MatrixDiff, fmt: str) -> str:
    """Render as ``md``, ``text`` or ``json``.

    Raises:
        SpecError: an unknown format.
    """
    if fmt == "json":
        return report_json_text(_json(diff))
    if fmt in ("md", "text"):
        return _text(diff, markdown=fmt == "md")
    raise SpecError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def _text(diff: MatrixDiff, *, markdown: bool) -> str:
    code = (lambda s: f"`{s}`") if markdown else (lambda s: s)
    # Record text (reasons, stack ids, paths) is made inert in markdown (no raw HTML, no javascript: link).
    inert = md_text if markdown else str
    bullet = "- " if markdown else "  "
    title = inert(f"stackforge matrix diff: {code(diff.a)} → {code(diff.b)}")
    lines = [f"{'### ' if markdown else ''}{title}", ""]
    lines.append(f"{len(diff.status_changes)} status change(s); {len(diff.metric_changes)} metric change(s) "
                 f"beyond noise; {diff.within_noise} of {diff.metrics_compared} shared metrics within noise; "
                 f"{len(diff.regressions)} regression(s).")
    if diff.status_changes:
        lines += ["", "Status changes:" if not markdown else "**Status changes**"]
        for change in diff.status_changes:
            target, stack, feature = change.key
            before = change.before.text() if change.before else "(absent)"
            after = change.after.text() if change.after else "(absent)"
            reason = change.after.reason if change.after else ""
            why = f" — {one_line(reason, 160)}" if reason else ""
            tag = "REGRESSION: " if change.regression else ""
            line = f"{tag}{code(stack)} · {code(feature)} on {target}: {before} → {after}{why}"
            lines.append(bullet + inert(line))
    if diff.metric_changes:
        lines += ["", "Metric changes beyond noise:" if not markdown else "**Metric changes beyond noise**"]
        for change in diff.metric_changes:
            target, stack, probe, metric = change.key
            relative = f" ({change.relative:+.1%})" if change.relative is not None else ""
            noise = (f"noise ±{change.noise:.3g}" if change.noise is not None
                     else "noise unknown (single values)")
            line = (f"{change.trend.upper()}: {code(stack)} · {probe} · {metric} on {target}: "
                    f"{change.before.center:.4g} → {change.after.center:.4g}{relative}; {noise}")
            lines.append(bullet + inert(line))
    return "\n".join(lines) + "\n"


def _json(diff: MatrixDiff) -> dict[str, Any]:
    def state(s: CellState | None) -> dict[str, Any] | None:
        if s is None:
            return None
        return {"status": s.status, "source": s.source, "tier": s.tier, "reason": s.reason}

    def stats(s: MetricStats) -> dict[str, Any]:
        return {"center": s.center, "low": s.low, "high": s.high, "spread": s.spread, "n": s.n}

    return {"schema": DIFF_SCHEMA, "schema_version": DIFF_SCHEMA_VERSION, "a": diff.a, "b": diff.b,
            "noise_rule": {"k": NOISE_K, "relative_threshold": REL_THRESHOLD,
                           "no_spread_relative_threshold": NO_SPREAD_REL_THRESHOLD},
            "status_changes": [{"target": c.key[0], "stack_id": c.key[1], "feature": c.key[2],
                                "before": state(c.before), "after": state(c.after),
                                "regression": c.regression}
                               for c in diff.status_changes],
            "metric_changes": [{"target": c.key[0], "stack_id": c.key[1], "probe": c.key[2],
                                "metric": c.key[3], "before": stats(c.before), "after": stats(c.after),
                                "delta": c.delta,
                                "relative": c.relative, "noise": c.noise, "verdict": c.trend}   # the key, kept: a file format
                               for c in diff.metric_changes],
            "metrics_compared": diff.metrics_compared, "within_noise": diff.within_noise,
            "regressions": len(diff.regressions)}

