"""Options shared by several commands, defined once."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Callable

import click

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
