"""``stackforge deadends``: every feature that fails on a target, with evidence and the way out."""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli._evidence import (
    evidence_options,
    load_evidence,
    read_wheels_option,
    say_currency,
    write_output,
)
from stackforge.cli.options import out_file_option
from stackforge.report.compat_matrix import build_matrix
from stackforge.report.deadends import FORMATS, find_dead_ends, render_deadends


@click.command(name="deadends")
@evidence_options
@read_wheels_option
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="md", show_default=True)
@out_file_option
def command(results: Path, runs: tuple[str, ...], plan_path: Path | None, matrix: str | None, no_plan: bool,
            target: str | None, skip_bad: bool, read_wheels: bool, fmt: str, out: Path | None) -> None:
    """List each dead feature (measured fail/crash/timeout, or predicted unavailable), why, and the first
    stack that unblocks it.

    \b
    Example:
      stackforge deadends --target rtx-pro-6000-x8-pcie --plan plan.json
    """
    evidence = load_evidence(results=results, runs=runs, plan_path=plan_path, matrix=matrix, no_plan=no_plan,
                             target=target, skip_bad=skip_bad, read_wheels=read_wheels)
    report = build_matrix(evidence.records, evidence.plan, evidence.target, runs=evidence.runs)
    write_output(render_deadends(find_dead_ends(report), fmt), out)
    say_currency(evidence, results)
