"""The ``stackforge`` command line: parses options and dispatches; no logic lives here.

Commands are loaded lazily (one module per command under ``stackforge/cli/``, each exposing a
click object named ``command``) so ``stackforge plan`` never imports Docker or jinja2.
Every :class:`~stackforge.core.errors.StackforgeError` is turned into one line on stderr and its exit
code here, and only here; so is an OS error no code caught (disk full, read-only, permission: an
:class:`~stackforge.core.errors.EnvironmentFault`, exit 3) and a recursion error (input nested past
Python's limit: exit 2). No fault ends in a traceback or in exit 1, which means "failed" or "news".
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click

from stackforge import __version__
from stackforge.core.errors import EnvironmentFault, SpecError, StackforgeError, interrupt_signal
from stackforge.edges.runner import signal_name, signals_as_interrupts

# command name -> (module under stackforge.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "Expand a matrix, apply the compatibility rules, show what would be built and why."),
    "render": ("render", "Write each stack's Dockerfile and build context."),
    "build": ("build", "Compose and build the images of a matrix (BuildKit or classic)."),
    "bootstrap-base": ("bootstrap", "Create a Debian base image without any registry (debootstrap)."),
    "probe": ("probe", "Run capability probes inside each image (gate tier without a GPU)."),
    "bench": ("bench", "Run throughput benchmarks inside each image."),
    "results": ("results", "Manage result folders (merge shards)."),
    "matrix": ("matrix", "Render the compatibility matrix (md, html, json, csv) or diff two runs."),
    "deadends": ("deadends", "List every feature that fails on a target, with evidence."),
    "pick": ("pick", "Pick the best known-good image for a target by evidence."),
    "qualify": ("qualify", "Write an image digest's qualification record (in-toto); --push attaches it to the image."),
    "upgrade": ("upgrade", "Two stacks side by side: features gained and lost, driver floor, image size, benchmarks."),
    "ci": ("ci", "Generate CI workflows for the nightly matrix."),
    "doctor": ("doctor", "Check this host: engine, buildx, disk, GPUs, runnable targets, index, registry, CA bundle."),
    "list": ("listing", "List the known targets, features, probes or rules."),
    "compat": ("compat", "Check the compatibility rules against the released wheels (compat verify)."),
    "bisect": ("bisect", "Find the release where a feature's verdict changes, read from the wheels on the index."),
    "watch": ("watch", "Read what the index uploaded since the last watch: verdicts, rules and stacks it changes."),
}


class LazyGroup(click.Group):
    """A click group that imports a command's module only when that command runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(f"stackforge.cli.{COMMANDS[cmd_name][0]}")
        return module.command

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            from stackforge.cli.options import refuse_repeated_options
            refuse_repeated_options(command, rest)
        return name, command, rest

    def invoke(self, ctx: click.Context):
        # The one place where errors become exit codes (also under click's CliRunner). SIGTERM and
        # SIGHUP interrupt like Ctrl-C; an interruption exits 128 + its signal (130, 143, 129).
        try:
            with signals_as_interrupts():
                return super().invoke(ctx)
        except StackforgeError as exc:
            _fail(ctx, exc)
        except BrokenPipeError:
            raise                       # stdout closed by the reader (`| head`): click's own quiet exit
        except OSError as exc:
            # Disk full, read-only, permission denied... where no code gave it more context: the
            # environment, not the stack (exit 3), and never 1, which means "failed" or "news".
            _fail(ctx, EnvironmentFault.from_os_error(exc), foreign=True)
        except RecursionError:
            _fail(ctx, SpecError("an input is nested too deeply to read (past Python's recursion limit)",
                                 remedy="check the files given (records, plan, matrix, lock) for runaway nesting"))
        except KeyboardInterrupt as exc:
            signum = interrupt_signal(exc)
            click.echo(f"stackforge: interrupted by {signal_name(signum)}; finished work was kept", err=True)
            ctx.exit(128 + signum)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help lists commands from the table, without importing every module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in sorted(COMMANDS)])


def _fail(ctx: click.Context, exc: StackforgeError, *, foreign: bool = False) -> None:
    """Print ``exc`` as the one error line and exit with its code. ``foreign``: the words are not
    stackforge's (an OS error's, which can quote a URL with ``user:password@``), so credentials are
    taken out first."""
    line = exc.one_line()
    if foreign:
        from stackforge.edges.pip_config import redact_urls
        line = redact_urls(line)
    click.echo(f"stackforge: error: {line}", err=True)
    ctx.exit(exc.exit_code)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             invoke_without_command=True, no_args_is_help=True)
@click.option("--compat", "compat_dir", envvar="STACKFORGE_COMPAT", metavar="DIR", default=None,
              type=click.Path(file_okay=False, path_type=Path),
              help="Extra rules (*.yaml, rules/*.yaml) and targets (targets.yaml) merged over the shipped "
                   "compat data; a same id/name replaces the shipped one, with a notice. Env: STACKFORGE_COMPAT.")
@click.option("--version", "show_version", is_flag=True,
              help="Show the version, the number of rules and the knowledge base's date, and exit.")
@click.pass_context
def cli(ctx: click.Context, compat_dir: Path | None, show_version: bool) -> None:
    """stackforge: find a working CUDA x torch x FlashInfer x SGLang stack for your GPUs, by machine."""
    from stackforge.cli._compat import load_compat_overlay, version_text

    # The overlay travels to each command as ctx.obj; commands pass it on explicitly.
    ctx.obj = load_compat_overlay(compat_dir) if compat_dir else None
    if show_version:
        click.echo(version_text(__version__, ctx.obj))
        ctx.exit(0)
    if ctx.invoked_subcommand is None:
        ctx.fail("Missing command.")


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    cli.main(args=argv, prog_name="stackforge")
