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
from typing import Any

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
