"""``stackforge compat ...``: commands about the compatibility knowledge itself.

``compat verify`` lints the rules (:mod:`stackforge.plan.rule_lint`, exit 2), then reads their witnesses in
the released wheels (see :mod:`stackforge.wheels.verify`); it exits 1 when a rule's bound disagrees with the
wheels or its range holds no release on the index.
"""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli._compat import PIN_RULES_ORIGIN, user_compat
from stackforge.core.envelope import report_json_text
from stackforge.core.errors import SpecError

VERIFY_SCHEMA = "stackforge.compat-verify/1"


@click.group(name="compat")
def command() -> None:
    """Check the compatibility knowledge (compat/rules) against the released wheels."""


@command.command(name="verify")
@click.option("--rule", "rule_ids", multiple=True, metavar="ID", help="Verify only this rule (repeatable).")
@click.option("--json", "as_json", is_flag=True, help=f"Print versioned JSON (schema {VERIFY_SCHEMA}).")
@click.option("--index-url", default=None, metavar="URL", help="Index to list releases from (default: pip's).")
@click.option("--find-links", multiple=True, metavar="LOCATION", help="Extra wheel locations, as pip's --find-links.")
@click.option("--cache", "cache_root", default=None, metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
              help="Wheel cache (default: $STACKFORGE_WHEEL_CACHE or ~/.cache/stackforge/wheels).")
def verify(rule_ids: tuple[str, ...], as_json: bool, index_url: str | None, find_links: tuple[str, ...],
           cache_root: Path | None) -> None:
    """Read each rule's witness in the releases on both sides of its version bounds (last outside, first
    inside, last inside, first outside) for the rule's own targets; print CONFIRMED / HALF-WITNESSED (a
    side of a bound undecided, named) / WRONG (with the measured bound) / UNWITNESSED (why) / EMPTY (its range
    holds no release on the index) per rule and the count witnessed / total. Exit 1 on any WRONG or EMPTY;
    exit 2 when the rules contradict each other, match every cell or hold an empty range.

    \b
    Examples:
      stackforge compat verify
      stackforge compat verify --rule sglang-ar-fusion-rejects-sm12 --json
    """
    from stackforge.plan.planner import load_knowledge
    from stackforge.plan.rule_lint import check_rules
    from stackforge.wheels.verify import write_verification_text, verify_rules

    knowledge = load_knowledge(user=user_compat())
    check_rules(knowledge.rules)   # contradictions, catch-all and empty ranges: exit 2 before any index work
    # Rules generated from SGLang's pins (tables.yaml) are data of another kind; only compat/rules here.
    rules = tuple(r for r in knowledge.rules if r.origin != PIN_RULES_ORIGIN)
    rules = _selected(rules, rule_ids)
    evaluate, list_releases = wheel_sources(index_url=index_url, find_links=find_links, cache_root=cache_root)
    report = verify_rules(rules, knowledge.targets, evaluate=evaluate, list_releases=list_releases)
    if as_json:
        click.echo(report_json_text({"schema": VERIFY_SCHEMA, **report.to_json()}), nl=False)
    else:
        click.echo(write_verification_text(report))
    for line in report.empty_ranges():
        click.echo(f"stackforge: error: {line} (hint: fix or remove the rule: it never fires)", err=True)
    if not report.ok:
        raise click.exceptions.Exit(1)


def _selected(rules, rule_ids: tuple[str, ...]):
    if not rule_ids:
        return rules
    by_id = {r.id: r for r in rules}
    unknown = [r for r in rule_ids if r not in by_id]
    if unknown:
        raise SpecError(f"unknown rule {', '.join(unknown)}; valid: {', '.join(sorted(by_id))}",
                        remedy="stackforge list rules")
    return tuple(by_id[r] for r in dict.fromkeys(rule_ids))


def wheel_sources(*, index_url: str | None, find_links: tuple[str, ...], cache_root: Path | None):
    """The real evaluator and release lister: wheels from the configured indexes, read from the cache."""
    from stackforge.wheels.readings import open_readings

    readings = open_readings(index_url=index_url, find_links=find_links, cache_root=cache_root)
    return readings.evaluate, readings.list_releases


@command.command(name="pins")
@click.option("--write", is_flag=True, help="Rewrite compat/sglang_pins.yaml from the index.")
@click.option("--index-url", default=None, metavar="URL",
              help="Index to read from (default: PyPI, the public source each row cites).")
def pins(write: bool, index_url: str | None) -> None:
    """Read every SGLang release's pins (torch, FlashInfer, kernel package, Python) from its wheel's METADATA
    on the index and compare them with compat/sglang_pins.yaml; --write regenerates the file.

    \b
    Exit 0: the file agrees with the index (or was rewritten); 1: it differs (each change listed);
    3: the index did not answer.
    """
    from stackforge.core.data import data_dir
    from stackforge.edges.index import IndexConfig
    from stackforge.edges.pip_config import PYPI_SIMPLE
    from stackforge.plan.lock_resolve import refresh_pins_file
    from stackforge.plan.pins_file import PINS_FILE, read_pins_file, write_pins_file

    path = data_dir("compat") / PINS_FILE
    current = read_pins_file(path)
    refresh = refresh_pins_file(current, indexes=IndexConfig(index_url=index_url or PYPI_SIMPLE))
    for line in (*refresh.changes, *(f"note: {n}" for n in refresh.notes)):
        click.echo(line)
    if write:
        write_pins_file(path, refresh.pins)
        click.echo(f"wrote {path} ({len(refresh.pins.rows)} releases)", err=True)
        return
    if refresh.changes:
        click.echo(f"{path} differs from the index: `stackforge compat pins --write` updates it", err=True)
        raise click.exceptions.Exit(1)
    click.echo(f"{path} agrees with the index ({len(refresh.pins.rows)} releases)", err=True)
