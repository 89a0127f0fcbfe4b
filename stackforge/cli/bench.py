"""``stackforge bench``: throughput benchmarks inside each built image (or locally with ``--local``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from stackforge.bench.catalog import suite_names, suite_variants
from stackforge.cli._runs import connect_engine, status_counts_line
from stackforge.cli.options import (
    positive_seconds,
    refuse_together,
    refuse_unused,
    selection,
    shard_option,
    stack_selection,
)
from stackforge.core.records import ResultRecord

if TYPE_CHECKING:
    from stackforge.jobs.campaign import CampaignStarted


@click.command(name="bench")
@stack_selection
@shard_option
@click.option("--suite", "suites", multiple=True, type=click.Choice(suite_names()),
              help="Bench suite (repeatable; default: allreduce and gemm, plus serve when --model is given).")
@click.option("--allreduce-backend", "variants", multiple=True, metavar="VARIANT",
              help=f"All-reduce variant to measure: {', '.join(suite_variants('allreduce'))} "
                   "(repeatable; default nccl). Choose from what the probes said works.")
@click.option("--bench", "ids", multiple=True, metavar="ID", help="Run exactly this bench id (repeatable).")
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Model directory for the serving bench (mounted read-only into the image).")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed repeats per measurement (the median is reported, with min, max and CV).")
@click.option("--max-bytes", type=click.IntRange(min=1), default=None,
              help="Largest all-reduce message in bytes (default 1 GiB).")
@click.option("--serve-arg", "serve_args", multiple=True, metavar="ARG",
              help="Extra serve.py argument, e.g. --serve-arg=--cuda-graph-max-bs=256 (repeatable).")
@click.option("--timeout", "timeout_s", type=float, default=None, callback=positive_seconds,
              help="Hard timeout per bench (seconds).")
@click.option("--local", "local", is_flag=True,
              help="Run in a Python environment of this machine (one stack: select it with --only).")
@click.option("--python", "python", default=None, metavar="PATH",
              help="With --local: the interpreter whose packages are measured (default: this one).")
@click.option("--builds", "builds_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A `stackforge build --out` folder: use the images its records name, pulled by digest when "
                   "not local. Default: local images by stack-id label.")
@click.option("--results", "results_root", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Results folder; each run writes one sub-folder.")
@click.option("--from-probes", "from_probes", is_flag=True,
              help="Measure a backend the probes decide (custom all-reduce, symmetric memory, NCCL Tree) only "
                   "where the probe records under --results say pass; skip it elsewhere with their evidence.")
@click.option("--list", "list_only", is_flag=True, help="List the known benches and exit.")
def command(matrix, cuda, targets, only, shard, suites, variants, ids, model_dir, repeats, max_bytes, serve_args,
            timeout_s, local, python, builds_dir, results_root, from_probes, list_only) -> None:
    """Measure all-reduce bandwidth, GEMM TFLOP/s and serving throughput for every kept stack x target."""
    from stackforge.bench.campaign import BenchRequest, run_bench_campaign
    from stackforge.bench.catalog import catalog
    from stackforge.bench.run import BenchOptions
    from stackforge.results.store import ResultsFolder

    refuse_unused("--python", python is not None, needs="--local", present=local)
    refuse_together("--local", "--builds", local and builds_dir is not None,
                    why="--local measures this machine's Python, not the images of a build folder")
    if list_only:
        for spec in catalog():
            click.echo(f"{spec.id:<32} {spec.feature:<22} {spec.description}")
        return
    options = BenchOptions(repeats=repeats, model_dir=model_dir, max_bytes=max_bytes, serve_args=tuple(serve_args),
                           timeout_s=timeout_s)
    request = BenchRequest(selection(matrix, cuda, targets, only, shard), suites=tuple(suites),
                           variants=tuple(variants), ids=tuple(ids), options=options,
                           local_python=(python or sys.executable) if local else None, builds_dir=builds_dir,
                           from_probes=from_probes)
    records = run_bench_campaign(request, store=ResultsFolder(results_root, command=tuple(sys.argv)),
                                 connect=connect_engine, on_start=_echo_start, on_done=_echo)
    click.echo(status_counts_line(records))


def _echo_start(started: CampaignStarted) -> None:
    click.echo(f"benchmarking {started.stacks} stack(s), {started.jobs} bench run(s) -> {started.run_dir}")


def _echo(record: ResultRecord) -> None:
    from stackforge.bench.catalog import describe_metrics

    outcome = record.outcome
    numbers = describe_metrics(record.outcome.metrics)
    click.echo(f"  {outcome.status.value:<7} {record.stack_id}  {record.target}  {record.probe}: {outcome.reason}"
               + (f" [{numbers}]" if numbers and numbers not in outcome.reason else ""))
