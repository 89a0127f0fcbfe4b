"""``stackforge probe``: capability probes inside each built image (or locally with ``--local``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from stackforge.cli._runs import connect_engine, summary_line
from stackforge.cli._compat import user_compat
from stackforge.cli.options import index_options, refuse_together, refuse_unused, shard_option, stack_selection
from stackforge.data import resolve_matrix_path
from stackforge.plan import plan_file
from stackforge.records import ResultRecord
from stackforge.shard import select


@click.command(name="probe")
@stack_selection
@shard_option
@click.option("--tier", type=click.Choice(["gate", "runtime", "all", "wheel"]), default="gate", show_default=True,
              help="gate: decidable without a GPU; runtime: needs GPUs of the target arch; all: both. "
                   "wheel: read the pinned releases' wheels from the index (no image, no GPU).")
@click.option("--feature", "features", multiple=True, metavar="FEATURE",
              help="Only probes speaking for this feature (or this probe id); repeatable.")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Hard timeout per probe (seconds).")
@click.option("--local", "local", is_flag=True, help="Run in a Python environment of this machine, not in images.")
@click.option("--python", "python", default=None, metavar="PATH",
              help="With --local: the interpreter whose packages are probed (default: this one).")
@click.option("-j", "--jobs", "parallel", type=int, default=2, show_default=True, help="Probes run in parallel.")
@click.option("--builds", "builds_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A `stackforge build --out` folder: probe the images its build records name, pulled by "
                   "digest when not local (the registry hand-off). Default: local images by stack-id label.")
@click.option("--results", "results_root", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Results folder; each run writes one sub-folder.")
@index_options
def command(matrix, cuda, targets, only, shard, tier, features, timeout_s, local, python, parallel,
            builds_dir, results_root, index_url, extra_index_urls, find_links) -> None:
    """Run capability probes for every kept stack x target of a matrix and record the evidence.

    \b
    --tier wheel reads each pinned FlashInfer / SGLang / kernel release's wheel from the index
    (pip's configuration, or --index-url/--find-links), into the wheel cache, never installed:
    one record per (release x fact x target), tier wheel, with the code lines as evidence.
    """
    index_given = bool(index_url or extra_index_urls or find_links)
    refuse_unused("--index-url/--extra-index-url/--find-links", index_given, needs="--tier wheel",
                  present=tier == "wheel")
    if tier == "wheel":
        for option, given in (("--local", local), ("--builds", builds_dir is not None),
                              ("--python", python is not None), ("--timeout", timeout_s is not None)):
            refuse_together("--tier wheel", option, given, why="the wheel tier reads wheels from the index, "
                                                               "not images or a Python environment")
        _probe_wheels(matrix, cuda, targets, only, shard, features, results_root, index_url, extra_index_urls,
                      find_links)
        return
    from stackforge.probes.campaign import plan_jobs, run_jobs, select_specs
    from stackforge.probes.catalog import catalog
    from stackforge.probes.execute import detect_host_gpus
    from stackforge.results import finish_run, start_run, write_record

    refuse_unused("--python", python is not None, needs="--local", present=local)
    refuse_together("--local", "--builds", local and builds_dir is not None,
                    why="--local probes this machine's Python, not the images of a build folder")
    matrix_path = resolve_matrix_path(matrix)
    plan = plan_file(matrix_path, targets=targets, cuda=cuda, only=only, user_compat=user_compat())
    stacks = select(plan.kept_stacks(), shard)
    jobs = plan_jobs(plan, select_specs(catalog(), tier=tier, features=features), stacks)
    client = None if local else connect_engine()
    run_dir = start_run(results_root, command=sys.argv, matrix_source=str(matrix_path),
                        shard=str(shard) if shard else None)
    click.echo(f"probing {len(stacks)} stack(s), {len(jobs)} probe run(s) -> {run_dir}")
    records = run_jobs(jobs, run_id=run_dir.name, host_gpus=detect_host_gpus(client),
                       write=lambda record: write_record(run_dir, record), client=client,
                       local_python=(python or sys.executable) if local else None, parallel=parallel,
                       timeout_s=timeout_s, log_dir=run_dir / "logs", builds_dir=builds_dir, on_done=_echo)
    finish_run(run_dir)
    click.echo(summary_line(records))


def _probe_wheels(matrix, cuda, targets, only, shard, features, results_root, index_url, extra_index_urls,
                  find_links) -> None:
    import os
    import socket

    from stackforge.pip_config import read_pip_config
    from stackforge.results import finish_run, start_run, write_record
    from stackforge.wheels.cache import WheelCache
    from stackforge.wheels.index import index_config
    from stackforge.wheels.tier import (list_releases, load_readers, plan_wheel_jobs, run_wheel_jobs,
                                        select_readers)

    readers = select_readers(load_readers(), features)
    matrix_path = resolve_matrix_path(matrix)
    plan = plan_file(matrix_path, targets=targets, cuda=cuda, only=only, user_compat=user_compat())
    wanted = {stack.id for stack in select(plan.kept_stacks(), shard)}
    jobs = plan_wheel_jobs([c for c in plan.cells if not c.pruned and c.stack.id in wanted], readers)
    indexes = index_config(index_url=index_url, extra_index_urls=extra_index_urls,
                           find_links=[str(find_links)] if find_links else [], pip_config=read_pip_config(),
                           env=os.environ)
    cache = WheelCache.open(indexes)
    listed = list_releases(jobs, indexes=indexes, cache=cache)   # an index that does not answer: no run
    run_dir = start_run(results_root, command=sys.argv, matrix_source=str(matrix_path),
                        shard=str(shard) if shard else None)
    click.echo(f"reading wheels for {len(wanted)} stack(s), {len(jobs)} reading(s) -> {run_dir} "
               f"({indexes.describe()})")
    records = run_wheel_jobs(jobs, listed=listed, indexes=indexes, cache=cache, run_id=run_dir.name,
                             host=socket.gethostname(), write=lambda record: write_record(run_dir, record),
                             on_done=_echo)
    finish_run(run_dir)
    click.echo(summary_line(records))


def _echo(record: ResultRecord) -> None:
    outcome = record.outcome
    click.echo(f"  {outcome.status.value:<7} {record.stack_id}  {record.target}  {record.probe}: {outcome.reason}")
