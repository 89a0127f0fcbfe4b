"""A bench campaign: the benches of every kept (stack, target) cell, run one at a time into one run folder.

:func:`run_bench_campaign` takes one :class:`BenchRequest` (what ``stackforge bench`` was asked) and
does what the command does: select the benches, plan the jobs, gate them on the probe records
(``--from-probes``), run them, and record each result as it finishes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stackforge.bench.run import BenchOptions
from stackforge.core.errors import SpecError
from stackforge.core.records import ResultRecord, RunStore
from stackforge.jobs.campaign import CampaignStarted, campaign_run
from stackforge.plan.selection import StackSelection


class ResultsStore(RunStore, Protocol):
    """A :class:`~stackforge.core.records.RunStore` that also reads the records already under it."""

    def records(self, *, remedy: str) -> Sequence[ResultRecord]: ...


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One ``stackforge bench`` run.

    ``suites`` empty: :func:`stackforge.bench.catalog.default_suites`. ``local_python`` set: the benches run in that
    interpreter's environment (one stack), not in images. ``from_probes``: a bench for a feature the
    probes decide runs only where the probe records under the store say pass.
    """

    selection: StackSelection
    suites: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()
    options: BenchOptions = BenchOptions()
    local_python: str | None = None
    builds_dir: Path | None = None
    from_probes: bool = False


def run_bench_campaign(request: BenchRequest, *, store: ResultsStore, connect: Callable[[], Any],
                       on_start: Callable[[CampaignStarted], None] = lambda started: None,
                       on_done: Callable[[ResultRecord], None] = lambda record: None) -> list[ResultRecord]:
    """Plan the request's bench jobs and run them into one run folder of ``store``; the records written.

    Raises:
        SpecError: ``local_python`` with other than one stack selected (an environment holds one stack).
        RecordError: ``from_probes`` and a record file under the store that does not load.
    """
    from stackforge.bench.catalog import catalog, default_suites, select_benches
    from stackforge.bench.run import plan_bench, run_bench_jobs
    from stackforge.edges.gpus import detect_host_gpus, host_facts
    from stackforge.jobs.job_runner import check_host, driver_floors

    options = request.options
    specs = select_benches(catalog(), suites=request.suites or default_suites(model_dir=options.model_dir),
                           allreduce_variants=request.variants, ids=request.ids)
    selection = request.selection
    plan = selection.plan()
    stacks = selection.stacks(plan)
    local = request.local_python is not None
    if local and len(stacks) != 1:
        raise SpecError(f"--local measures this machine's Python environment, which holds one stack; "
                        f"{len(stacks)} are selected", remedy="choose the stack it holds with --only STACK_ID")
    client = None if local else connect()
    host_gpus = detect_host_gpus(client)
    jobs = plan_bench(plan, specs, options, host_gpus=host_gpus, local=local, stacks=stacks)
    if request.from_probes:
        jobs = _gate_on_probes(jobs, store)
    # The host check is read before the run opens and written with it: a partial run carries it too.
    host_check = check_host(host_gpus, jobs, driver_floors(plan.cells))
    with campaign_run(store, matrix_source=str(selection.matrix_path), shard=selection.shard_text,
                      stacks=len(stacks), jobs=len(jobs),
                      host={**host_facts(host_gpus), **host_check.to_json()},
                      on_start=on_start) as (run_dir, write):
        return run_bench_jobs(jobs, options, run_id=run_dir.name, host_gpus=host_gpus, write=write, client=client,
                              local_python=request.local_python, log_dir=run_dir / "logs",
                              builds_dir=request.builds_dir, on_done=on_done, host_check=host_check)


def _gate_on_probes(jobs, store: ResultsStore):
    """The jobs after ``--from-probes``: probe records are read (strictly) before anything runs."""
    from stackforge.bench.run import gate_on_probes
    from stackforge.probes.catalog import catalog as probe_catalog

    records = store.records(remedy="fix or remove these files before benchmarking --from-probes")
    return gate_on_probes(jobs, records, frozenset(spec.feature for spec in probe_catalog()))
