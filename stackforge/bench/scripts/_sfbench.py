"""Shared helpers for stackforge bench scripts (standard library only).

Bench scripts run INSIDE a stack image as ``python3 /stackforge/bench/<file>.py [args]``; this
module sits next to them and is imported as ``_sfbench`` (the script directory is ``sys.path[0]``).
It finds and imports the shared probe helper ``_sfprobe`` (result line, facts, rank harness) and
holds what every bench script needs besides: the statistics summary of repeated timings, the
choice between the package's formulas and the in-image copies, and the timing arguments.

stackforge itself is not installed inside images, so :func:`summarize_copy` is a copy of
``stackforge.bench.stats.summarize``; ``tests/test_bench_metrics.py`` asserts that they agree.
Where stackforge is importable (local runs) the package's functions are used instead, and
:data:`FORMULAS_FROM` records which ones a result was computed with.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import types


def _import_sfprobe():
    """The shared probe helper ``_sfprobe`` (stdlib only): next to this file, at the container mount
    ``/stackforge/probes`` (``../probes``), or in the repository (``../../probes/scripts``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in (here, os.path.join(here, "..", "probes"),
                   os.path.join(here, "..", "..", "probes", "scripts")):
        if os.path.isfile(os.path.join(folder, "_sfprobe.py")):
            if folder not in sys.path:
                sys.path.insert(0, os.path.normpath(folder))
            import _sfprobe
            return _sfprobe
    # Without _sfprobe there is no emit(); the result line is written by hand, as the contract wants.
    print("STACKFORGE_RESULT " + json.dumps({
        "status": "error",
        "reason": "_sfprobe.py (the shared probe helper) is not mounted beside the bench scripts",
        "evidence": here, "metrics": {}, "facts": {}}), flush=True)
    sys.exit(0)


sf = _import_sfprobe()


# ------------------------------------------------------------------------------------------- formulas


def summarize_copy(samples) -> dict:
    """In-image copy of ``stackforge.bench.stats.summarize(samples).to_json()``: median, min, max,
    mean, sample stdev and coefficient of variation. Raises ValueError on no or non-finite samples."""
    values = [float(s) for s in samples]
    if not values:
        raise ValueError("cannot summarize zero samples")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"samples must be finite numbers, got {values!r}")
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"n": len(values), "median": statistics.median(values), "minimum": min(values),
            "maximum": max(values), "mean": mean, "stdev": stdev, "cv": stdev / mean if mean != 0 else 0.0}


def _package_formulas():
    """stackforge.bench's formulas by name, or None where stackforge is not importable (in images).

    All or nothing: a result is computed either with the package's functions or with the copies,
    never a mix, so that ``formulas_from`` in its facts says the truth."""
    try:
        from stackforge.bench.metrics import algbw_gbps, busbw_factor, tflops
        from stackforge.bench.stats import summarize as package_summarize
    except ImportError:
        return None

    def summarize(samples) -> dict:
        return package_summarize(samples).to_json()

    return types.MappingProxyType({"algbw_gbps": algbw_gbps, "busbw_factor": busbw_factor, "tflops": tflops,
                                   "summarize": summarize})


_PACKAGE_FORMULAS = _package_formulas()
FORMULAS_FROM = "script copy" if _PACKAGE_FORMULAS is None else "stackforge.bench"


def formula(name: str, copy):
    """``stackforge.bench``'s function ``name`` where the package is importable, else ``copy``
    (the script's in-image copy of it)."""
    return copy if _PACKAGE_FORMULAS is None else _PACKAGE_FORMULAS[name]


summarize = formula("summarize", summarize_copy)


def time_columns(spread: dict) -> dict:
    """The time columns of a result row from the :func:`summarize` of its per-call seconds."""
    return {"time_us": spread["median"] * 1e6, "time_us_min": spread["minimum"] * 1e6,
            "time_us_max": spread["maximum"] * 1e6, "time_cv": spread["cv"]}


def json_safe(value):
    """Strict JSON for metrics: non-finite floats (SGLang writes ``request_rate: Infinity``) become
    strings, tuples lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# ------------------------------------------------------------------------------------------- arguments


def add_timing_arguments(parser: argparse.ArgumentParser, *, warmup: int, iters: int, repeats: int) -> None:
    """``--warmup``, ``--iters`` and ``--repeats`` with this script's defaults (check them with
    :func:`parse_timed_args`)."""
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed calls before timing")
    parser.add_argument("--iters", type=int, default=iters, help="calls per timed repeat")
    parser.add_argument("--repeats", type=int, default=repeats, help="timed repeats (the median is kept)")


def parse_timed_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse ``argv``; a usage error (exit 2) unless at least one timed call and repeat remain."""
    args = parser.parse_args(argv)
    if args.iters < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--iters and --repeats must be >= 1, --warmup >= 0")
    return args
