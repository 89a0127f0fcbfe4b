"""``stackforge watch``: read what the index uploaded since the last watch, and say what it changed."""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli._compat import user_compat
from stackforge.cli.options import index_options, matrix_option, target_option


@click.command(name="watch")
@matrix_option
@target_option
@click.option("--package", "packages", metavar="DIST", multiple=True,
              help="Watch only this distribution (repeatable; default: sglang, sglang-kernel, sgl-kernel, "
                   "flashinfer-python, flashinfer-cubin, torch).")
@click.option("--after", metavar="V", default=None,
              help="Replay: read the releases after V (one --package; the state file is left alone).")
@click.option("--until", metavar="V", default=None, help="Replay: up to V (included).")
@click.option("--results", "results_root", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Results folder holding the state file (watch-state.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--md", "md_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the report as markdown (a pull request body, a job summary).")
@click.option("--json-out", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the JSON report to this file.")
@index_options
def command(matrix: str | None, targets: tuple[str, ...], packages: tuple[str, ...], after: str | None,
            until: str | None, results_root: Path, as_json: bool, md_path: Path | None, json_path: Path | None,
            index_url: str | None, extra_index_urls: tuple[str, ...], find_links: Path | None) -> None:
    """Read every release uploaded since the last watch: the wheel tier for every feature and target of the
    matrix, the rules whose bounds the release touches verified again (with a proposed patch to compat/
    where one no longer holds), the dead ends it unblocks, and the matrix lock's diff.

    \b
    Exit 0: nothing new; 1: new releases were read (the report says what changed); 2: bad input (an
    unknown package, a corrupt state), or another watch holds the state; 3: the index did not answer, or a
    report or the state could not be written (the state file is left as it was: the reports are written
    first, the state last, so the next watch reports the same releases again).
    The first watch on a results folder records a baseline and reads nothing.

    \b
    Examples:
      stackforge watch
      stackforge watch --package flashinfer-python --after 0.6.16.post4 --until 0.6.17 \\
          --target rtx-pro-6000-x8-pcie --json
      stackforge watch --md watch.md        # the nightly's job summary
    """
    from stackforge.core.data import resolve_matrix_path
    from stackforge.core.envelope import report_json_text
    from stackforge.core.fsio import atomic_write_text
    from stackforge.edges.index import IndexRequest
    from stackforge.watch.campaign import WATCHED, WatchReport, WatchRequest, run_watch
    from stackforge.watch.report import report_json, report_markdown, report_text

    request = WatchRequest(matrix_path=resolve_matrix_path(matrix), results_root=results_root,
                           packages=tuple(packages) or WATCHED, after=after, until=until, targets=tuple(targets),
                           index=IndexRequest(index_url, tuple(extra_index_urls), find_links))

    def publish(report: WatchReport) -> None:
        # Called by run_watch before it saves its state: a report that cannot be written is never lost news.
        payload = report_json(report)
        if md_path is not None:
            atomic_write_text(md_path, report_markdown(report))
        if json_path is not None:
            atomic_write_text(json_path, report_json_text(payload))
        click.echo(report_json_text(payload) if as_json else report_text(report), nl=not as_json)

    report = run_watch(request, user=user_compat(), on_progress=lambda line: click.echo(f"  {line}", err=True),
                       publish=publish)
    if report.anything_new:
        raise click.exceptions.Exit(1)
