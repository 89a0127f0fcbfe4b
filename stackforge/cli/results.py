"""``stackforge results``: check result folders and merge runs (e.g. the shards of a nightly run)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from stackforge.cli._evidence import warn
from stackforge.cli.options import out_folder_checked
from stackforge.report.evidence import skip_or_refuse
from stackforge.results.store import load_results, merge_runs


@click.group(name="results")
def command() -> None:
    """Check and merge result folders (<results>/<run-id>/<stack>/<target>/<probe>.json)."""


@command.command(name="merge")
@click.argument("sources", nargs=-1, required=True,
                type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--out", "--into", "out", type=click.Path(path_type=Path), default=Path("results"),
              show_default=True, callback=out_folder_checked,
              help="Results folder that receives the merged run (<out>/<run-id>/).")
@click.option("--run-id", default=None, help="Id of the merged run (default: a new id ending in -merged).")
@click.option("--skip-bad", is_flag=True,
              help="Merge what is usable and ignore unusable files (with a warning).")
def merge_command(sources: tuple[Path, ...], out: Path, run_id: str | None, skip_bad: bool) -> None:
    """Merge run folders, or results folders of runs (e.g. one per CI shard), by key (stack, target,
    probe): the newest record wins. Prints the new run folder.

    \b
    Example:
      stackforge results merge shards/*/ --out merged --run-id nightly-42
    """
    for source in sources:
        skip_or_refuse(load_results(source), skip_bad, warn)
    run_dir = merge_runs(sources, out, command=("stackforge", *sys.argv[1:]), run_id=run_id,
                         skip_bad=skip_bad)
    click.echo(str(run_dir))


@command.command(name="check")
@click.argument("path", type=click.Path(path_type=Path, file_okay=False, exists=True))
def check_command(path: Path) -> None:
    """Load every record under PATH and list every unusable file (exit 2 if there is one)."""
    loaded = load_results(path)
    skip_or_refuse(loaded, False, warn)
    click.echo(f"{len(loaded.records)} records in {len(loaded.runs)} run(s), no problems")
