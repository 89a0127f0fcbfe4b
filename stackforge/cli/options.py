"""Options shared by several commands, defined once."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import Callable

import click

from stackforge.errors import SpecError

F = Callable[..., object]


def matrix_option(func: F) -> F:
    return click.option("--matrix", "matrix", metavar="FILE|NAME", default=None,
                        help="Matrix file, or the name of a shipped one (default: matrices/default.yaml).")(func)


def cuda_option(func: F) -> F:
    return click.option("--cuda", metavar="VERSION", multiple=True,
                        help="Only stacks with this CUDA toolkit (e.g. 13.1; repeatable: each one is kept).")(func)


def target_option(func: F) -> F:
    return click.option("--target", "targets", metavar="NAME", multiple=True,
                        help="Judge for this target profile (repeatable; default: the matrix's targets).")(func)


def only_option(func: F) -> F:
    return click.option("--only", "only", metavar="STACK_ID", multiple=True,
                        help="Only this stack id (repeatable).")(func)


def terminal_width() -> int | None:
    """Width to fit text to: ``COLUMNS`` when set, else the terminal's; ``None`` (no limit) for a file or pipe."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def shard_option(func: F) -> F:
    """--shard K/N, arriving as a :class:`stackforge.shard.Shard` (or None)."""
    from stackforge.shard import click_shard_option
    return click_shard_option()(func)


def stack_selection(func: F) -> F:
    """--matrix, --cuda, --target, --only together."""
    for decorator in (only_option, target_option, cuda_option, matrix_option):
        func = decorator(func)
    return func


def refuse_repeated_options(command: click.Command, args: Sequence[str]) -> None:
    """A one-value option given twice is an error: click would silently keep the last value.

    Options that take several values are declared ``multiple`` (``--cuda``, ``--target``...) and
    are not checked; flags given twice change nothing. Subcommands of a group are checked too.
    """
    takes_value = {opt: param for param in command.params if isinstance(param, click.Option) and not param.is_flag
                   and not param.count for opt in param.opts}
    seen: dict[str, list[str]] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            return
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg
        param = takes_value.get(name)
        if param is not None:
            if not param.multiple:
                seen.setdefault(param.name or name, []).append(name)
            index += 1 if "=" in arg else 2          # skip the option's value
            continue
        if isinstance(command, click.Group) and arg in command.commands:
            refuse_repeated_options(command.commands[arg], args[index + 1:])
            break
        index += 1
    for names in seen.values():
        if len(names) > 1:
            raise SpecError(f"{names[0]} was given {len(names)} times; it takes one value",
                            remedy=f"give {names[0]} once")


def refuse_unused(option: str, given: bool, *, needs: str, present: bool) -> None:
    """``option`` only means something with ``needs``: given without it, say so instead of ignoring it."""
    if given and not present:
        raise SpecError(f"{option} is only used with {needs}", remedy=f"add {needs} or drop {option}")


def refuse_together(first: str, second: str, both: bool, *, why: str) -> None:
    """Two options of which one would silently win over the other."""
    if both:
        raise SpecError(f"{first} and {second} cannot be combined: {why}", remedy=f"give {first} or {second}")
