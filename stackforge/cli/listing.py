"""``stackforge list targets|features|probes|rules``: what stackforge knows, as a table or JSON."""

from __future__ import annotations

import click

from stackforge.cli._compat import user_compat
from stackforge.cli.options import terminal_width
from stackforge.core.envelope import report_json_text
from stackforge.core.textfit import fit_table
from stackforge.report.listing import KINDS, list_kind


@click.command(name="list")
@click.argument("kind", type=click.Choice(KINDS))
@click.option("--json", "as_json", is_flag=True, help="Print versioned JSON (schema stackforge.list/1).")
def command(kind: str, as_json: bool) -> None:
    """List the known targets, features, probes or rules (with a --compat directory merged in).

    \b
    Examples:
      stackforge list targets
      stackforge --compat ./my-compat list rules --json
    """
    result = list_kind(kind, user_compat())
    if as_json:
        click.echo(report_json_text(result.to_json()), nl=False)
    else:
        click.echo("\n".join(fit_table(result.rows, result.headers, terminal_width())))
