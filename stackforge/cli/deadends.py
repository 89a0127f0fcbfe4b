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
from stackforge.report.deadends import FORMATS, find_dead_ends, write_deadends


@click.command(name="deadends")
@evidence_options
@read_wheels_option
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="text: one screen (a line per dead feature and its way out); md: for a pull request, the "
                   "evidence folded; json: everything.")
@click.option("--evidence", "-v", "evidence", is_flag=True,
              help="With --format text: every stack's reason, code lines and sources, in full.")
@out_file_option
def command(results: Path, runs: tuple[str, ...], plan_path: Path | None, matrix: str | None, no_plan: bool,
            target: str | None, skip_bad: bool, read_wheels: bool, fmt: str, evidence: bool, out: Path | None) -> None:
    """List each dead feature (measured fail/crash/timeout, or predicted unavailable), why, and the first
    stack that unblocks it.

    \b
    Example:
      stackforge deadends --target rtx-pro-6000-x8-pcie --plan plan.json
    """
    loaded = load_evidence(results=results, runs=runs, plan_path=plan_path, matrix=matrix, no_plan=no_plan,
                           target=target, skip_bad=skip_bad, read_wheels=read_wheels)
    report = build_matrix(loaded.records, loaded.plan, loaded.target, runs=loaded.runs, hosts=loaded.hosts)
    write_output(write_deadends(find_dead_ends(report), fmt, evidence=evidence), out)
    say_currency(loaded, results)
