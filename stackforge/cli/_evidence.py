"""Options shared by ``matrix``, ``deadends``, ``pick`` and ``upgrade``: results + plan -> evidence.

Only parsing, checking options that exclude each other and printing live here; the evidence is loaded by
:func:`stackforge.report.evidence.load_evidence`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import click
from click.core import ParameterSource

from stackforge.cli._compat import user_compat
from stackforge.cli.options import out_path_error, refuse_together
from stackforge.core.errors import SpecError
from stackforge.core.fsio import atomic_write_text
from stackforge.report import evidence as report_evidence
from stackforge.report.evidence import Evidence, EvidenceRequest

F = Callable[..., object]


def evidence_options(func: F) -> F:
    """--results, --run, --plan, --matrix, --no-plan, --target, --skip-bad."""
    options = (
        click.option("--results", "results", type=click.Path(path_type=Path), default=Path("results"),
                     show_default=True,
                     help="A run folder, or a results folder of runs (a measurement outranks a newer record that "
                          "measured nothing, then the newest wins). Left at the default and missing: predictions "
                          "only; given and missing: an error."),
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


def load_evidence(*, results: Path, runs: Sequence[str], plan_path: Path | None, matrix: str | None,
                  no_plan: bool, target: str | None, skip_bad: bool, read_wheels: bool = False) -> Evidence:
    """The evidence options, checked for those that exclude each other, then
    :func:`stackforge.report.evidence.load_evidence` (its warnings and progress on stderr)."""
    refuse_together("--plan", "--matrix", plan_path is not None and matrix is not None,
                    why="both say where the predictions come from")
    for option, given in (("--plan", plan_path is not None), ("--matrix", matrix is not None)):
        refuse_together("--no-plan", option, no_plan and given, why="--no-plan drops the predictions")
    refuse_together("--read-wheels", "--plan", read_wheels and plan_path is not None,
                    why="the wheels read are those of a matrix (--matrix), not of a plan file")
    check_results_path(results, creates=read_wheels)
    request = EvidenceRequest(results=results, runs=tuple(runs), plan_path=plan_path, matrix=matrix, no_plan=no_plan,
                              target=target, skip_bad=skip_bad, read_wheels=read_wheels, user_compat=user_compat(),
                              command=tuple(sys.argv))
    return report_evidence.load_evidence(request, warn=warn, tell=lambda line: click.echo(line, err=True))


def check_results_path(results: Path, *, creates: bool = False) -> None:
    """Refuse a ``--results`` that cannot be a results folder: a file, or (given on the command line) a folder
    that is not there, which would otherwise read as "predictions only" and exit 0. Left at its default, a
    missing ``results/`` is how a first run looks: predictions only. ``creates``: the command writes the
    folder (``--read-wheels``).

    Raises:
        SpecError: a file, or a missing folder that was asked for (exit 2).
    """
    if results.exists() and not results.is_dir():
        raise SpecError(f"--results {results} is a file, not a results folder",
                        remedy="pass the folder `stackforge probe --results` wrote, or one run folder in it")
    if not results.exists() and not creates and _given_on_command_line("results"):
        raise SpecError(f"no such results folder {results}",
                        remedy="run `stackforge probe` first or drop --results")


def _given_on_command_line(name: str) -> bool:
    """Whether the option ``name`` of the running command was given (command line or environment), not defaulted."""
    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def say_currency(evidence: Evidence, results: Path) -> None:
    """After the answer, on stderr: how current it is (the newest releases read, newer ones on the index)."""
    if evidence.currency is not None:
        click.echo(evidence.currency.line(results), err=True)


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
