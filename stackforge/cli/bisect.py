"""``stackforge bisect``: the release where a feature's verdict changes, read from the wheels on the index."""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli._compat import user_compat
from stackforge.cli.options import index_options
from stackforge.core.envelope import report_json_text


@click.command(name="bisect")
@click.argument("feature", metavar="FEATURE")
@click.option("--target", "target_name", default=None, metavar="NAME",
              help="Target profile (see `stackforge list targets`); required but with --through-pins (default: every "
                   "target).")
@click.option("--package", metavar="DIST", default=None,
              help="Only this distribution, when the feature is read from several (default: each of them).")
@click.option("--from", "first", metavar="V", default=None, help="First release to consider (included).")
@click.option("--to", "last", metavar="V", default=None, help="Last release to consider (included).")
@click.option("--all", "exhaustive", is_flag=True,
              help="Read every release and report every change (a history that is not monotone).")
@click.option("--pre", "include_pre", is_flag=True, help="Include pre-releases.")
@click.option("--yanked", "include_yanked", is_flag=True, help="Include yanked files.")
@click.option("--cuda", metavar="VER", default=None,
              help="CUDA toolkit of the stack (with nvcc), for facts that depend on it (flashinfer-jit).")
@click.option("--python", "python", metavar="VER", default=None,
              help="Python of the stack, for metadata:requires-python.")
@click.option("--torch-cuda", "torch_cuda", metavar="VER", default=None,
              help="CUDA of the stack's torch wheel (13.0), for metadata:torch-pin.")
@click.option("--kernel-package", "kernel_package", type=click.Choice(["sgl-kernel", "sglang-kernel"]),
              default=None, help="The stack's SGLang kernel package, for metadata:kernel-package.")
@click.option("--through-pins", "through_pins", is_flag=True,
              help="With --package sglang and --cuda: judge each SGLang release with its own pins of torch, FlashInfer "
                   "and the kernel (rules and the pinned releases' readers), per flavour; the release where FEATURE "
                   "changes, and the newest whose pins keep it admitted.")
@click.option("--flavour", "flavours", type=click.Choice(["devel", "wheels", "runtime"]), multiple=True,
              help="With --through-pins: only this flavour (repeatable; default devel and wheels).")
@click.option("--json", "as_json", is_flag=True, help="Print the search as JSON.")
@click.option("--results", "results_root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also record every release read as a wheel-tier result in a new run under this folder "
                   "(the matrix, deadends and pick then use them).")
@index_options
def command(feature: str, target_name: str | None, package: str | None, first: str | None, last: str | None,
            exhaustive: bool, include_pre: bool, include_yanked: bool, cuda: str | None, python: str | None,
            torch_cuda: str | None, kernel_package: str | None, through_pins: bool, flavours: tuple[str, ...],
            as_json: bool, results_root: Path | None, index_url: str | None, extra_index_urls: tuple[str, ...],
            find_links: Path | None) -> None:
    """Find the release of a distribution where FEATURE's verdict on a target changes, reading each
    release's wheel (downloaded with no dependencies into the wheel cache, never installed).

    \b
    Binary search by default (it assumes one change); --all reads every release. Pre-releases and
    yanked files are left out unless --pre / --yanked. Wheels are cached under
    ~/.cache/stackforge/wheels (env STACKFORGE_WHEEL_CACHE).

    \b
    Example:
      stackforge bisect flashinfer-ar-fusion --target rtx-pro-6000-x8-pcie
      stackforge bisect torch-symm-mem --target rtx-pro-6000-x8-pcie --package sglang --all
      stackforge bisect flashinfer-ar-fusion --target rtx-pro-6000-x8-pcie --results results
                                  # then `stackforge deadends` names the release that unblocks it
      stackforge bisect flashinfer-jit --package sglang --through-pins --cuda 12.8 --target rtx-pro-6000-x8-pcie
                                  # the newest SGLang whose own pins keep FlashInfer JIT admitted there
    """
    import sys

    from stackforge.results.store import ResultsFolder
    from stackforge.wheels.bisect_campaign import (
        BisectRequest,
        IndexRequest,
        ReleaseRange,
        run_bisect_campaign,
    )

    if through_pins and results_root is not None:
        raise click.UsageError("--results records wheel readings of one distribution; --through-pins judges "
                               "whole stacks (leave one of them out)")
    request = BisectRequest(feature, target_name or "", package=package,
                            span=ReleaseRange(first, last, include_pre=include_pre, include_yanked=include_yanked),
                            exhaustive=exhaustive, cuda=cuda, python=python, torch_cuda=torch_cuda,
                            kernel_package=kernel_package,
                            index=IndexRequest(index_url, tuple(extra_index_urls), find_links),
                            through_pins=through_pins, flavours=tuple(flavours))
    store = ResultsFolder(results_root, command=tuple(sys.argv)) if results_root is not None else None
    outcome = run_bisect_campaign(request, user=user_compat(), store=store, on_read=_echo_read)
    if outcome.run_dir is not None:
        click.echo(f"recorded {outcome.recorded} wheel-tier result(s) -> {outcome.run_dir}", err=True)
    click.echo(report_json_text(outcome.to_json()) if as_json else outcome.text(), nl=not as_json)


def _echo_read(dist: str, point) -> None:
    click.echo(f"  read {dist} {point.version}: {point.verdict_text}", err=True)
