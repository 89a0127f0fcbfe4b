"""Options shared by several commands, defined once."""

from __future__ import annotations

import errno
import math
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from stackforge.core.errors import EnvironmentFault, SpecError, StackforgeError

if TYPE_CHECKING:
    from stackforge.plan.selection import StackSelection

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


def index_options(func: F) -> F:
    """--index-url, --extra-index-url, --find-links: where pip looks (``build``, ``render``, ``plan --preflight``)."""
    options = [
        click.option("--index-url", metavar="URL", default=None, help="pip index for everything but torch."),
        click.option("--extra-index-url", "extra_index_urls", metavar="URL", multiple=True,
                     help="Additional pip index (repeatable)."),
        click.option("--find-links", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
                     help="Wheelhouse directory; torch is taken from it (air-gapped builds)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def shard_option(func: F) -> F:
    """--shard K/N, arriving as a :class:`stackforge.core.shard.Shard` (or None)."""
    from stackforge.core.shard import click_shard_option
    return click_shard_option()(func)


def stack_selection(func: F) -> F:
    """--matrix, --cuda, --target, --only together."""
    for decorator in (only_option, target_option, cuda_option, matrix_option):
        func = decorator(func)
    return func


def selection(matrix: str | None, cuda: Sequence[str], targets: Sequence[str], only: Sequence[str],
              shard) -> StackSelection:
    """The stacks ``stack_selection`` and ``shard_option`` name, with this invocation's ``--compat`` overlay."""
    from stackforge.cli._compat import user_compat
    from stackforge.plan.selection import StackSelection

    return StackSelection(matrix, targets=tuple(targets), cuda=tuple(cuda), only=tuple(only),
                          shard=shard, user_compat=user_compat())


def image_options(func: F) -> F:
    """Options that change what is rendered (shared by ``build`` and ``render``)."""
    options = [
        click.option("--base-image", metavar="REF", default=None,
                     help="FROM image for every stack instead of the derived one."),
        index_options,
        click.option("--ca-bundle", metavar="PATH|none", default=None,
                     help="PEM bundle pip must trust; passed as a build secret, never stored in the image. "
                          "Default: the bundle pip on this host trusts (PIP_CERT, pip's cert setting, "
                          "REQUESTS_CA_BUNDLE); 'none' builds without one."),
        click.option("--no-deps", "no_deps", multiple=True, type=click.Choice(["flashinfer", "kernel", "sglang"]),
                     help="Install this layer's package without its dependencies (labelled in the image)."),
        click.option("--dependency-layers/--no-dependency-layers", default=True, show_default=True,
                     help="Install what FlashInfer/SGLang declare they need in a shared layer of its own "
                          "(asks the index for their metadata)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def ca_choice(ca_bundle: str | None):
    """The CA bundle for ``--ca-bundle`` (default: pip's on this host; ``none``: no bundle)."""
    from stackforge.build.trust import resolve_ca_bundle
    return resolve_ca_bundle(ca_bundle, os.environ)


def positive_seconds(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Click callback for a time limit (``--timeout``): a finite number of seconds above 0, else exit 2."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value} is not a number of seconds above 0", ctx=ctx, param=param)
    return value


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


def check_out_path(path: Path, *, option: str = "--out", folder: bool = False) -> Path:
    """Refuse, before any work, an output path that cannot be created (one line, exit 2).

    ``folder``: the path is a folder to create files in (``render``, ``results merge``), else a file
    written atomically beside its siblings (so its folder must be writable too).

    Raises:
        SpecError: an existing ancestor is a file, a folder on the way is not writable, or the path
            is a folder where a file is wanted (or the other way round).
    """
    what = "a folder" if folder else "a file"
    if path.exists() and path.is_dir() != folder:
        raise _out_error(option, path, f"it exists and is not {what}")
    ancestor = path if folder and path.exists() else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise _out_error(option, path, f"{ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise _out_error(option, path, f"{ancestor} is not writable")
    return path


def out_path_error(option: str, path: Path, exc: OSError) -> StackforgeError:
    """A write that failed after the checks: the host's fault (disk full, read-only, an I/O error: exit 3),
    else the same one-line error as the checks (a race: exit 2)."""
    if exc.errno in _HOST_FAULTS:
        return EnvironmentFault.from_os_error(exc, doing=f"writing {option} {path}")
    return _out_error(option, path, exc.strerror or type(exc).__name__)


# OS errors of a write that the path's choice cannot cause: the disk or its mount.
_HOST_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def _out_error(option: str, path: Path, why: str) -> SpecError:
    return SpecError(f"{option} {path}: cannot write there: {why}",
                     remedy=f"choose an {option} whose folder exists or can be created")


def out_file_option(func: F) -> F:
    """--out FILE: write the output there (atomically) instead of printing; checked before any work."""
    def checked(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
        return None if value is None else check_out_path(value)
    return click.option("--out", type=click.Path(path_type=Path), default=None, callback=checked,
                        help="Write here (atomically) instead of printing.")(func)


def out_folder_checked(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """Click callback for an --out that names a folder: :func:`check_out_path` before any work."""
    return check_out_path(value, folder=True)
