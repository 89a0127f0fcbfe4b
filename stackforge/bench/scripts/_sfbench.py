"""Shared helpers for stackforge bench scripts (standard library only).

Bench scripts run INSIDE a stack image as ``python3 /stackforge/bench/<file>.py [args]``; this
module sits next to them and is imported as ``_sfbench`` (the script directory is ``sys.path[0]``).
It imports the shared probe helper ``_sfprobe`` (result line, facts, rank harness) and, beside it,
``_sfshared`` (:data:`shared`: the bandwidth formulas, summary statistics and
``json_safe`` that the host's ``stackforge.bench`` uses too), and holds what every bench script needs
besides: the time columns of a result row and the timing arguments.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys


def _import_sfprobe():
    """The shared probe helper ``_sfprobe`` (stdlib only), from the in-image package the runner puts on
    ``PYTHONPATH`` (mounted at ``/stackforge/inimage``; ``stackforge/inimage`` for a local run)."""
    try:
        import _sfprobe
    except ImportError as exc:
        # Without _sfprobe (and _sfshared beside it) there is no emit() and no marker constant: the one
        # result line is written by hand, as the contract wants.
        print("STACKFORGE_RESULT " + json.dumps({
            "status": "error",
            "reason": "_sfprobe.py (the in-image package stackforge/inimage) is not on PYTHONPATH",
            "evidence": f"{exc}; PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}", "metrics": {}, "facts": {}}),
            flush=True)
        sys.exit(0)
    return _sfprobe


sf = _import_sfprobe()

#: The formulas, statistics and json_safe shared with the host: ``_sfshared.py`` beside ``_sfprobe``.
shared = importlib.import_module("_sfshared")


# ------------------------------------------------------------------------------------------- results


def time_columns(spread: dict) -> dict:
    """The time columns of a result row from the ``shared.summarize`` of its per-call seconds."""
    return {"time_us": spread["median"] * 1e6, "time_us_min": spread["minimum"] * 1e6,
            "time_us_max": spread["maximum"] * 1e6, "time_cv": spread["cv"]}


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
