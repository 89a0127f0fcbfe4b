"""A probe campaign: every (stack, target, probe) job of a plan, run with bounded parallelism.

Continue-on-error: one probe's failure, hang or crash never stops the others. Records are written
one by one as they finish (atomically), so Ctrl-C (or SIGTERM / SIGHUP) keeps everything that
completed; every container of the run carries the run label and is removed, also then. The probes
the interruption cut short are not recorded: their ending was not the software's answer. An engine
that goes away ends the run the same way, with its error.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stackforge.errors import Interrupted, ProbeError, SpecError
from stackforge.model import Stack, Target
from stackforge.plan import Plan
from stackforge.probes.execute import (
    HostGpus,
    ImageRef,
    ProbeContext,
    make_record,
    provenance_from_facts,
    run_in_container,
    run_locally,
)
from stackforge.records import Outcome, ResultRecord, Status
from stackforge.selection import StackSelection

STACK_ID_LABEL = "io.stackforge.stack.id"
TIERS = ("gate", "runtime", "all")


@dataclass(frozen=True, slots=True)
class ProbeJob:
    stack: Stack
    target: Target
    spec: Any   # stackforge.probes.catalog.ProbeSpec


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


def plan_jobs(plan: Plan, specs: Sequence[Any], stacks: Sequence[Stack] | None = None) -> tuple[ProbeJob, ...]:
    """One job per kept (stack, target) cell and probe (pruned cells are not probed: rules said why)."""
    wanted = None if stacks is None else {s.id for s in stacks}
    return tuple(ProbeJob(c.stack, c.target, spec) for c in plan.cells
                 if not c.pruned and (wanted is None or c.stack.id in wanted) for spec in specs)


def find_stack_image(client: Any, stack: Stack) -> ImageRef | None:
    """The newest local image built for ``stack`` (found by its stack-id label)."""
    images = client.images.list(filters={"label": f"{STACK_ID_LABEL}={stack.id}"})
    if not images:
        return None
    newest = max(images, key=lambda image: image.attrs.get("Created", ""))
    tags = newest.tags or [newest.id]
    digests = newest.attrs.get("RepoDigests") or []
    return ImageRef(ref=tags[0], image_id=newest.id, digest=digests[0] if digests else None)


def image_from_build_record(client: Any, builds_dir: Path, stack: Stack) -> ImageRef | None:
    """The image a build record names: the local image if it is here, else pulled by its digest.

    This is the registry hand-off: images built (and pushed) on one machine are probed on another
    by digest, never by a tag that may have moved since.
    """
    from stackforge.build.records import read_record
    from stackforge.registry import pull

    record = read_record(builds_dir, stack.id)
    if record is None or not record.status.ok:
        return None
    for candidate in (record.image_id, record.repo_digest):
        local_id = _local_image(client, candidate) if candidate else None
        if local_id is not None:
            return ImageRef(ref=record.repo_digest or record.image_tag or candidate, image_id=local_id,
                            digest=record.repo_digest)
    if record.repo_digest:
        pulled = pull(record.repo_digest)
        return ImageRef(ref=pulled.ref, image_id=pulled.image_id, digest=record.repo_digest)
    return None


def _local_image(client: Any, ref: str) -> str | None:
    import docker.errors
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


def stack_image(client: Any, stack: Stack, builds_dir: Path | None = None) -> ImageRef | None:
    """The image to run ``stack``'s probes or benchmarks in: from a build record, else by label."""
    return image_from_build_record(client, builds_dir, stack) if builds_dir else find_stack_image(client, stack)


def missing_image_record(job: ProbeJob, ctx: ProbeContext) -> ResultRecord:
    """A stack without an image cannot be probed: an honest error record, not a silent gap."""
    outcome = Outcome(Status.ERROR, f"no image built for stack {job.stack.id}",
                      evidence=f"no local image carries the label {STACK_ID_LABEL}={job.stack.id}")
    return make_record(job.stack, job.spec, ctx, outcome, provenance_from_facts({}, None, ctx.host_gpus, "docker"))


def run_jobs(jobs: Sequence[ProbeJob], *, run_id: str, host_gpus: HostGpus, write: Callable[[ResultRecord], Any],
             client: Any | None = None, local_python: str | None = None, parallel: int = 2,
             timeout_s: float | None = None, log_dir: Path | None = None, builds_dir: Path | None = None,
             images: dict[str, ImageRef] | None = None, scripts_dir: Path | None = None,
             on_done: Callable[[ResultRecord], None] = lambda record: None) -> list[ResultRecord]:
    """Run jobs (in containers via ``client``, or locally with ``local_python``), writing each record.

    ``images`` maps stack ids to images to use; other stacks' images come from ``builds_dir`` records
    or, by default, from the local images' stack-id labels.

    When the calling thread is interrupted (KeyboardInterrupt, which SIGTERM / SIGHUP become too) or a
    probe raises (the engine went away), the running probes are stopped, the run's containers removed,
    and the exception re-raised; probes stopped that way write no record.
    """
    if client is None and local_python is None:
        raise ProbeError("probes need a Docker client or --local")
    images = dict(images or {})
    if client is not None:
        for job in jobs:
            if job.stack.id not in images:
                images[job.stack.id] = stack_image(client, job.stack, builds_dir)

    # Worker threads never see a signal: the calling thread sets this flag for them.
    cancel = threading.Event()

    def one(job: ProbeJob) -> ResultRecord | None:
        ctx = ProbeContext(run_id=run_id, target=job.target, host_gpus=host_gpus, timeout_s=timeout_s,
                           **({"scripts_dir": scripts_dir} if scripts_dir else {}))
        log = log_dir / f"{job.stack.id}--{job.target.name}--{job.spec.id}.log" if log_dir else None
        try:
            if client is None:
                record = run_locally(job.stack, job.spec, ctx, python=local_python or "python3", log_path=log,
                                     cancel=cancel)
            elif images[job.stack.id] is None:
                record = missing_image_record(job, ctx)
            else:
                record = run_in_container(client, images[job.stack.id], job.stack, job.spec, ctx, log_path=log,
                                          cancel=cancel)
        except Interrupted:
            return None
        if cancel.is_set():
            return None   # ended while the run was being interrupted: its ending may be the cleanup's doing
        write(record)
        on_done(record)
        return record

    records: list[ResultRecord] = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel))
    try:
        futures = [pool.submit(one, job) for job in jobs]
        for future in concurrent.futures.as_completed(futures):
            record = future.result()
            if record is not None:
                records.append(record)
    except BaseException:
        # Flag first, then remove the containers: a worker released by the removal sees the flag and
        # writes nothing, instead of recording the SIGKILL of the removal as a crash.
        cancel.set()
        pool.shutdown(wait=False, cancel_futures=True)
        if client is not None:
            from stackforge.docker_engine import remove_run_containers
            remove_run_containers(client, run_id)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return records


# ------------------------------------------------------------------------------------- the campaign


class RunStore(Protocol):
    """Where a campaign records (:class:`stackforge.results.ResultsFolder`): a run folder, its records."""

    def start(self, *, matrix_source: str, shard: str | None) -> Path: ...

    def write(self, run_dir: Path, record: ResultRecord) -> Any: ...

    def finish(self, run_dir: Path) -> Any: ...


@dataclass(frozen=True, slots=True)
class IndexRequest:
    """Where the wheel tier asks for wheels: command-line values; pip's configuration fills the rest."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: Path | None = None


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """One ``stackforge probe`` run: which stacks, which probes, and where they run.

    ``local_python`` set: probes run in that interpreter's environment, not in images. ``tier``
    ``wheel`` reads the pinned releases' wheels from ``index`` instead (no image, no GPU).
    """

    selection: StackSelection
    tier: str = "gate"
    features: tuple[str, ...] = ()
    timeout_s: float | None = None
    local_python: str | None = None
    parallel: int = 2
    builds_dir: Path | None = None
    index: IndexRequest = IndexRequest()


@dataclass(frozen=True, slots=True)
class CampaignStarted:
    """What a campaign is about to run, told before its first record."""

    stacks: int
    jobs: int
    run_dir: Path
    #: the wheel tier's index locations, as words; None for probes that run
    indexes: str | None = None


def run_probe_campaign(request: ProbeRequest, *, store: RunStore, connect: Callable[[], Any],
                       on_start: Callable[[CampaignStarted], None] = lambda started: None,
                       on_done: Callable[[ResultRecord], None] = lambda record: None) -> list[ResultRecord]:
    """Plan the request's probe jobs, run them into one run folder of ``store``; the records written.

    ``connect`` gives the Docker client, asked for only when probes run in images and after the
    plan stands (a bad matrix is reported as such, also without an engine).
    """
    if request.tier == "wheel":
        return _run_wheel_campaign(request, store=store, on_start=on_start, on_done=on_done)
    from stackforge.probes.catalog import catalog
    from stackforge.probes.execute import detect_host_gpus

    selection = request.selection
    plan = selection.plan()
    stacks = selection.stacks(plan)
    jobs = plan_jobs(plan, select_specs(catalog(), tier=request.tier, features=request.features), stacks)
    client = None if request.local_python else connect()
    run_dir = store.start(matrix_source=str(selection.matrix_path), shard=selection.shard_text)
    on_start(CampaignStarted(stacks=len(stacks), jobs=len(jobs), run_dir=run_dir))
    records = run_jobs(jobs, run_id=run_dir.name, host_gpus=detect_host_gpus(client),
                       write=lambda record: store.write(run_dir, record), client=client,
                       local_python=request.local_python, parallel=request.parallel, timeout_s=request.timeout_s,
                       log_dir=run_dir / "logs", builds_dir=request.builds_dir, on_done=on_done)
    store.finish(run_dir)
    return records


def _run_wheel_campaign(request: ProbeRequest, *, store: RunStore, on_start: Callable[[CampaignStarted], None],
                        on_done: Callable[[ResultRecord], None]) -> list[ResultRecord]:
    """The wheel tier: one record per (release x fact x target), read from the index's wheels."""
    import os
    import socket

    from stackforge.pip_config import read_pip_config
    from stackforge.wheels.cache import WheelCache
    from stackforge.wheels.index import index_config
    from stackforge.wheels.tier import list_releases, load_readers, plan_wheel_jobs, run_wheel_jobs, select_readers

    readers = select_readers(load_readers(), request.features)
    selection = request.selection
    plan = selection.plan()
    wanted = {stack.id for stack in selection.stacks(plan)}
    jobs = plan_wheel_jobs([c for c in plan.cells if not c.pruned and c.stack.id in wanted], readers)
    given = request.index
    indexes = index_config(index_url=given.index_url, extra_index_urls=given.extra_index_urls,
                           find_links=[str(given.find_links)] if given.find_links else [],
                           pip_config=read_pip_config(), env=os.environ)
    cache = WheelCache.open(indexes)
    listed = list_releases(jobs, indexes=indexes, cache=cache)   # an index that does not answer: no run
    run_dir = store.start(matrix_source=str(selection.matrix_path), shard=selection.shard_text)
    on_start(CampaignStarted(stacks=len(wanted), jobs=len(jobs), run_dir=run_dir, indexes=indexes.describe()))
    records = run_wheel_jobs(jobs, listed=listed, indexes=indexes, cache=cache, run_id=run_dir.name,
                             host=socket.gethostname(), write=lambda record: store.write(run_dir, record),
                             on_done=on_done)
    store.finish(run_dir)
    return records
