"""A probe campaign: every (stack, target, probe) job of a plan, run with bounded parallelism.

Continue-on-error: one probe's failure, hang or crash never stops the others. Records are written
one by one as they finish (atomically), so Ctrl-C (or SIGTERM / SIGHUP) keeps everything that
completed; every container of the run carries the run label and is removed, also then. The probes
the interruption cut short are not recorded: their ending was not the software's answer. An engine
that goes away ends the run the same way, with its error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge.core.errors import SpecError
from stackforge.core.records import ResultRecord, RunStore
from stackforge.edges.gpus import HostGpus
from stackforge.edges.index import IndexRequest
from stackforge.jobs import job_runner
from stackforge.jobs.campaign import CampaignStarted, CellJob, campaign_run, plan_jobs
from stackforge.jobs.job_runner import ImageRef
from stackforge.plan.selection import StackSelection
from stackforge.probes.execute import SCRIPTS_DIR, plan_probe_job, probe_kind

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
                   on_done: Callable[[ResultRecord], None] = lambda record: None) -> list[ResultRecord]:
    """Schedule the probe jobs (preconditions the host and target cannot meet become skips) and run
    them ``parallel`` at a time through :func:`stackforge.jobs.job_runner.run_jobs`, writing each record."""
    scheduled = [plan_probe_job(job.stack, job.spec, job.target, host_gpus, timeout_s) for job in jobs]
    return job_runner.run_jobs(probe_kind(scripts_dir or SCRIPTS_DIR), scheduled, run_id=run_id,
                               host_gpus=host_gpus, write=write, client=client, local_python=local_python,
                               parallel=parallel, log_dir=log_dir, builds_dir=builds_dir, images=images,
                               on_done=on_done)


# ------------------------------------------------------------------------------------- the campaign


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


def run_probe_campaign(request: ProbeRequest, *, store: RunStore, connect: Callable[[], Any],
                       on_start: Callable[[CampaignStarted], None] = lambda started: None,
                       on_done: Callable[[ResultRecord], None] = lambda record: None) -> list[ResultRecord]:
    """Plan the request's probe jobs, run them into one run folder of ``store``; the records written.

    ``connect`` gives the Docker client, asked for only when probes run in images and after the
    plan stands (a bad matrix is reported as such, also without an engine).
    """
    if request.tier == "wheel":
        return _run_wheel_campaign(request, store=store, on_start=on_start, on_done=on_done)
    from stackforge.edges.gpus import detect_host_gpus, host_facts
    from stackforge.probes.catalog import catalog

    selection = request.selection
    plan = selection.plan()
    stacks = selection.stacks(plan)
    jobs = plan_jobs(plan, select_specs(catalog(), tier=request.tier, features=request.features), stacks)
    client = None if request.local_python else connect()
    host_gpus = detect_host_gpus(client)
    with campaign_run(store, matrix_source=str(selection.matrix_path), shard=selection.shard_text,
                      stacks=len(stacks), jobs=len(jobs), host=host_facts(host_gpus),
                      on_start=on_start) as (run_dir, write):
        return run_probe_jobs(jobs, run_id=run_dir.name, host_gpus=host_gpus, write=write, client=client,
                              local_python=request.local_python, parallel=request.parallel,
                              timeout_s=request.timeout_s, log_dir=run_dir / "logs", builds_dir=request.builds_dir,
                              on_done=on_done)


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
