"""``stackforge plan``: what would be built, what is pruned and why, what is predicted."""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli._compat import user_compat
from stackforge.cli.options import (
    index_options,
    refuse_together,
    refuse_unused,
    stack_selection,
    terminal_width,
)
from stackforge.core.data import resolve_matrix_path
from stackforge.core.errors import SpecError
from stackforge.plan.planner import MAX_CELLS, WARN_CELLS, Plan, large_plan_warning, plan_file
from stackforge.plan.text import explain_stack, plan_table


@click.command(name="plan")
@stack_selection
@click.option("--json", "as_json", is_flag=True, help="Print the plan as versioned JSON.")
@click.option("--explain", "explain", metavar="STACK_ID", default=None, help="List every rule that fired for one stack.")
@click.option("--preflight", is_flag=True,
              help="Also check the package indexes: does every pinned version have a file for this Python/platform?")
@click.option("--no-resolve", "no_resolve", is_flag=True,
              help="With --preflight: check the pinned files only; do not resolve each stack's lock.")
@click.option("--update-lock", "update_lock", is_flag=True,
              help="Resolve the matrix's selectors and SGLang pins against the index afresh, write "
                   "<matrix>.lock.yaml, print what changed, then plan on it.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Where preflight caches index answers (default: ~/.cache/stackforge/preflight).")
@click.option("--max-cells", "max_cells", type=click.IntRange(min=1), default=None, metavar="N",
              help=f"Plan up to N cells (default {MAX_CELLS:,}; past {WARN_CELLS:,} a warning says so).")
@index_options
def command(matrix: str | None, cuda: tuple[str, ...], targets: tuple[str, ...], only: tuple[str, ...], as_json: bool,
            explain: str | None, preflight: bool, no_resolve: bool, update_lock: bool, cache_dir: str | None,
            max_cells: int | None, index_url: str | None, extra_index_urls: tuple[str, ...],
            find_links: Path | None) -> None:
    """Expand a matrix, apply the compatibility rules, and show kept and pruned stacks with reasons.

    \b
    --preflight asks the indexes `build` installs from (--index-url, else PyPI; --extra-index-url,
    --find-links; pip's configuration on this host is not used, as the images never see it) and
    exits 1 when a pinned file is missing or an index is unreachable. Then it resolves each kept
    stack's lock as `stackforge build` does first (uv, a few seconds per stack) and exits 2 when the
    resolver refuses a stack, in the resolver's words (--no-resolve: files only).

    \b
    A matrix whose axes follow the index ({latest: N}, {spec: ...}, derive: {from: sglang}) is planned
    on its lock file, offline; --update-lock resolves it afresh first (exit 3: index unreachable,
    the old lock untouched).
    """
    _refuse_conflicts(as_json=as_json, explain=explain, preflight=preflight, no_resolve=no_resolve,
                      cache_dir=cache_dir, index_given=bool(index_url or extra_index_urls or find_links),
                      update_lock=update_lock)
    matrix_path = resolve_matrix_path(matrix)
    if update_lock:
        from stackforge.edges.index import IndexRequest, configured_indexes
        from stackforge.plan.lock_resolve import update_lock as resolve
        update = resolve(matrix_path, indexes=configured_indexes(IndexRequest(index_url, tuple(extra_index_urls),
                                                                              find_links)))
        click.echo(update.text(), err=True)
    plan = plan_file(matrix_path, targets=targets, cuda=cuda, only=only, user_compat=user_compat(),
                     max_cells=max_cells)
    warning = large_plan_warning(plan)
    if warning:
        click.echo(f"stackforge: warning: {warning}", err=True)
    checks = _preflight(plan, cache_dir, index_url, extra_index_urls, find_links) if preflight else None
    # Resolving is worth it only where every pinned file is there (else the report above says what is not).
    locks = (_preflight_locks(plan, checks.indexes, index_url, extra_index_urls, find_links)
             if checks is not None and checks.ok and not no_resolve else None)
    if explain:
        click.echo(explain_stack(plan, _find(plan, explain), terminal_width()))
    elif as_json:
        extra = {}
        if checks is not None:
            extra = {"preflight": checks.to_json(), "preflight_locks": [check.to_json() for check in locks or []]}
        _echo_streamed(plan.json_chunks(extra))
    else:
        click.echo(plan_table(plan, terminal_width()))
        if checks is not None:
            click.echo(checks.render())
        if locks is not None:
            click.echo("\nSTACK LOCKS (each kept stack resolved on this host, as `stackforge build` does first)")
            click.echo("\n".join(check.line() for check in locks))
    if any(check.error is not None for check in locks or []):
        raise click.exceptions.Exit(2)
    if checks is not None and not checks.ok:
        raise click.exceptions.Exit(1)


def _echo_streamed(chunks, batch: int = 2_000) -> None:
    """Print the JSON pieces a few thousand at a time: the text of the whole plan is never held at once."""
    pending: list[str] = []
    for chunk in chunks:
        pending.append(chunk)
        if len(pending) >= batch:
            click.echo("".join(pending), nl=False)
            pending.clear()
    click.echo("".join(pending), nl=False)


def _refuse_conflicts(*, as_json: bool, explain: str | None, preflight: bool, no_resolve: bool,
                      cache_dir: str | None, index_given: bool, update_lock: bool) -> None:
    """Options that one of the others would silently ignore are an error, not a surprise."""
    refuse_together("--json", "--explain", as_json and bool(explain),
                    why="they are two outputs (the JSON holds every cell's findings; narrow it with --only)")
    refuse_together("--explain", "--preflight", bool(explain) and preflight,
                    why="--explain does not run the index preflight (narrow the preflight with --only)")
    refuse_unused("--cache-dir", cache_dir is not None, needs="--preflight", present=preflight)
    refuse_unused("--no-resolve", no_resolve, needs="--preflight", present=preflight)
    refuse_unused("--index-url/--extra-index-url/--find-links", index_given, needs="--preflight or --update-lock",
                  present=preflight or update_lock)


def _preflight_locks(plan: Plan, indexes, index_url: str | None, extra_index_urls: tuple[str, ...],
                     find_links: Path | None):
    """Resolve each kept stack's lock (nothing recorded) from the indexes the preflight asked: the
    build's own (:func:`stackforge.edges.index.image_indexes`)."""
    from stackforge.build.locking import check_locks
    from stackforge.compose.dockerfile import ComposeOptions
    from stackforge.edges.index import resolver_indexes
    cells = [(stack, plan.cells_for(stack)[0].derived) for stack in plan.kept_stacks()]
    compose = ComposeOptions(index_url=index_url, extra_index_urls=tuple(extra_index_urls),
                             wheelhouse=find_links is not None)
    return check_locks(cells, compose=compose, indexes=resolver_indexes(indexes))


def _find(plan: Plan, stack_id: str):
    for cell in plan.cells:
        if cell.stack.id == stack_id:
            return cell.stack
    known = sorted({c.stack.id for c in plan.cells})
    raise SpecError(f"unknown stack id {stack_id!r}; known: {', '.join(known)}")


def _preflight(plan: Plan, cache_dir: str | None, index_url: str | None, extra_index_urls: tuple[str, ...],
               find_links: Path | None):
    from stackforge.cli.options import ca_choice
    from stackforge.edges.index import IndexRequest, image_indexes
    from stackforge.plan.preflight import run_preflight
    from stackforge.wheels.abi import check_stacks
    # The indexes and CA bundle `build` uses (not pip's configuration here: the images never see it).
    indexes = image_indexes(IndexRequest(index_url, tuple(extra_index_urls), find_links),
                            ca_bundle=ca_choice(None).path)
    return run_preflight(plan, cache_dir=cache_dir, indexes=indexes,
                         abi=lambda cells: check_stacks(cells, indexes=indexes).warnings())
