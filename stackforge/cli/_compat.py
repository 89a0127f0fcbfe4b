"""``--compat DIR`` and ``--version`` of the ``stackforge`` group: loading the user overlay once,
handing it to each command, and the version text. The overlay travels as the root context's
``obj`` and every command passes it on explicitly (``plan_file(..., user_compat=user_compat())``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from stackforge.plan.user_compat import UserCompat

PIN_RULES_ORIGIN = "compat/sglang_pins.yaml"


def load_compat_overlay(folder: Path) -> UserCompat:
    """Load a user compat directory and print a notice for each shipped rule or target it replaces."""
    from stackforge.plan.planner import load_knowledge
    from stackforge.plan.user_compat import load_user_compat, override_notices

    overlay = load_user_compat(folder)
    shipped = load_knowledge()
    for line in override_notices(shipped.rules, shipped.targets, overlay):
        click.echo(f"stackforge: notice: {line}", err=True)
    return overlay


def user_compat() -> UserCompat | None:
    """The ``--compat`` overlay of this invocation, or None."""
    ctx = click.get_current_context(silent=True)
    return ctx.find_root().obj if ctx is not None else None


def version_text(version: str, overlay: UserCompat | None) -> str:
    """``stackforge --version``: the version, how many rules, and the knowledge base's date."""
    from stackforge.plan.planner import load_knowledge
    from stackforge.plan.user_compat import load_about

    shipped = load_knowledge()
    pins = sum(1 for rule in shipped.rules if rule.origin == PIN_RULES_ORIGIN)
    counts = (f"{len(shipped.rules)} rules ({len(shipped.rules) - pins} in compat/rules, {pins} from SGLang's "
              f"pins), {len(shipped.targets)} targets")
    lines = [f"stackforge {version}",
             f"knowledge base: {counts}, checked {load_about().knowledge_date.isoformat()} (compat/knowledge.yaml)"]
    if overlay is not None:
        merged = load_knowledge(user=overlay)
        lines.append(f"with --compat {overlay.source}: {len(merged.rules)} rules, {len(merged.targets)} targets "
                     f"({len(overlay.rules)} user rule(s), {len(overlay.targets)} user target(s))")
    return "\n".join(lines)
