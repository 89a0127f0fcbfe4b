"""The probe and bench campaigns as the CLI calls them: one typed request, one function.

``stackforge probe`` and ``stackforge bench`` only parse options into a :class:`ProbeRequest` /
:class:`BenchRequest` and call :func:`run_probe_campaign` / :func:`run_bench_campaign`; these tests
call the same functions directly, with a real results folder.
"""

from __future__ import annotations

import sys

import pytest
from test_import_graph import PACKAGE_ROOT, import_graph

from stackforge.bench.campaign import BenchRequest, run_bench_campaign
from stackforge.bench.catalog import default_suites
from stackforge.core.errors import RecordError, SpecError
from stackforge.jobs.campaign import CampaignStarted
from stackforge.plan.selection import StackSelection
from stackforge.probes.campaign import ProbeRequest, run_probe_campaign
from stackforge.results.store import ResultsFolder, load_results, start_run

STACK_ID = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"


def no_engine():
    pytest.fail("the campaign asked for the Docker engine")


def test_a_local_probe_campaign_records_into_one_run_without_the_engine(tmp_path):
    started: list[CampaignStarted] = []
    # No --only: this interpreter is not that stack (tests/test_probe_truth.py), its records go under its own id.
    request = ProbeRequest(StackSelection(targets=("rtx-pro-6000-x2-pcie",)), tier="gate",
                           features=("torch-kernels",), local_python=sys.executable)
    records = run_probe_campaign(request, store=ResultsFolder(tmp_path, command=("stackforge", "probe")),
                                 connect=no_engine, on_start=started.append)
    assert [s.stacks for s in started] == [1] and started[0].jobs == len(records) >= 1
    loaded = load_results(tmp_path)
    assert not loaded.problems and {r.key for r in loaded.records} == {r.key for r in records}
    assert loaded.runs[0].finished_at and loaded.runs[0].command == ("stackforge", "probe")
    assert {r.stack_id for r in records} == {records[0].stack_id} and records[0].stack_id.startswith("local-")


def test_an_unknown_feature_stops_the_probe_campaign_before_any_run_folder(tmp_path):
    request = ProbeRequest(StackSelection(only=(STACK_ID,)), features=("no-such-feature",))
    with pytest.raises(SpecError, match="no-such-feature"):
        run_probe_campaign(request, store=ResultsFolder(tmp_path), connect=no_engine)
    assert list(tmp_path.iterdir()) == []


def test_a_local_bench_campaign_refuses_several_stacks_before_the_engine_or_a_run(tmp_path):
    request = BenchRequest(StackSelection(), local_python=sys.executable)
    with pytest.raises(SpecError, match="holds one stack") as raised:
        run_bench_campaign(request, store=ResultsFolder(tmp_path), connect=no_engine)
    assert "--only STACK_ID" in raised.value.one_line()
    assert list(tmp_path.iterdir()) == []


def test_bench_from_probes_reads_the_store_strictly(tmp_path):
    run_dir = start_run(tmp_path, command=("probe",))
    (run_dir / STACK_ID / "rtx-pro-6000-x2-pcie").mkdir(parents=True)
    (run_dir / STACK_ID / "rtx-pro-6000-x2-pcie" / "broken.json").write_text("{not json")
    request = BenchRequest(StackSelection(only=(STACK_ID,)), local_python=sys.executable, from_probes=True)
    with pytest.raises(RecordError, match="broken.json") as raised:
        run_bench_campaign(request, store=ResultsFolder(tmp_path), connect=no_engine)
    assert "--from-probes" in raised.value.one_line()
    assert [p.name for p in tmp_path.iterdir()] == [run_dir.name]   # no second run was started


def test_serving_is_a_default_suite_only_with_a_model(tmp_path):
    assert default_suites(model_dir=None) == ("allreduce", "gemm")
    assert default_suites(model_dir=tmp_path) == ("allreduce", "gemm", "serve")


def test_the_cli_of_probe_bench_bisect_and_render_only_dispatches():
    graph = import_graph(PACKAGE_ROOT, "stackforge")
    assert "stackforge.cli.build" not in graph["stackforge.cli.render"]
    for command in ("stackforge.cli.probe", "stackforge.cli.bench", "stackforge.cli.bisect"):
        workflow = {"stackforge.plan.planner", "stackforge.core.shard", "stackforge.core.data",
                    "stackforge.edges.pip_config", "stackforge.wheels.tier", "stackforge.edges.index",
                    "stackforge.wheels.cache", "stackforge.wheels.bisect",
                    "stackforge.probes.execute", "stackforge.probes.catalog"}
        assert not workflow & graph[command], command


def test_the_cli_of_the_reports_ci_and_render_calls_one_library_entry():
    """The commands that held workflow call their library entry and nothing it is made of: pick calls
    report.pick.pick, upgrade report.upgrade.upgrade_between, the reports' evidence
    report.evidence.load_evidence, ci github ci.github.sync_workflow, render build.contexts.render_stacks."""
    graph = import_graph(PACKAGE_ROOT, "stackforge")
    # (Writing an --out file through core.fsio is the CLI's own output, not workflow.)
    made_of = {"stackforge.report.compat_matrix", "stackforge.results.store", "stackforge.watch.currency",
               "stackforge.watch.state", "stackforge.plan.rules", "stackforge.build.locking",
               "stackforge.edges.resolver", "stackforge.probes.campaign", "stackforge.plan.selection"}
    for command in ("stackforge.cli.pick", "stackforge.cli.upgrade", "stackforge.cli._evidence",
                    "stackforge.cli.ci", "stackforge.cli.render"):
        assert not made_of & graph[command], (command, made_of & graph[command])


def test_a_campaign_run_is_closed_only_when_its_body_ends(tmp_path):
    """campaign_run opens, notes the host, announces, hands out write, and closes; a body that raises
    (Ctrl-C, an engine gone) leaves the run open with what it wrote, which the store reads as unfinished."""
    from stackforge.jobs.campaign import campaign_run
    from stackforge.results.store import ResultsFolder, read_run_info

    store, told = ResultsFolder(tmp_path), []
    with campaign_run(store, matrix_source="m.yaml", shard=None, stacks=1, jobs=0, host={"gpus": []},
                      on_start=told.append) as (run_dir, write):
        assert [started.run_dir for started in told] == [run_dir]
        assert read_run_info(run_dir).finished_at is None
    finished = run_dir
    with pytest.raises(KeyboardInterrupt):
        with campaign_run(store, matrix_source="m.yaml", shard=None, stacks=1, jobs=0) as (run_dir, write):
            raise KeyboardInterrupt
    assert read_run_info(finished).finished_at is not None
    assert read_run_info(run_dir).finished_at is None
