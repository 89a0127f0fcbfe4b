"""A new benchmark is a script and one catalog entry: its metric names, units and direction declared
there reach the job runner, the report's headline, pick's throughput ranking, diff's direction, the
terminal summary and the suite choice, with no other file touched."""

from __future__ import annotations

import sys

import pytest

from stackforge.bench import catalog as bench_catalog
from stackforge.bench import run as bench_run
from stackforge.bench.catalog import BenchSpec, MetricSpec
from stackforge.core.data import resolve_matrix_path
from stackforge.core.errors import SpecError
from stackforge.core.records import Status, Tier
from stackforge.edges.gpus import HostGpus
from stackforge.jobs import job_runner
from stackforge.plan.planner import plan_file
from stackforge.report.diff import lower_is_better

STACK_ID = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"
NO_GPU = HostGpus(False, "nvidia-smi not found on the host")

#: The toy's script: prints its result line as every bench script does.
TOY_SCRIPT = '''\
import json, sys
args = sys.argv[1:]
print("STACKFORGE_RESULT " + json.dumps({
    "status": "pass", "reason": "toy measured " + " ".join(args), "evidence": "",
    "metrics": {"widgets_per_s": 1234.5, "stall_per_s": 0.25, "args": args},
    "facts": {"versions": {"toy": "1.0"}}}))
'''

#: ``stall_per_s`` reads like a rate, which the name-based guess calls higher-is-better; the entry
#: says lower, and its word is the one that counts.
TOY = BenchSpec(id="bench.toy", suite="toy", variant="v1", feature="toy-throughput", script="toy.py",
                default_timeout_s=60.0, needs_gpu=False, description="a toy bench", inputs=("repeats", "tp"),
                metrics=(MetricSpec("widgets_per_s", "widgets/s", summary_rank=0, throughput="widgets",
                                    headline="{value} widgets/s"),
                         MetricSpec("stall_per_s", "stalls/s", better="lower")))


@pytest.fixture
def with_toy(monkeypatch):
    shipped = bench_catalog.catalog()
    monkeypatch.setattr(bench_catalog, "catalog", lambda: (*shipped, TOY))
    return TOY


def test_a_toy_bench_runs_and_its_declared_metrics_reach_report_pick_diff_and_the_terminal(with_toy, tmp_path):
    from stackforge.report.compat_matrix import key_metric
    from stackforge.report.pick import _throughput

    (tmp_path / "toy.py").write_text(TOY_SCRIPT)
    plan = plan_file(resolve_matrix_path(None), targets=("rtx-pro-6000-x8-pcie",), only=(STACK_ID,))
    options = bench_run.BenchOptions(repeats=3)
    specs = bench_catalog.select_benches(bench_catalog.catalog(), suites=("toy",))
    assert specs == (TOY,)
    job = bench_run.plan_bench(plan, specs, options, host_gpus=NO_GPU, local=True)[0]
    assert job.args == ("--repeats", "3", "--tp", "8"), "the script gets the inputs its entry declares"

    record = job_runner.run_job_locally(bench_run.bench_kind(scripts_dir=tmp_path), job, run_id="toy", host_gpus=NO_GPU,
                                        python=sys.executable)
    assert (record.outcome.status, record.tier, record.kind) == (Status.PASS, Tier.BENCH, "bench")
    assert record.outcome.metrics["widgets_per_s"] == 1234.5
    assert record.provenance.versions == {"toy": "1.0"}

    headline = key_metric([record])
    assert (headline.name, headline.value, headline.unit) == ("widgets_per_s", 1234.5, "widgets/s")
    metric, rank = _throughput([record])
    assert (metric.name, metric.unit, rank) == ("widgets", "widgets/s", len(bench_catalog.throughput_metrics()))
    assert bench_catalog.describe_metrics(record.outcome.metrics) == "1234.5 widgets/s"
    assert lower_is_better("stall_per_s") and not lower_is_better("widgets_per_s")
    assert "toy" in bench_catalog.suite_names() and "toy" in bench_catalog.default_suites(model_dir=None)


def test_without_the_entry_the_toy_metrics_are_unknown():
    """The same names without the catalog entry: no unit, no headline, and the name guess for direction."""
    assert "widgets_per_s" not in bench_catalog.metric_units()
    assert not lower_is_better("stall_per_s"), "the name guess reads a rate"
    assert bench_catalog.describe_metrics({"widgets_per_s": 1.0}) == ""


def test_the_shipped_catalog_declares_what_report_pick_and_diff_used_to_hard_code():
    assert bench_catalog.summary_metric_names() == (
        "output_throughput", "output_tok_s", "peak_busbw_gbps", "busbw_gbps", "busbw", "best_tflops", "tflops",
        "min_size_latency_us", "latency_us", "ttft_ms")
    assert bench_catalog.throughput_metrics() == (
        ("output_throughput", ("output_throughput", "output_tok_s")),
        ("busbw", ("peak_busbw_gbps", "busbw_gbps", "busbw")), ("tflops", ("best_tflops", "tflops")))
    assert bench_catalog.metric_units()["min_size_latency_us"] == "µs"
    assert bench_catalog.suite_names() == ("allreduce", "gemm", "serve")


def test_the_cli_suite_choice_is_the_catalogs():
    from stackforge.cli.bench import command

    suite = next(p for p in command.params if p.name == "suites")
    assert tuple(suite.type.choices) == bench_catalog.suite_names()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"inputs": ("repeats", "gpus")}, "unknown script input(s) gpus"),
    ({"script": "sub/toy.py"}, "script must be a .py file name"),
])
def test_a_malformed_entry_is_refused(kwargs, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BenchSpec(**{"id": "bench.bad", "suite": "toy", "variant": "v", "feature": "f", "script": "toy.py",
                     **kwargs})


def test_a_metric_direction_is_higher_or_lower():
    with pytest.raises(SpecError, match="better must be one of higher, lower"):
        MetricSpec("x", "u", better="up")
