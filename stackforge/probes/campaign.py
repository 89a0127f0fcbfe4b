"""A probe campaign: every (stack, target, probe) job of a plan, run with bounded parallelism.

Continue-on-error: one probe's failure, hang or crash never stops the others. Records are written
one by one as they finish (atomically), so Ctrl-C (or SIGTERM / SIGHUP) keeps everything that
completed; every container of the run carries the run label and is removed, also then. The probes
the interruption cut short are not recorded: their ending was not the software's answer. An engine
that goes away ends the run the same way, with its error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge.core.errors import SpecError
from stackforge.core.records import PlannedJob, ResultRecord, RunStore, Tier
from stackforge.edges.gpus import HostGpus
from stackforge.edges.index import IndexRequest
from stackforge.jobs import job_runner
from stackforge.jobs.campaign import CampaignStarted, CellJob, campaign_run, plan_jobs
from stackforge.jobs.job_runner import ImageRef
from stackforge.plan.planner import Plan
from stackforge.plan.selection import StackSelection
from stackforge.probes.execute import SCRIPTS_DIR, plan_probe_job, probe_kind
from stackforge.probes.image_facts import ImageName, ImageStack
from stackforge.probes.local_env import LocalStack, pin_differences, read_local_stack

__all__ = ["TIERS", "IndexRequest", "ProbeRequest", "run_probe_campaign", "run_probe_jobs", "select_specs"]

TIERS = ("gate", "runtime", "all")


def select_specs(specs: Sequence[Any], *, tier: str, features: Sequence[str] = ()) -> tuple[Any, ...]:
    """Probes of a tier (gate / runtime / all), optionally only those speaking for some features."""
    if tier not in TIERS:
        raise SpecError(f"unknown tier {tier!r}; valid: {', '.join(TIERS)}")
    known = sorted({s.feature for s in specs} | {s.id for s in specs})
    unknown = [f for f in features if f not in known]
    if unknown:
        raise SpecError(f"unknown feature or probe id(s): {', '.join(unknown)}; known: {', '.join(known)}")
    return tuple(s for s in specs if (tier == "all" or s.tier == tier)
                 and (not features or s.feature in features or s.id in features))


def run_probe_jobs(jobs: Sequence[CellJob], *, run_id: str, host_gpus: HostGpus, write: Callable[[ResultRecord], Any],
                   client: Any | None = None, local_python: str | None = None, parallel: int = 2,
                   timeout_s: float | None = None, log_dir: Path | None = None, builds_dir: Path | None = None,
                   images: dict[str, ImageRef] | None = None, scripts_dir: Path | None = None,
                   on_done: Callable[[ResultRecord], None] = lambda record: None,
                   host_check: job_runner.HostGate = job_runner.NO_HOST_CHECK) -> list[ResultRecord]:
    """Schedule the probe jobs (preconditions the host and target cannot meet become skips) and run
    them ``parallel`` at a time through :func:`stackforge.jobs.job_runner.run_jobs`, writing each record."""
    scheduled = [plan_probe_job(job.stack, job.spec, job.target, host_gpus, timeout_s) for job in jobs]
    return job_runner.run_jobs(probe_kind(scripts_dir or SCRIPTS_DIR), scheduled, run_id=run_id,
                               host_gpus=host_gpus, write=write, client=client, local_python=local_python,
                               parallel=parallel, log_dir=log_dir, builds_dir=builds_dir, images=images,
                               on_done=on_done, host_check=host_check)


# ------------------------------------------------------------------------------------- the campaign


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """One ``stackforge probe`` run: which stacks, which probes, and where they run.

    ``local_python`` set: probes run in that interpreter's environment, not in images, and are recorded under
    that environment's own identity (:class:`~stackforge.probes.local_env.LocalStack`), once per target of the
    selection. ``tier`` ``wheel`` reads the pinned releases' wheels from ``index`` instead (no image, no GPU).
    """

    selection: StackSelection
    tier: str = "gate"
    features: tuple[str, ...] = ()
    timeout_s: float | None = None
    local_python: str | None = None
    parallel: int = 2
    builds_dir: Path | None = None
    index: IndexRequest = IndexRequest()
    #: ``--image`` / ``--images-file``: images from elsewhere, probed as the stacks they are (not the matrix's)
    images: tuple[ImageName, ...] = ()


def run_probe_campaign(request: ProbeRequest, *, store: RunStore, connect: Callable[[], Any],
                       on_start: Callable[[CampaignStarted], None] = lambda started: None,
                       on_done: Callable[[ResultRecord], None] = lambda record: None) -> list[ResultRecord]:
    """Plan the request's probe jobs, run them into one run folder of ``store``; the records written.

    ``connect`` gives the Docker client, asked for only when probes run in images and after the
    plan stands (a bad matrix is reported as such, also without an engine). The run's planned jobs are written
    before the first one starts, so a run cut short says what it did not reach.

    Raises:
        SpecError: with ``local_python`` and ``--only``, the environment is not the stack named (what differs).
    """
    if request.images:
        return _run_image_campaign(request, store=store, connect=connect, on_start=on_start, on_done=on_done)
    if request.tier == "wheel":
        return _run_wheel_campaign(request, store=store, on_start=on_start, on_done=on_done)
    from stackforge.edges.gpus import detect_host_gpus, host_facts
    from stackforge.probes.catalog import catalog

    selection = request.selection
    plan = selection.plan()
    stacks = selection.stacks(plan)
    specs = select_specs(catalog(), tier=request.tier, features=request.features)
    if request.local_python:
        local = read_local_stack(request.local_python)
        refuse_other_stack(local, plan, stacks if selection.only else ())
        jobs, stack_count = local_jobs(plan, specs, stacks, local), 1
    else:
        jobs, stack_count = plan_jobs(plan, specs, stacks), len(stacks)
    client = None if request.local_python else connect()
    host_gpus = detect_host_gpus(client)
    # The host check is read before the run opens and written with it: a partial run carries it too.
    floors = job_runner.driver_floors(plan.cells)
    if request.local_python and selection.only:
        # The environment is the named stack (refuse_other_stack checked its pins): that stack's floor is its.
        floors = {(local.id, target): floor for (stack_id, target), floor in floors.items()
                  if stack_id in {s.id for s in stacks}}
    host_check = job_runner.check_host(host_gpus, jobs, floors)
    with campaign_run(store, matrix_source=str(selection.matrix_path), shard=selection.shard_text,
                      stacks=stack_count, jobs=len(jobs), host={**host_facts(host_gpus), **host_check.to_json()},
                      planned=planned_jobs(jobs),
                      on_start=on_start) as (run_dir, write):
        return run_probe_jobs(jobs, run_id=run_dir.name, host_gpus=host_gpus, write=write, client=client,
                              local_python=request.local_python, parallel=request.parallel,
                              timeout_s=request.timeout_s, log_dir=run_dir / "logs", builds_dir=request.builds_dir,
                              on_done=on_done, host_check=host_check)


def local_jobs(plan: Plan, specs: Sequence[Any], stacks: Sequence[Any], local: LocalStack) -> tuple[CellJob, ...]:
    """One job per target of the selected stacks' kept cells and spec, all for the environment itself: the
    matrix's stacks only say which targets to judge it for, never under whose id it is recorded."""
    targets = {job.target.name: job.target for job in plan_jobs(plan, specs[:1], stacks)}
    # The environment stands where a Stack stands: a job needs only its ``id`` and ``to_json()``.
    return tuple(CellJob(local, target, spec) for target in targets.values() for spec in specs)


def refuse_other_stack(local: LocalStack, plan: Plan, named: Sequence[Any]) -> None:
    """``--local --only STACK``: refuse unless the environment is each named stack (its pins, read there).

    Raises:
        SpecError: naming every difference, and the environment's own identity.
    """
    for stack in named:
        differences = pin_differences(local, stack, plan.cells_for(stack)[0].derived)
        if differences:
            raise SpecError(f"--local --only {stack.id}: this environment is not that stack: {'; '.join(differences)}",
                            remedy=f"install the stack's pins there, or drop --only: the environment's probes are "
                                   f"recorded under its own identity ({local.id})")


def planned_jobs(jobs: Sequence[CellJob]) -> tuple[PlannedJob, ...]:
    """The jobs as the run's manifest lists them (the keys their records would have)."""
    return tuple(PlannedJob(stack_id=job.stack.id, stack=job.stack.to_json(), target=job.target.name,
                            probe=job.spec.id, feature=job.spec.feature, tier=Tier(job.spec.tier)) for job in jobs)


def _run_image_campaign(request: ProbeRequest, *, store: RunStore, connect: Callable[[], Any],
                        on_start: Callable[[CampaignStarted], None],
                        on_done: Callable[[ResultRecord], None]) -> list[ResultRecord]:
    """``--image``: each image found (or pulled), read once, probed as its own stack for the selection's targets
    (an image its facts say the probes cannot run in: every probe a skip saying why); then, unless the tier is
    the image's only, the wheel tier for the releases it holds. Two references of one image are probed once."""
    import dataclasses

    from stackforge.edges.gpus import detect_host_gpus
    from stackforge.probes.catalog import catalog
    from stackforge.probes.image_facts import engine_platform, find_image, read_image_facts

    selection = request.selection
    plan = selection.plan()
    targets = {job.target.name: job.target for job in plan_jobs(plan, catalog()[:1], selection.stacks(plan))}
    select_specs(catalog(), tier=request.tier if request.tier != "wheel" else "all",
                 features=request.features if request.tier != "wheel" else ())   # a typo refused before any pull
    client = connect()
    native = engine_platform(client)
    found: dict[str, Any] = {}
    for name in request.images:            # found (pulled) before anything is recorded: a bad one ends here
        image = find_image(client, name)
        known = found.get(image.image_id)
        found[image.image_id] = (dataclasses.replace(known, refs=tuple(dict.fromkeys((*known.refs, name.text))))
                                 if known else image)
    stacks = [ImageStack(image, read_image_facts(client, image, native=native)) for image in found.values()]
    records: list[ResultRecord] = []
    if request.tier != "wheel":
        records += _probe_images(request, stacks, targets, store=store, client=client, on_start=on_start,
                                 on_done=on_done, host_gpus=detect_host_gpus(client))
    cells = [ImageCell(stack, target) for stack in stacks if stack.facts.python for target in targets.values()]
    if cells:
        records += _read_image_wheels(request, cells, store=store, on_start=on_start, on_done=on_done)
    return records


def image_driver_floors(stacks: Sequence[ImageStack], targets: Iterable[Any]) -> dict[tuple[str, str], str | None]:
    """(image stack id, target) -> the driver floor the rules give each image, judged from what it was read to
    have (:mod:`stackforge.plan.external`); an image the rules cannot judge has none."""
    from stackforge.plan.external import external_plan_cells
    from stackforge.plan.planner import load_knowledge

    made = external_plan_cells({stack.id: stack.to_json() for stack in stacks}, tuple(targets), load_knowledge())
    return job_runner.driver_floors(made.cells)


def _probe_images(request: ProbeRequest, stacks: Sequence[ImageStack], targets: dict[str, Any], *, store: RunStore,
                  client: Any, on_start: Callable[[CampaignStarted], None], on_done: Callable[[ResultRecord], None],
                  host_gpus: HostGpus) -> list[ResultRecord]:
    """The image tiers' probes of ``stacks`` for ``targets``, in one run (its host check like any probe run's)."""
    import dataclasses

    from stackforge.edges.gpus import host_facts
    from stackforge.probes.catalog import catalog

    specs = select_specs(catalog(), tier=request.tier, features=request.features)
    jobs = tuple(CellJob(stack, target, spec) for stack in stacks for target in targets.values()
                 for spec in specs)
    scheduled = []
    for job in jobs:
        planned = plan_probe_job(job.stack, job.spec, job.target, host_gpus, request.timeout_s)
        why_not = job.stack.why_not
        scheduled.append(dataclasses.replace(planned, skip_reason=why_not, skip_evidence=json.dumps(
            job.stack.facts.to_json(), sort_keys=True)) if why_not else planned)
    images = {stack.id: ImageRef(ref=stack.image.subject, image_id=stack.image.image_id,
                                 digest=stack.image.repo_digest) for stack in stacks}
    host_check = job_runner.check_host(host_gpus, jobs, image_driver_floors(stacks, targets.values()))
    with campaign_run(store, matrix_source=str(selection_source(request)), shard=None, stacks=len(stacks),
                      jobs=len(jobs), host={**host_facts(host_gpus), **host_check.to_json()},
                      planned=planned_jobs(jobs), on_start=on_start) as (run_dir, write):
        return job_runner.run_jobs(probe_kind(SCRIPTS_DIR), scheduled, run_id=run_dir.name, host_gpus=host_gpus,
                                   write=write, client=client, parallel=request.parallel, log_dir=run_dir / "logs",
                                   images=images, on_done=on_done, host_check=host_check)


def selection_source(request: ProbeRequest) -> Path:
    return request.selection.matrix_path


@dataclass(frozen=True, slots=True)
class ImageCell:
    """An image's stack on one target, where the wheel tier's planner reads a plan cell (``stack``, ``derived``,
    ``target``): the releases the image holds, read in the context its facts give."""

    stack: ImageStack
    target: Any

    @property
    def derived(self) -> Any:
        from types import SimpleNamespace
        return SimpleNamespace(**self.stack.derived())


def _read_image_wheels(request: ProbeRequest, cells: Sequence[ImageCell], *, store: RunStore,
                       on_start: Callable[[CampaignStarted], None],
                       on_done: Callable[[ResultRecord], None]) -> list[ResultRecord]:
    """The wheel tier for the releases the images hold: a run of its own, as ``--tier wheel`` records it."""
    import socket

    from stackforge.edges.index import configured_indexes
    from stackforge.wheels.cache import WheelCache
    from stackforge.wheels.tier import list_releases, load_readers, plan_wheel_jobs, run_wheel_jobs, select_readers

    readers = select_readers(load_readers(), request.features if request.tier == "wheel" else ())
    jobs = plan_wheel_jobs(cells, readers)
    if not jobs:
        return []
    indexes = configured_indexes(request.index)
    cache = WheelCache.open(indexes)
    listed = list_releases(jobs, indexes=indexes, cache=cache)
    with campaign_run(store, matrix_source=str(selection_source(request)), shard=None,
                      stacks=len({c.stack.id for c in cells}), jobs=len(jobs), indexes=indexes.describe(),
                      on_start=on_start) as (run_dir, write):
        return run_wheel_jobs(jobs, listed=listed, indexes=indexes, cache=cache, run_id=run_dir.name,
                              host=socket.gethostname(), write=write, on_done=on_done)


def _run_wheel_campaign(request: ProbeRequest, *, store: RunStore, on_start: Callable[[CampaignStarted], None],
                        on_done: Callable[[ResultRecord], None]) -> list[ResultRecord]:
    """The wheel tier: one record per (release x fact x target), read from the index's wheels."""
    import socket

    from stackforge.edges.index import configured_indexes
    from stackforge.wheels.cache import WheelCache
    from stackforge.wheels.tier import (
        list_releases,
        load_readers,
        plan_wheel_jobs,
        run_wheel_jobs,
        select_readers,
    )

    readers = select_readers(load_readers(), request.features)
    selection = request.selection
    plan = selection.plan()
    wanted = {stack.id for stack in selection.stacks(plan)}
    jobs = plan_wheel_jobs([c for c in plan.cells if not c.pruned and c.stack.id in wanted], readers)
    indexes = configured_indexes(request.index)
    cache = WheelCache.open(indexes)
    listed = list_releases(jobs, indexes=indexes, cache=cache)   # an index that does not answer: no run
    with campaign_run(store, matrix_source=str(selection.matrix_path), shard=selection.shard_text,
                      stacks=len(wanted), jobs=len(jobs), indexes=indexes.describe(),
                      on_start=on_start) as (run_dir, write):
        return run_wheel_jobs(jobs, listed=listed, indexes=indexes, cache=cache, run_id=run_dir.name,
                              host=socket.gethostname(), write=write, on_done=on_done)
