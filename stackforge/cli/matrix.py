"""``stackforge matrix``: the compatibility matrix of a target; ``stackforge matrix diff A B``."""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli._evidence import evidence_options, load_evidence, say_currency, warn, write_output
from stackforge.cli.options import out_file_option
from stackforge.report.compat_matrix import FORMATS, build_matrix
from stackforge.report.diff import FORMATS as DIFF_FORMATS
from stackforge.report.diff import check_target, diff_snapshots, load_snapshot, write_diff
from stackforge.report.formats import write_matrix


@click.group(name="matrix", invoke_without_command=True)
@evidence_options
@click.option("--feature", "features", metavar="NAME", multiple=True,
              help="Only these feature columns, in this order (repeatable).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="text: one screen (a line per feature, a column per kept stack); md: for a pull request; "
                   "html; json / csv: everything.")
@click.option("--evidence", "-v", "evidence", is_flag=True,
              help="With --format text: every cell with its reason and evidence, and the pruned stacks (the markdown).")
@out_file_option
@click.pass_context
def command(ctx: click.Context, results: Path, runs: tuple[str, ...], plan_path: Path | None,
            matrix: str | None, no_plan: bool, target: str | None, skip_bad: bool, features: tuple[str, ...],
            fmt: str, evidence: bool, out: Path | None) -> None:
    """Render the stacks x features matrix of one target: measured cells, predicted cells, evidence.

    \b
    Examples:
      stackforge matrix --target rtx-pro-6000-x8-pcie --format md
      stackforge matrix --results results/ --plan plan.json --format html --out matrix.html
      stackforge matrix diff results/RUN_A results/RUN_B
    """
    if ctx.invoked_subcommand is not None:
        return
    loaded = load_evidence(results=results, runs=runs, plan_path=plan_path, matrix=matrix, no_plan=no_plan,
                           target=target, skip_bad=skip_bad)
    report = build_matrix(loaded.records, loaded.plan, loaded.target, features=features, runs=loaded.runs,
                          hosts=loaded.hosts)
    write_output(write_matrix(report, fmt, evidence=evidence), out)
    say_currency(loaded, results)


@command.command(name="diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--target", "target", metavar="NAME", default=None, help="Only this target's cells.")
@click.option("--format", "fmt", type=click.Choice(DIFF_FORMATS), default="md", show_default=True)
@out_file_option
@click.option("--skip-bad", is_flag=True, help="Ignore unusable record files (with a warning).")
@click.option("--fail-on", "fail_on", type=click.Choice(("regression", "change", "never")),
              default="regression", show_default=True,
              help="Exit 1 on a regression (a passing cell that broke, a metric worse beyond noise), "
                   "on any change, or never.")
def diff_command(a: Path, b: Path, target: str | None, fmt: str, out: Path | None, skip_bad: bool,
                 fail_on: str) -> None:
    """Compare A and B (run folders, results folders or matrix JSON files): cells that changed status,
    and metrics that moved beyond the runs' own noise (rule: see stackforge.report.diff).

    \b
    Exit codes: 0 nothing to report · 1 regression (or change, with --fail-on change) · 2 bad input
    """
    before = load_snapshot(a, target=target, skip_bad=skip_bad, warn=warn)
    after = load_snapshot(b, target=target, skip_bad=skip_bad, warn=warn)
    check_target(target, before, after)
    diff = diff_snapshots(before, after)
    write_output(write_diff(diff, fmt), out)
    failed = {"regression": bool(diff.regressions), "change": diff.changed, "never": False}[fail_on]
    if failed:
        raise click.exceptions.Exit(1)
