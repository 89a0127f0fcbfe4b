"""Options and loading shared by ``matrix``, ``deadends`` and ``pick``: results + plan -> evidence.

Only parsing and dispatch live here: the loaders are :func:`stackforge.results.store.load_results` and
:meth:`stackforge.plan.planner.Plan.from_json`; planning is :func:`stackforge.plan.planner.plan_file`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from stackforge.cli.options import out_path_error, refuse_together
from stackforge.core.errors import SpecError, StackforgeError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.records import ResultRecord
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import choose_target
from stackforge.results.store import LoadedResults, describe_problems, holds_results, load_results
from stackforge.watch.currency import Currency, currency
from stackforge.watch.state import WatchState, read_state, state_path

F = Callable[..., object]


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a report is built from."""

    records: tuple[ResultRecord, ...]
    plan: Plan
    target: str
    runs: tuple[str, ...]
    #: no probe results at all: every cell is a prediction (reports and pick say so)
    predictions_only: bool = False
    #: how current the evidence is: the newest releases read, and newer ones the last watch saw
    currency: Currency | None = None


def evidence_options(func: F) -> F:
    """--results, --run, --plan, --matrix, --no-plan, --target, --skip-bad."""
    options = (
        click.option("--results", "results", type=click.Path(path_type=Path), default=Path("results"),
                     show_default=True,
                     help="A run folder, or a results folder of runs (newest record per key wins)."),
        click.option("--run", "runs", metavar="RUN_ID", multiple=True,
                     help="Only these runs of the results folder (repeatable; 'latest' = newest)."),
        click.option("--plan", "plan_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
                     help="Plan JSON from `stackforge plan --json` "
                          "(predictions, pruned stacks, driver minimums)."),
        click.option("--matrix", "matrix", metavar="FILE|NAME", default=None,
                     help="Plan this matrix for the predictions instead of reading --plan "
                          "(default: the runs' own matrix, else matrices/default.yaml)."),
        click.option("--no-plan", is_flag=True,
                     help="Measured results only: no predictions, no pruned stacks."),
        click.option("--target", "target", metavar="NAME", default=None,
                     help="Target profile (default: the only one in the results/plan)."),
        click.option("--skip-bad", is_flag=True,
                     help="Load what is usable and warn about corrupt, partial or newer-schema records "
                          "(default: refuse and list them)."),
    )
    for option in reversed(options):
        func = option(func)
    return func


def read_wheels_option(func: F) -> F:
    """--read-wheels: read the plan's pinned releases from the index before answering (``deadends``, ``upgrade``)."""
    return click.option("--read-wheels", "read_wheels", is_flag=True,
                        help="First read the matrix's pinned FlashInfer / SGLang releases from their wheels on the "
                             "index (the wheel tier: seconds, no image, no GPU) into --results, then answer "
                             "from those readings instead of the rules alone.")(func)


def read_wheels_first(*, results: Path, matrix: str | None, target: str | None) -> None:
    """The wheel tier for the matrix's kept stacks on ``target``, recorded as a new run under ``results``."""
    from stackforge.cli._compat import user_compat
    from stackforge.edges.index import IndexRequest
    from stackforge.plan.selection import StackSelection
    from stackforge.probes.campaign import ProbeRequest, run_probe_campaign
    from stackforge.results.store import ResultsFolder

    click.echo(f"reading the pinned releases' wheels from the index into {results} (the wheel tier: their own "
               "code, no image, no GPU)", err=True)
    request = ProbeRequest(StackSelection(matrix, targets=(target,) if target else (), user_compat=user_compat()),
                           tier="wheel", index=IndexRequest())
    records = run_probe_campaign(request, store=ResultsFolder(results, command=tuple(sys.argv)),
                                 connect=lambda: None)
    click.echo(f"read {len(records)} reading(s)", err=True)


def load_evidence(*, results: Path, runs: Sequence[str], plan_path: Path | None, matrix: str | None,
                  no_plan: bool, target: str | None, skip_bad: bool, read_wheels: bool = False) -> Evidence:
    """Load the records (strictly unless ``skip_bad``) and the plan, and settle the target.

    Without any results (no folder, or no run in it) the plan alone is the evidence: predictions
    are what a user wants first, before anything is built. ``--run`` and ``--no-plan`` still need
    results, since there would be nothing to show.
    """
    refuse_together("--plan", "--matrix", plan_path is not None and matrix is not None,
                    why="both say where the predictions come from")
    for option, given in (("--plan", plan_path is not None), ("--matrix", matrix is not None)):
        refuse_together("--no-plan", option, no_plan and given, why="--no-plan drops the predictions")
    if read_wheels:
        refuse_together("--read-wheels", "--plan", plan_path is not None,
                        why="the wheels read are those of a matrix (--matrix), not of a plan file")
        read_wheels_first(results=results, matrix=matrix, target=target)
    predictions_only = not runs and not no_plan and not holds_results(results)
    loaded = LoadedResults(records=(), source=str(results)) if predictions_only else load_results(results, runs=runs)
    check_problems(loaded, skip_bad)
    plan = _plan(loaded, plan_path=plan_path, matrix=matrix, no_plan=no_plan, target=target,
                 strict=predictions_only)
    chosen = choose_target(loaded.records, plan, target)
    if predictions_only:
        warn(f"predictions only — no probe results in {results}: every cell is what the rules predict "
             "(--read-wheels reads the releases' own code in seconds, no image; `stackforge probe` measures)")
    runs = tuple(info.run_id for info in loaded.runs)
    current = currency(loaded.records, (cell.stack.to_json() for cell in plan.cells), _watch_state(results))
    return Evidence(records=loaded.records, plan=plan, target=chosen, runs=runs,
                    predictions_only=predictions_only, currency=current)


def _watch_state(results: Path) -> WatchState | None:
    """The last watch's state in the results folder; a corrupt one is warned about, not fatal to a report."""
    if not results.is_dir():
        return None
    try:
        return read_state(state_path(results))
    except SpecError as exc:
        warn(f"{exc.one_line()}; the report is not compared with the index")
        return None


def say_currency(evidence: Evidence, results: Path) -> None:
    """After the answer, on stderr: how current it is (the newest releases read, newer ones on the index)."""
    if evidence.currency is not None:
        click.echo(evidence.currency.line(results), err=True)


def check_problems(loaded: LoadedResults, skip_bad: bool) -> None:
    """Refuse unusable files (listing all of them), or warn with their count and paths."""
    if not loaded.problems:
        return
    if not skip_bad:
        loaded.raise_for_problems()
    warn(f"--skip-bad: ignoring {describe_problems(loaded.problems, loaded.source)}")


def warn(message: str) -> None:
    """A warning line (or block) on stderr."""
    click.echo(f"stackforge: warning: {message}", err=True)


def write_output(text: str, out: Path | None) -> None:
    """Print ``text``, or write it atomically to ``out`` and say where."""
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        atomic_write_text(out, text)
    except OSError as exc:
        raise out_path_error("--out", out, exc) from None
    click.echo(f"wrote {out}", err=True)


def _plan(loaded: LoadedResults, *, plan_path: Path | None, matrix: str | None, no_plan: bool,
          target: str | None, strict: bool = False) -> Plan:
    if no_plan:
        return Plan.empty()
    if plan_path is not None:
        return Plan.read(plan_path)
    # The runs remember the matrix they were planned from; use it when it is here and unambiguous.
    run_matrices = sorted({i.matrix_source for i in loaded.runs if i.matrix_source})
    own = run_matrices[0] if len(run_matrices) == 1 and Path(run_matrices[0]).is_file() else None
    chosen = matrix or own
    try:
        return _plan_matrix(chosen, target)
    except StackforgeError as exc:
        if matrix is not None or strict:
            raise   # asked for explicitly, or the only evidence there is: its errors are the user's to see
        warn(f"no predictions: planning the default matrix failed ({exc.one_line()}); showing measured "
             "cells only (pass --plan or --matrix)")
        return Plan.empty()


def _plan_matrix(matrix: str | None, target: str | None) -> Plan:
    """Plan a matrix with the shipped knowledge (and a user compat directory on top)."""
    from stackforge.cli._compat import user_compat
    from stackforge.core.data import resolve_matrix_path
    from stackforge.plan.planner import plan_file

    return plan_file(resolve_matrix_path(matrix), targets=(target,) if target else (),
                     user_compat=user_compat())



