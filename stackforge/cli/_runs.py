"""Pieces shared by the commands that run things inside images (``probe``, ``bench``)."""

from __future__ import annotations

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


def status_counts_line(records: list[ResultRecord]) -> str:
    """``summary: 5 pass, 3 fail``: how many records ended in each status."""
    counts = {s: sum(r.outcome.status is s for r in records) for s in Status}
    return "summary: " + ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
