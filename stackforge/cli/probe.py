"""``stackforge probe``: capability probes inside each built image (or locally with ``--local``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from stackforge.cli._runs import connect_engine, status_counts_line
from stackforge.cli.options import (
    index_options,
    positive_seconds,
    refuse_together,
    refuse_unused,
    selection,
    shard_option,
    stack_selection,
)
from stackforge.core.errors import ProbeError
from stackforge.core.records import ResultRecord, Status, Tier

if TYPE_CHECKING:
    from stackforge.jobs.campaign import CampaignStarted


@click.command(name="probe")
@stack_selection
@shard_option
@click.option("--tier", type=click.Choice(["gate", "runtime", "all", "wheel"]), default="gate", show_default=True,
              help="gate: decidable without a GPU; runtime: needs GPUs of the target arch; all: both. "
                   "wheel: read the pinned releases' wheels from the index (no image, no GPU).")
@click.option("--feature", "features", multiple=True, metavar="FEATURE",
              help="Only probes speaking for this feature (or this probe id); repeatable.")
@click.option("--timeout", "timeout_s", type=float, default=None, callback=positive_seconds,
              help="Hard timeout per probe (seconds, more than 0).")
@click.option("--local", "local", is_flag=True,
              help="Run in a Python environment of this machine, not in images: recorded under the stack that "
                   "environment is (local-..., from the versions read there), once per target; with --only STACK, "
                   "refused unless the environment has that stack's pins.")
@click.option("--python", "python", default=None, metavar="PATH",
              help="With --local: the interpreter whose packages are probed (default: this one).")
@click.option("-j", "--jobs", "parallel", type=click.IntRange(min=1), default=2, show_default=True,
              help="Probes run in parallel.")
@click.option("--builds", "builds_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A `stackforge build --out` folder: probe the images its build records name, pulled by "
                   "digest when not local (the registry hand-off). Default: local images by stack-id label.")
@click.option("--results", "results_root", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Results folder; each run writes one sub-folder.")
@click.option("--image", "image_refs", multiple=True, metavar="REF",
              help="Probe an image stackforge did not build (REPO[:TAG][@sha256:...]; pulled by digest when not "
                   "local), as the stack its facts make it (image-<name>-<id12>, external), for the matrix's "
                   "targets; then the wheel tier for the releases it holds. Repeatable.")
@click.option("--images-file", "images_files", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE", help="Like --image, one reference a line (# comments).")
@index_options
def command(matrix, cuda, targets, only, shard, tier, features, timeout_s, local, python, parallel,
            builds_dir, results_root, image_refs, images_files, index_url, extra_index_urls, find_links) -> None:
    """Run capability probes for every kept stack x target of a matrix and record the evidence.

    \b
    --tier wheel reads each pinned FlashInfer / SGLang / kernel release's wheel from the index
    (pip's configuration, or --index-url/--find-links), into the wheel cache, never installed:
    one record per (release x fact x target), tier wheel, with the code lines as evidence.
    """
    from stackforge.plan.features import load_feature_catalog
    from stackforge.probes.campaign import IndexRequest, ProbeRequest, run_probe_campaign
    from stackforge.results.store import ResultsFolder

    from stackforge.probes.image_facts import read_image_refs

    images = read_image_refs(image_refs, images_files) if image_refs or images_files else ()
    for option, given in (("--local", local), ("--builds", builds_dir is not None), ("--only", bool(only)),
                          ("--shard", shard is not None)):
        refuse_together("--image/--images-file", option, bool(images) and given,
                        why="an image from elsewhere is probed as its own stack, not a matrix stack's image")
    index_given = bool(index_url or extra_index_urls or find_links)
    refuse_unused("--index-url/--extra-index-url/--find-links", index_given, needs="--tier wheel or --image",
                  present=tier == "wheel" or bool(images))
    if tier == "wheel" and not images:
        for option, given in (("--local", local), ("--builds", builds_dir is not None),
                              ("--python", python is not None), ("--timeout", timeout_s is not None)):
            refuse_together("--tier wheel", option, given, why="the wheel tier reads wheels from the index, "
                                                               "not images or a Python environment")
    else:
        refuse_unused("--python", python is not None, needs="--local", present=local)
        refuse_together("--local", "--builds", local and builds_dir is not None,
                        why="--local probes this machine's Python, not the images of a build folder")
    request = ProbeRequest(selection(matrix, cuda, targets, only, shard), tier=tier, features=tuple(features),
                           timeout_s=timeout_s, local_python=(python or sys.executable) if local else None,
                           parallel=parallel, builds_dir=builds_dir,
                           index=IndexRequest(index_url, tuple(extra_index_urls), find_links), images=images)
    word = load_feature_catalog().calibrated_status
    records = run_probe_campaign(request, store=ResultsFolder(results_root, command=tuple(sys.argv)),
                                 connect=connect_engine, on_start=_echo_start, on_done=lambda r: _echo(r, word(r)))
    click.echo(status_counts_line(records, word))
    refuse_errored(records)


def refuse_errored(records: list[ResultRecord]) -> None:
    """A run in which a probe errored (the probe itself broke, or a stack's image is missing) failed: exit 1, so
    a nightly never goes green on probes that measured nothing. A ``skip`` (a GPU probe on a CPU host, a stack
    not built here) and a ``fail`` (a measured answer) are not errors.

    Raises:
        ProbeError: naming how many errored and the first of them.
    """
    errored = [r for r in records if r.outcome.status is Status.ERROR]
    if not errored:
        return
    first = errored[0]
    remedy = ("a release the index does not serve: --index-url / --find-links" if first.tier is Tier.WHEEL else
              # --image refuses --builds, and stackforge builds no image from elsewhere: its log says why
              "an image from elsewhere (--image): the probe's log in the run's logs/ folder"
              if first.stack.get("external") else
              "a missing image: `stackforge build` it, or pass --builds OUT (stacks its build records say were not "
              "built there are skipped)")
    raise ProbeError(f"{len(errored)} of {len(records)} probe(s) errored, measuring nothing (first: "
                     f"{first.stack_id} {first.target} {first.probe}: {first.outcome.reason[:200]})",
                     remedy=f"each error record says why; {remedy}")


def _echo_start(started: CampaignStarted) -> None:
    if started.indexes is not None:
        click.echo(f"reading wheels for {started.stacks} stack(s), {started.jobs} reading(s) -> {started.run_dir} "
                   f"({started.indexes})")
    else:
        click.echo(f"probing {started.stacks} stack(s), {started.jobs} probe run(s) -> {started.run_dir}")


def _echo(record: ResultRecord, status: str) -> None:
    """One line per record, its status in the reports' words (``admitted`` / ``built``, never a bare ``pass``
    for a tier that cannot decide the feature)."""
    click.echo(f"  {status:<8} {record.stack_id}  {record.target}  {record.probe}: {record.outcome.reason}")
