"""Bench glue: catalog selection, planning with preconditions, payload -> Outcome -> record, the local
runner, the container runner and the ``stackforge bench`` command."""

from __future__ import annotations

import json

import pytest
from _bench_helpers import torch_python
from click.testing import CliRunner

from stackforge.bench import catalog as bench_catalog
from stackforge.bench import run as bench_run
from stackforge.bench.run import BenchOptions
from stackforge.cli import cli
from stackforge.core.data import resolve_matrix_path
from stackforge.core.errors import SpecError
from stackforge.core.records import ResultRecord, Status, Tier
from stackforge.edges.gpus import HostGpus
from stackforge.jobs import job_runner
from stackforge.jobs.job_runner import ImageRef
from stackforge.plan.planner import plan_file

NO_GPU = HostGpus(False, "nvidia-smi not found on the host")
EIGHT_GPUS = HostGpus(True, "8 GPU(s)", ("NVIDIA RTX PRO 6000 Blackwell",) * 8, "580.65")
STACK_ID = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"


def plan_for(*targets: str):
    return plan_file(resolve_matrix_path(None), targets=targets, only=(STACK_ID,))


def spec(bench_id: str) -> bench_catalog.BenchSpec:
    return next(s for s in bench_catalog.catalog() if s.id == bench_id)


# ------------------------------------------------------------------------------------ catalog


def test_catalog_ids_are_unique_and_scripts_exist():
    specs = bench_catalog.catalog()
    assert len({s.id for s in specs}) == len(specs)
    for s in specs:
        assert (bench_catalog.SCRIPTS_DIR / s.script).is_file()
        assert s.tier == "bench" and s.suite in bench_catalog.suite_names()


def test_select_benches():
    specs = bench_catalog.catalog()
    assert [s.id for s in bench_catalog.select_benches(specs)] == ["bench.allreduce.nccl", "bench.gemm"]
    chosen = bench_catalog.select_benches(specs, suites=("allreduce",), allreduce_variants=("custom", "nccl-tree"))
    assert [s.id for s in chosen] == ["bench.allreduce.nccl-tree", "bench.allreduce.custom"]
    assert [s.id for s in bench_catalog.select_benches(specs, ids=("bench.serve",))] == ["bench.serve"]
    with pytest.raises(SpecError, match="known: nccl"):
        bench_catalog.select_benches(specs, allreduce_variants=("mscclpp",))
    with pytest.raises(SpecError, match="unknown bench id"):
        bench_catalog.select_benches(specs, ids=("bench.nope",))
    with pytest.raises(SpecError, match="unknown suite"):
        bench_catalog.select_benches(specs, suites=("latency",))


# ------------------------------------------------------------------------------------ planning


def test_plan_bench_decides_preconditions_up_front():
    plan = plan_for("rtx-pro-6000-x8-pcie", "rtx-5090-x1")
    specs = tuple(spec(i) for i in ("bench.allreduce.nccl", "bench.allreduce.symm-mem-multimem", "bench.gemm",
                                    "bench.serve", "bench.allreduce.gloo"))
    jobs = {(j.target.name, j.spec.id): j for j in
            bench_run.plan_bench(plan, specs, BenchOptions(), host_gpus=EIGHT_GPUS, local=False)}
    assert jobs[("rtx-pro-6000-x8-pcie", "bench.allreduce.nccl")].skip_reason is None
    assert "has 1 GPU(s)" in jobs[("rtx-5090-x1", "bench.allreduce.nccl")].skip_reason
    assert "no NVLS multicast" in jobs[("rtx-pro-6000-x8-pcie", "bench.allreduce.symm-mem-multimem")].skip_reason
    assert "no model directory" in jobs[("rtx-pro-6000-x8-pcie", "bench.serve")].skip_reason
    assert jobs[("rtx-5090-x1", "bench.gemm")].skip_reason is None
    no_gpu = bench_run.plan_bench(plan, specs, BenchOptions(), host_gpus=NO_GPU, local=True)
    reasons = {j.spec.id: j.skip_reason for j in no_gpu if j.target.name == "rtx-pro-6000-x8-pcie"}
    assert reasons["bench.gemm"] == "no GPU on this host: nvidia-smi not found on the host"
    assert reasons["bench.allreduce.gloo"] is None          # the CPU harness runs anywhere


def test_script_args_per_suite(tmp_path):
    target = plan_for("rtx-pro-6000-x8-pcie").targets[0]
    options = BenchOptions(repeats=3, model_dir=tmp_path, max_bytes=1 << 24, serve_args=("--custom-allreduce", "off"))
    assert bench_run.script_args(spec("bench.allreduce.nccl-tree"), target, options, model_path="/m") == (
        "--backend", "nccl", "--nccl-algo", "tree", "--repeats", "3", "--world-size", "8", "--max-bytes", "16777216")
    assert bench_run.script_args(spec("bench.gemm"), target, options, model_path="/m") == ("--repeats", "3")
    assert bench_run.script_args(spec("bench.serve"), target, options, model_path="/stackforge/model") == (
        "--model", "/stackforge/model", "--tp", "8", "--custom-allreduce", "off")
    plan = plan_for("rtx-pro-6000-x8-pcie")
    local = bench_run.plan_bench(plan, (spec("bench.serve"),), options, host_gpus=EIGHT_GPUS, local=True)
    docker = bench_run.plan_bench(plan, (spec("bench.serve"),), options, host_gpus=EIGHT_GPUS, local=False)
    assert str(tmp_path) in local[0].args and bench_run.CONTAINER_MODEL in docker[0].args


# ------------------------------------------------------------------------------------ outcomes


def allreduce_payload(**overrides) -> dict:
    payload = {"status": "pass", "reason": "nccl all-reduce over 8 ranks: 112 measurements correct",
               "evidence": "#  size(B) ...", "facts": {"versions": {"torch": "2.14.1"}},
               "metrics": {"collective": "allreduce", "backend": "nccl", "peak_busbw_gbps": 47.25,
                           "avg_busbw_gbps": 20.0, "rows": [{"size_bytes": 8, "time_us": float("nan")}]}}
    payload.update(overrides)
    return payload


def test_outcome_from_payload_adds_link_context_and_strict_json():
    target = plan_for("rtx-pro-6000-x8-pcie").targets[0]
    outcome = job_runner.outcome_from_payload(bench_run.bench_kind(), allreduce_payload(), duration_s=12.0, target=target)
    assert outcome.status is Status.PASS and outcome.duration_s == 12.0
    assert outcome.metrics["link_peak"]["name"] == "PCIe Gen5 x16"
    assert outcome.metrics["peak_busbw_efficiency"] == pytest.approx(47.25 / 63.0154, rel=1e-4)
    assert outcome.metrics["rows"][0]["time_us"] == "nan"
    json.dumps(outcome.metrics, allow_nan=False)   # a record is strict JSON


@pytest.mark.parametrize(("payload", "reason"), [
    ({"status": "timeout", "reason": "x"}, "bench claimed status timeout"),
    ({"status": "great"}, "unknown status 'great'"),
    ({"status": "pass", "metrics": [1, 2]}, "metrics are a list"),
])
def test_malformed_payloads_are_errors(payload, reason):
    outcome = job_runner.outcome_from_payload(bench_run.bench_kind(), payload)
    assert outcome.status is Status.ERROR and reason in outcome.reason


def test_outcome_from_ending_judges_deaths_like_probes():
    def ending(**kw):
        base = {"exit_code": 0, "timed_out": False, "signal": None, "output": "", "duration_s": 1.0,
                "timeout_s": 60.0}
        return job_runner.outcome_from_ending(bench_run.bench_kind(), **{**base, **kw})[0]
    line = "log\nSTACKFORGE_RESULT " + json.dumps(allreduce_payload())
    assert ending(timed_out=True, output=line).status is Status.TIMEOUT
    assert ending(exit_code=-11, signal=11, output=line).status is Status.CRASH
    assert ending(output="Traceback ...").status is Status.ERROR
    assert ending(output=line).status is Status.PASS


def test_bench_record_round_trips_as_a_bench_tier_record():
    plan = plan_for("rtx-pro-6000-x8-pcie")
    job = bench_run.plan_bench(plan, (spec("bench.allreduce.custom"),), BenchOptions(), host_gpus=EIGHT_GPUS,
                               local=False)[0]
    outcome, facts = job_runner.outcome_from_ending(bench_run.bench_kind(), exit_code=0, timed_out=False, signal=None,
                                                    duration_s=3.0, timeout_s=60.0, target=job.target,
                                                    output="STACKFORGE_RESULT " + json.dumps(allreduce_payload()))
    facts = {**facts, "gpus": ["NVIDIA RTX PRO 6000 Blackwell"], "driver": "580.65",
             "nvcc": "Cuda compilation tools, release 13.0, V13.0.88"}
    provenance = job_runner.provenance_from_facts(facts, ImageRef("img:tag", "sha256:1"), EIGHT_GPUS, "docker")
    record = job_runner.make_record(bench_run.bench_kind(), job, outcome, provenance, run_id="r1")
    assert (record.tier, record.kind, record.probe, record.feature) == (Tier.BENCH, "bench", "bench.allreduce.custom",
                                                                       "custom-allreduce")
    assert record.provenance.versions == {"torch": "2.14.1"}
    assert record.provenance.gpus == ["NVIDIA RTX PRO 6000 Blackwell"] and record.provenance.driver == "580.65"
    assert record.provenance.nvcc.startswith("Cuda compilation tools, release 13.0")
    again = ResultRecord.from_json(json.loads(record.dumps()))
    assert again == record


# ------------------------------------------------------------------------------------ runners


@pytest.mark.heavy
def test_run_job_locally_gloo_for_real(tmp_path):
    plan = plan_for("rtx-pro-6000-x2-pcie")
    options = BenchOptions(repeats=2, max_bytes=4096)
    job = bench_run.plan_bench(plan, (spec("bench.allreduce.gloo"),), options, host_gpus=NO_GPU, local=True)[0]
    record = job_runner.run_job_locally(bench_run.bench_kind(), job, run_id="r", host_gpus=NO_GPU, python=torch_python(),
                                        log_path=tmp_path / "log")
    assert record.outcome.status is Status.PASS, record.outcome.reason + record.outcome.evidence
    assert record.outcome.metrics["rows"][-1]["size_bytes"] == 4096
    assert "link_peak" not in record.outcome.metrics        # gloo moves CPU memory: no GPU link context
    assert record.provenance.runner == "local" and record.provenance.versions["torch"].startswith("2.")
    assert "STACKFORGE_RESULT" in (tmp_path / "log").read_text()


def test_skipped_job_runs_nothing():
    plan = plan_for("rtx-pro-6000-x2-pcie")
    job = bench_run.plan_bench(plan, (spec("bench.gemm"),), BenchOptions(), host_gpus=NO_GPU, local=True)[0]
    record = job_runner.run_job_locally(bench_run.bench_kind(), job, run_id="r", host_gpus=NO_GPU, python="/nonexistent/python")
    assert record.outcome.status is Status.SKIP and "no GPU on this host" in record.outcome.reason


@pytest.mark.docker
def test_container_runner_mounts_scripts_and_helper(docker_client, base_image):
    # The base image has Python but no torch: the script must start (bench scripts and _sfprobe mounted
    # side by side), find that out, and say so -- a real container run, removed afterwards.
    image = docker_client.images.get(base_image)
    plan = plan_for("rtx-pro-6000-x2-pcie")
    job = bench_run.plan_bench(plan, (spec("bench.allreduce.gloo"),), BenchOptions(repeats=1), host_gpus=NO_GPU,
                               local=False)[0]
    record = job_runner.run_job_in_container(bench_run.bench_kind(), docker_client, ImageRef(base_image, image.id), job,
                                             run_id="sf-bench-test", host_gpus=NO_GPU)
    assert record.outcome.status is Status.SKIP, record.outcome
    assert "torch is not installed" in record.outcome.reason
    assert record.provenance.runner == "docker" and record.provenance.image_id == image.id
    assert not docker_client.containers.list(all=True, filters={"label": "io.stackforge.run=sf-bench-test"})


# ------------------------------------------------------------------------------------ CLI


@pytest.mark.heavy
def test_cli_local_gloo_writes_records(tmp_path):
    results = tmp_path / "results"
    outcome = CliRunner().invoke(cli, ["bench", "--local", "--python", torch_python(), "--only", STACK_ID,
                                       "--target", "rtx-pro-6000-x2-pcie", "--suite", "allreduce", "--suite", "gemm",
                                       "--allreduce-backend", "gloo", "--max-bytes", "1024", "--repeats", "2",
                                       "--results", str(results)])
    assert outcome.exit_code == 0, outcome.output
    assert "summary:" in outcome.output
    files = sorted(p.name for p in results.glob(f"*/{STACK_ID}/rtx-pro-6000-x2-pcie/*.json"))
    assert files == ["bench.allreduce.gloo.json", "bench.gemm.json"]
    gloo = json.loads(next(results.glob("*/*/*/bench.allreduce.gloo.json")).read_text())
    assert gloo["tier"] == "bench" and gloo["kind"] == "bench" and gloo["outcome"]["status"] == "pass"


def test_cli_local_refuses_several_stacks(tmp_path):
    outcome = CliRunner().invoke(cli, ["bench", "--local", "--results", str(tmp_path)])
    assert outcome.exit_code == 2
    assert "--only STACK_ID" in outcome.output


def test_cli_list():
    outcome = CliRunner().invoke(cli, ["bench", "--list"])
    assert outcome.exit_code == 0
    assert "bench.allreduce.nccl-tree" in outcome.output and "bench.serve" in outcome.output


def test_cli_model_must_exist(tmp_path):
    outcome = CliRunner().invoke(cli, ["bench", "--model", str(tmp_path / "missing"), "--local"])
    assert outcome.exit_code == 2 and "does not exist" in outcome.output


