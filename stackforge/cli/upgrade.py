"""``stackforge upgrade``: two stacks side by side on a target (features gained and lost, driver floor,
image size, benchmark deltas, the dead ends that remain)."""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli._compat import user_compat
from stackforge.cli._evidence import (
    evidence_options,
    load_evidence,
    read_wheels_option,
    say_currency,
    warn,
    write_output,
)
from stackforge.cli.options import out_file_option
from stackforge.core.errors import SpecError
from stackforge.report.formats import write_upgrade
from stackforge.report.upgrade import FORMATS, StackChoice, upgrade_between


@click.command(name="upgrade")
@click.argument("stacks", nargs=-1, metavar="[FROM] [TO]")
@click.option("--from-cuda", "from_cuda", metavar="VERSION", default=None,
              help="Instead of FROM: the best stack of this CUDA family (pick's ranking), e.g. 12.8.")
@click.option("--to-cuda", "to_cuda", metavar="VERSION", default=None,
              help="Instead of TO: the best stack of this CUDA family (pick's ranking), e.g. 13.1.")
@click.option("--from-image", "from_image", metavar="REF", default=None,
              help="Instead of FROM: an image probed with `probe --image` (the reference it was probed under, "
                   "its name@sha256:... or its digest), e.g. the image a team runs today.")
@click.option("--to-image", "to_image", metavar="REF", default=None,
              help="Instead of TO: an image probed with `probe --image`.")
@evidence_options
@read_wheels_option
@click.option("--builds", "builds_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A `stackforge build --out` folder: image sizes from its build records "
                   "(default: image sizes unknown).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="text: one screen (a line per feature); md: for a pull request; html; json: everything.")
@click.option("--evidence", "-v", "evidence", is_flag=True,
              help="With --format text: every side's reason, code lines and sources, in full (the markdown).")
@out_file_option
def command(stacks: tuple[str, ...], from_cuda: str | None, to_cuda: str | None, from_image: str | None,
            to_image: str | None, results: Path,
            runs: tuple[str, ...], plan_path: Path | None, matrix: str | None, no_plan: bool, target: str | None,
            skip_bad: bool, read_wheels: bool, builds_dir: Path | None, fmt: str, evidence: bool,
            out: Path | None) -> None:
    """Compare stack FROM with stack TO on a target: features gained, lost, unchanged and undecided (each
    side with its evidence: measured tier, or the rule that predicts it), the driver floor, the image
    and its size, benchmark deltas with their spread, and the dead ends that remain after the upgrade.

    \b
    Examples:
      stackforge upgrade --from-cuda 12.8 --to-cuda 13.1 --target rtx-pro-6000-x8-pcie --results results
      stackforge upgrade cu128-torch2.9.1-fi0.6.3-sgl0.5.9-py312 --to-cuda 13.1 --format html --out up.html
      stackforge upgrade --from-image lmsysorg/sglang:v0.5.9-cu128 --to-cuda 13.1 --results results
    """
    before, after = _choices(stacks, from_cuda, to_cuda, from_image, to_image)
    loaded = load_evidence(results=results, runs=runs, plan_path=plan_path, matrix=matrix, no_plan=no_plan,
                           target=target, skip_bad=skip_bad, read_wheels=read_wheels)
    for line in loaded.abi_warnings:   # before the answer: an extension that would not import
        warn(line)
    report = upgrade_between(loaded, before, after, builds_dir=builds_dir,
                             plan_only=plan_path is not None or matrix is not None, user=user_compat())
    write_output(write_upgrade(report, fmt, evidence=evidence), out)
    say_currency(loaded, results)


def _choices(stacks: tuple[str, ...], from_cuda: str | None, to_cuda: str | None, from_image: str | None = None,
             to_image: str | None = None) -> tuple[StackChoice, StackChoice]:
    """FROM and TO from the arguments: stack ids, or --from-cuda / --to-cuda / --from-image / --to-image in place
    of either."""
    for role, cuda, image in (("from", from_cuda, from_image), ("to", to_cuda, to_image)):
        if cuda is not None and image is not None:
            raise SpecError(f"--{role}-cuda and --{role}-image both name the {role.upper()} side",
                            remedy=f"give one of them (--{role}-image with --{'to' if role == 'from' else 'from'}"
                                   "-cuda compares the image with a CUDA family's best stack)")
    named_from = from_cuda is not None or from_image is not None
    named_to = to_cuda is not None or to_image is not None
    wanted = 2 - named_from - named_to
    if len(stacks) != wanted:
        raise SpecError(f"upgrade needs a FROM and a TO: got {len(stacks)} stack id(s)"
                        + (f" besides --from-/--to- options (expected {wanted})" if wanted < 2 else ""),
                        remedy="give two stack ids, or --from-cuda/--from-image and --to-cuda/--to-image, or one "
                               "id and one of those options")
    ids = list(stacks)
    before = (StackChoice(cuda=from_cuda) if from_cuda is not None else StackChoice(image=from_image)
              if from_image is not None else StackChoice(stack_id=ids.pop(0)))
    after = (StackChoice(cuda=to_cuda) if to_cuda is not None else StackChoice(image=to_image)
             if to_image is not None else StackChoice(stack_id=ids.pop(0)))
    same = (before.stack_id is not None and before.stack_id == after.stack_id
            or before.cuda is not None and before.cuda == after.cuda
            or before.image is not None and before.image == after.image)
    if same:
        raise SpecError(f"FROM and TO are the same ({before.describe()}): an upgrade compares two stacks",
                        remedy="name two different stack ids, CUDA versions or images")
    return before, after
