"""``stackforge bisect``: the release where a feature's verdict changes, read from the wheels on the index."""

from __future__ import annotations

import json
from pathlib import Path

import click

from stackforge.cli._compat import user_compat
from stackforge.cli.options import index_options


@click.command(name="bisect")
@click.argument("feature", metavar="FEATURE")
@click.option("--target", "target_name", required=True, metavar="NAME", help="Target profile (see `stackforge list targets`).")
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
@click.option("--json", "as_json", is_flag=True, help="Print the search as JSON.")
@click.option("--results", "results_root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also record every release read as a wheel-tier result in a new run under this folder "
                   "(the matrix, deadends and pick then use them).")
@index_options
def command(feature: str, target_name: str, package: str | None, first: str | None, last: str | None,
            exhaustive: bool, include_pre: bool, include_yanked: bool, cuda: str | None, python: str | None,
            torch_cuda: str | None, kernel_package: str | None, as_json: bool, results_root: Path | None, index_url: str | None, extra_index_urls: tuple[str, ...],
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
    """
    from dataclasses import replace

    from stackforge.core.errors import SpecError
    from stackforge.edges.index import configured_indexes
    from stackforge.plan.planner import load_knowledge
    from stackforge.wheels.bisect import render_search, search_json
    from stackforge.wheels.cache import WheelCache
    from stackforge.wheels.tier import load_readers, resolve_specs, run_bisect, target_context, target_named

    specs = resolve_specs(load_readers(), feature, package)
    if len(specs) > 1 and (first or last):
        raise SpecError(f"--from/--to take versions of one distribution, and {feature} is read from several: "
                        f"{', '.join(spec.dist for spec in specs)}", remedy="add --package DIST")
    target = target_named(load_knowledge(user=user_compat()).targets, target_name)
    ctx = target_context(target)
    if cuda:
        ctx = replace(ctx, cuda=cuda, nvcc=True)
    ctx = replace(ctx, python=python or None, torch_cuda=torch_cuda or None, kernel_package=kernel_package)
    indexes = configured_indexes(index_url=index_url, extra_index_urls=extra_index_urls, find_links=find_links)
    cache = WheelCache.open(indexes)
    context = ", ".join([target.sm, f"{target.gpu_count}x {target.interconnect.value}",
                         *(f"{name} {value}" for name, value in (("CUDA", cuda), ("Python", python),
                                                                  ("torch CUDA", torch_cuda),
                                                                  ("kernel package", kernel_package)) if value)])
    searches, texts, missing, measured = [], [], [], []
    for spec in specs:
        try:
            search = run_bisect(spec, ctx, indexes=indexes, cache=cache, first=first, last=last,
                                exhaustive=exhaustive, include_pre=include_pre, include_yanked=include_yanked,
                                on_read=lambda point, dist=spec.dist: click.echo(
                                    f"  read {dist} {point.version}: {point.verdict_text}", err=True))
        except SpecError as exc:
            if len(specs) == 1:
                raise
            missing.append(exc.one_line())   # one distribution of several is not on the indexes
            continue
        searches.append(search_json(search, dist=spec.dist))
        measured += [point.result for point in search.points]
        texts.append(render_search(search, fact=spec.fact, dist=spec.dist, target=target.name, context=context))
    if not searches:
        raise SpecError("; ".join(missing))
    if results_root is not None:
        _record(results_root, measured, target.name, ctx)
    if as_json:
        click.echo(json.dumps({"feature": feature, "target": target.name, "context": _ctx_json(ctx),
                               "searches": searches, "not_searched": missing}, indent=2))
    else:
        click.echo("\n\n".join([*texts, *(f"not searched: {line}" for line in missing)]))


def _record(results_root: Path, measured: list, target: str, ctx) -> None:
    """Every release read, as wheel-tier records of one new run (stderr names it)."""
    import socket
    import sys

    from stackforge.results.store import finish_run, start_run, write_record
    from stackforge.wheels.tier import wheel_record

    run_dir = start_run(results_root, command=sys.argv)
    for measurement in measured:
        write_record(run_dir, wheel_record(measurement, target=target, ctx=ctx, run_id=run_dir.name,
                                           host=socket.gethostname()))
    finish_run(run_dir)
    click.echo(f"recorded {len(measured)} wheel-tier result(s) -> {run_dir}", err=True)


def _ctx_json(ctx) -> dict:
    """The read context without the fields nobody set."""
    from dataclasses import asdict
    return {k: v for k, v in asdict(ctx).items() if v is not None}
