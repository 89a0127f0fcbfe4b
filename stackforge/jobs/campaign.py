"""A campaign: a plan's jobs recorded into one run of the results store.

:func:`plan_jobs` gives one :class:`CellJob` per kept (stack, target) cell and spec, for probes and
benchmarks alike; :func:`campaign_run` is the one skeleton every campaign (probe, bench, wheel tier)
runs: open the run folder, say what is about to run, fill the run record by record, close it. A
campaign that is interrupted leaves its run folder open with the records written so far (the results
store reads an unfinished run as such).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge.core.errors import StackforgeError, interrupt_signal
from stackforge.core.model import Stack, Target
from stackforge.core.records import PlannedJob, ResultRecord, RunStore
from stackforge.edges.runner import signal_name
from stackforge.plan.planner import Plan

__all__ = ["CampaignStarted", "CellJob", "campaign_run", "plan_jobs"]


@dataclass(frozen=True, slots=True)
class CellJob:
    """One (stack, target) cell of a plan and one spec, before it is scheduled (a probe's or a bench's)."""

    stack: Stack
    target: Target
    spec: Any   # stackforge.probes.catalog.ProbeSpec or stackforge.bench.catalog.BenchSpec


def plan_jobs(plan: Plan, specs: Sequence[Any], stacks: Sequence[Stack] | None = None) -> tuple[CellJob, ...]:
    """One job per kept (stack, target) cell and spec (pruned cells are not run: rules said why)."""
    wanted = None if stacks is None else {s.id for s in stacks}
    return tuple(CellJob(c.stack, c.target, spec) for c in plan.cells
                 if not c.pruned and (wanted is None or c.stack.id in wanted) for spec in specs)


@dataclass(frozen=True, slots=True)
class CampaignStarted:
    """What a campaign is about to run, told before its first record."""

    stacks: int
    jobs: int
    run_dir: Path
    #: the wheel tier's index locations, as words; None for scripts that run
    indexes: str | None = None


@contextmanager
def campaign_run(store: RunStore, *, matrix_source: str, shard: str | None, stacks: int, jobs: int,
                 host: dict[str, Any] | None = None, indexes: str | None = None,
                 planned: Sequence[PlannedJob] = (),
                 on_start: Callable[[CampaignStarted], None] = lambda started: None
                 ) -> Iterator[tuple[Path, Callable[[ResultRecord], Any]]]:
    """One run of ``store``, the skeleton of every campaign: opened (with how many jobs it plans, ``planned``
    naming them when they are probes, and the host's facts when scripts run on it) and announced through
    ``on_start``; the body gets ``(run_dir, write)``, ``write`` storing one record as it finishes; closed when
    the body ends. A body that raises (an interruption, an engine gone) leaves the run open with the records
    written so far, and says why it ended early: the results store reads it as partial.

    Used as ``with campaign_run(...) as (run_dir, write): return run_jobs(..., write=write)``, so a
    campaign reads top-down and nothing here calls back into the stage above.
    """
    run_dir = store.start(matrix_source=matrix_source, shard=shard, planned=jobs, jobs=planned)
    if host is not None:
        store.note_host(run_dir, host)
    on_start(CampaignStarted(stacks=stacks, jobs=jobs, run_dir=run_dir, indexes=indexes))
    try:
        yield run_dir, lambda record: store.write(run_dir, record)
    except BaseException as exc:
        try:
            store.end_early(run_dir, _why_ended(exc))
        except (OSError, StackforgeError):
            pass   # a folder that takes no more writes: the run stays unfinished; the first error is the one to tell
        raise
    store.finish(run_dir)


def _why_ended(exc: BaseException) -> str:
    """``interrupted by SIGTERM`` for an interruption, else ``ended early: <the error in one line>``."""
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted by {signal_name(interrupt_signal(exc))}"
    if isinstance(exc, StackforgeError):
        return f"ended early: {exc.one_line()}"
    return f"ended early: {type(exc).__name__}: {exc}"[:300]
