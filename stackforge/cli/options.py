"""Options shared by several commands, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import click

F = Callable[..., object]


def matrix_option(func: F) -> F:
    return click.option("--matrix", "matrix", metavar="FILE|NAME", default=None,
                        help="Matrix file, or the name of a shipped one (default: matrices/default.yaml).")(func)


def cuda_option(func: F) -> F:
    return click.option("--cuda", metavar="VERSION", default=None,
                        help="Only stacks with this CUDA toolkit (e.g. 13.1).")(func)


def target_option(func: F) -> F:
    return click.option("--target", "targets", metavar="NAME", multiple=True,
                        help="Judge for this target profile (repeatable; default: the matrix's targets).")(func)


def only_option(func: F) -> F:
    return click.option("--only", "only", metavar="STACK_ID", multiple=True,
                        help="Only this stack id (repeatable).")(func)


def shard_option(func: F) -> F:
    """--shard K/N, arriving as a :class:`stackforge.shard.Shard` (or None)."""
    from stackforge.shard import click_shard_option
    return click_shard_option()(func)


def stack_selection(func: F) -> F:
    """--matrix, --cuda, --target, --only together."""
    for decorator in (only_option, target_option, cuda_option, matrix_option):
        func = decorator(func)
    return func


# --------------------------------------------------------------------------- --compat DIR and --version

def load_compat_overlay(folder: Path):
    """Load a user compat directory and print a notice for each shipped rule or target it replaces."""
    from stackforge.plan import load_knowledge
    from stackforge.user_compat import load_user_compat, override_notices

    overlay = load_user_compat(folder)
    for line in override_notices(load_knowledge(), overlay):
        click.echo(f"stackforge: notice: {line}", err=True)
    return overlay


def user_compat():
    """The ``--compat`` overlay of this invocation (a :class:`stackforge.user_compat.UserCompat`), or None."""
    ctx = click.get_current_context(silent=True)
    return ctx.find_root().obj if ctx is not None else None


def version_text(version: str, overlay) -> str:
    """``stackforge --version``: the version, how many rules, and the knowledge base's date."""
    from stackforge.plan import load_knowledge
    from stackforge.user_compat import load_about

    shipped = load_knowledge()
    line = f"stackforge {version}\nknowledge base: {len(shipped.rules)} rules, {len(shipped.targets)} targets, " \
           f"checked {load_about().knowledge_date.isoformat()} (compat/knowledge.yaml)"
    if overlay is not None:
        merged = load_knowledge(user=overlay)
        line += f"\nwith --compat {overlay.source}: {len(merged.rules)} rules, {len(merged.targets)} targets " \
                f"({len(overlay.rules)} user rule(s), {len(overlay.targets)} user target(s))"
    return line
