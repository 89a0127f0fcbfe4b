"""Pieces shared by the commands that run things inside images (``probe``, ``bench``)."""

from __future__ import annotations

from collections.abc import Callable

from stackforge.core.records import ResultRecord, Status


def connect_engine():
    """A Docker client (imported late: ``--local`` runs never need the SDK), after removing the
    containers that runs which died on this host left behind (one notice line on stderr)."""
    import click

    from stackforge.edges.docker_engine import connect, reap_orphans
    client = connect()
    orphans = reap_orphans(client)
    if orphans.containers:
        click.echo(f"stackforge: {orphans.describe()}", err=True)
    return client


def status_counts_line(records: list[ResultRecord], word: Callable[[ResultRecord], str] | None = None) -> str:
    """``summary: 5 pass, 3 fail``: how many records ended in each status (``word``: the status as the reports
    call it, e.g. ``admitted`` for a pass that only shows the code admits the target)."""
    word = word or (lambda record: record.outcome.status.value)
    counts: dict[str, int] = {}
    for record in records:
        counts[word(record)] = counts.get(word(record), 0) + 1
    order = [Status.PASS.value, "built", "admitted", *(s.value for s in Status if s is not Status.PASS)]
    return "summary: " + ", ".join(f"{counts[w]} {w}" for w in order if w in counts)
