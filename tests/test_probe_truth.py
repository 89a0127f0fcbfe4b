"""Probe runs that tell the truth (issue #32, items 2, 7 and 8).

* ``probe`` exits 1 when a probe errored (every probe of a matrix whose images are not built), so a nightly
  never goes green on probes that measured nothing; skips (a GPU probe on a CPU host) stay exit 0.
* ``probe --local`` records under the identity of the environment it ran in (``local-...``, derived from the
  versions read there, stable, carried in each record as evidence), never under a matrix stack's id; with
  ``--only STACK`` it refuses (exit 2) when the environment is not that stack, naming each difference.
* A run cut short says so: its ``run.json`` names why it ended and how many probes it planned, its
  ``planned.json`` which; every report prints "interrupted: 1 of 2 probes ran (run <id>; ...)" and the cells of
  the probes that never ran read "not run (run interrupted)", unless a measurement or a later run says more.
"""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.records import Outcome, PlannedJob, Provenance, ResultRecord, Status, Tier
from stackforge.plan.planner import plan_file
from stackforge.probes.local_env import LOCAL_PREFIX, LocalStack, pin_differences
from stackforge.results.store import (
    end_run_early,
    finish_run,
    load_results,
    read_run_info,
    start_run,
    write_record,
)

REPO = Path(__file__).resolve().parent.parent
TARGET = "rtx-pro-6000-x8-pcie"
#: One CUDA 13.1 wheels stack (it has nvcc 13.1), on this interpreter's Python (``--local`` runs it here).
MATRIX = """\
schema: 1
targets: [rtx-pro-6000-x8-pcie]
defaults: {python: "PYTHON", flavour: wheels, os: debian12, cuda: "13.1"}
include:
  - {torch: "2.14.1", flashinfer: "0.7.2", sglang: "0.5.23"}
""".replace("PYTHON", f"{sys.version_info.major}.{sys.version_info.minor}")
FEATURES = ("--feature", "torch-kernels", "--feature", "kernel-arch-coverage")


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX)
    return path


def the_stack(matrix: Path):
    plan = plan_file(matrix)
    (stack,) = plan.kept_stacks()
    return stack, plan.cells_for(stack)[0].derived


# ------------------------------------------------------------------------------------------ exit 1 on errors


class NoImages:
    """An engine that holds no image of any stack (nothing was built) and has no GPU runtime."""

    class images:   # noqa: N801 - the Docker SDK's attribute name
        @staticmethod
        def list(filters=None):
            return []

    @staticmethod
    def info():
        return {"Runtimes": {"runc": {}}}


def probe_without_images(monkeypatch, matrix: Path, results: Path, *extra: str):
    monkeypatch.setattr("stackforge.cli.probe.connect_engine", lambda: NoImages())
    return CliRunner().invoke(cli, ["probe", "--matrix", str(matrix), "--results", str(results), *extra])


def test_probe_exits_1_when_every_probe_errored_for_lack_of_an_image(monkeypatch, matrix, tmp_path):
    result = probe_without_images(monkeypatch, matrix, tmp_path / "results", *FEATURES)
    assert result.exit_code == 1, result.output
    assert "summary: 2 error" in result.stdout
    assert "stackforge: error: 2 of 2 probe(s) errored" in result.output
    assert "no image built for stack" in result.output
    assert "Traceback" not in result.output


def test_probe_skips_on_a_cpu_host_stay_exit_0(monkeypatch, matrix, tmp_path):
    """Runtime probes on a host without GPUs of the target's arch skip where they are scheduled: nothing errored."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-nvidia-smi"))   # no GPUs, also on a GPU machine
    result = probe_without_images(monkeypatch, matrix, tmp_path / "results", "--tier", "runtime",
                                  "--feature", "p2p-access")
    assert result.exit_code == 0, result.output
    assert "skip" in result.stdout and "error" not in result.stdout


@pytest.mark.docker
def test_probe_exits_1_against_a_real_engine_without_the_images(docker_client, tmp_path):
    """The same on the real engine: a stack no image is labelled with (torch 2.13.0 on Python 3.12 wheels: in no
    shipped matrix, and no test builds it)."""
    unbuilt = tmp_path / "unbuilt.yaml"
    unbuilt.write_text('schema: 1\ntargets: [rtx-pro-6000-x8-pcie]\n'
                       'defaults: {python: "3.12", flavour: wheels, os: debian12, cuda: "13.1"}\n'
                       'include:\n  - {torch: "2.13.0", flashinfer: "0.6.18", sglang: "0.5.20"}\n')
    result = CliRunner().invoke(cli, ["probe", "--matrix", str(unbuilt), "--results", str(tmp_path / "r"),
                                      "--feature", "torch-kernels"])
    assert result.exit_code == 1, result.output
    assert "1 of 1 probe(s) errored" in result.output


# ------------------------------------------------------------------------------------------ probe --local


def fake_environment(tmp_path: Path, *, torch: str, torch_cuda: str | None, flashinfer: str, sglang: str,
                     kernel: tuple[str, str], nvcc: str | None, sleep_for: str = "") -> Path:
    """An interpreter whose environment has these distributions installed (metadata and torch/version.py) and
    this nvcc first on its search path; ``sleep_for``: a probe script it sleeps in instead of running."""
    site = tmp_path / "env-site"
    for name, version in (("torch", torch), ("flashinfer_python", flashinfer), ("sglang", sglang),
                          (kernel[0].replace("-", "_"), kernel[1])):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text(f"__version__ = {torch!r}\ncuda: str | None = {torch_cuda!r}\n")
    cuda_home = tmp_path / "env-cuda"
    (cuda_home / "bin").mkdir(parents=True)
    if nvcc:
        fake_nvcc = cuda_home / "bin" / "nvcc"
        fake_nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {nvcc}, V{nvcc}.80'\n")
        fake_nvcc.chmod(0o755)
    python = tmp_path / "env-python"
    sleep = f'case "$1" in *{sleep_for}) exec sleep 600;; esac\n' if sleep_for else ""
    python.write_text(f"#!/bin/sh\n{sleep}export CUDA_HOME={cuda_home}\n"
                      f"export PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}}\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def stack_environment(tmp_path: Path, matrix: Path, **changes) -> Path:
    """An environment with exactly the matrix stack's pins, but for ``changes``."""
    stack, derived = the_stack(matrix)
    pins = {"torch": f"{stack.torch}+cu{derived.torch_cuda.replace('.', '')}", "torch_cuda": derived.torch_cuda,
            "flashinfer": stack.flashinfer, "sglang": stack.sglang,
            "kernel": (derived.kernel_package, derived.kernel_version), "nvcc": stack.cuda}
    return fake_environment(tmp_path, **{**pins, **changes})


def local_probe(python: Path, matrix: Path, results: Path, *extra: str):
    return CliRunner().invoke(cli, ["probe", "--local", "--python", str(python), "--matrix", str(matrix),
                                    "--tier", "runtime", "--feature", "p2p-access", "--results", str(results),
                                    *extra])


def written(results: Path) -> list[ResultRecord]:
    return [ResultRecord.from_json(json.loads(p.read_text()), path=str(p))
            for p in sorted(results.glob("*/*/*/*.json"))]


def test_local_records_go_under_the_environments_own_identity(tmp_path, matrix):
    """Never under the matrix's stack id (that was the bug: the host's nvcc 13.0 filed under a no-nvcc stack);
    the id is stable for the same environment, differs for another, and the record carries what was read."""
    stack, _ = the_stack(matrix)
    python = fake_environment(tmp_path, torch="2.9.1+cu128", torch_cuda="12.8", flashinfer="0.6.3", sglang="0.5.9",
                              kernel=("sgl-kernel", "0.3.21"), nvcc="13.0")
    first = local_probe(python, matrix, tmp_path / "r1")
    again = local_probe(python, matrix, tmp_path / "r2")
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    (record,) = written(tmp_path / "r1")
    (second,) = written(tmp_path / "r2")
    assert record.stack_id != stack.id and record.stack_id.startswith(LOCAL_PREFIX)
    assert record.stack_id == second.stack_id
    assert record.stack_id.startswith("local-py") and "torch2.9.1+cu128" in record.stack_id
    assert record.stack["local"] is True
    assert (record.stack["torch"], record.stack["cuda"], record.stack["flashinfer"], record.stack["sglang"],
            record.stack["kernel"], record.stack["nvcc"]) == ("2.9.1+cu128", "12.8", "0.6.3", "0.5.9",
                                                               "sgl-kernel==0.3.21", "13.0")
    assert record.stack["read"]["nvcc_line"].startswith("Cuda compilation tools, release 13.0")
    assert record.stack["read"]["python"] == ".".join(map(str, sys.version_info[:3]))

    other = tmp_path / "other"
    other.mkdir()
    changed = fake_environment(other, torch="2.9.1+cu128", torch_cuda="12.8", flashinfer="0.6.3", sglang="0.5.9",
                               kernel=("sgl-kernel", "0.3.21"), nvcc="12.9")
    assert local_probe(changed, matrix, tmp_path / "r3").exit_code == 0
    (third,) = written(tmp_path / "r3")
    assert third.stack_id != record.stack_id, "another nvcc is another environment"


def test_local_only_refuses_an_environment_that_is_not_that_stack(tmp_path, matrix):
    stack, derived = the_stack(matrix)
    python = stack_environment(tmp_path, matrix, torch="2.9.1+cu128", torch_cuda="12.8", nvcc="13.0")
    result = local_probe(python, matrix, tmp_path / "results", "--only", stack.id)
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"stackforge: error: --local --only {stack.id}: this environment is not that stack")
    assert f"torch 2.9.1+cu128 installed, stack pins {stack.torch}" in line
    assert f"torch built for CUDA 12.8, stack's torch is for CUDA {derived.torch_cuda}" in line
    assert f"nvcc 13.0 here, stack has nvcc {stack.cuda}" in line
    assert "(hint: " in line and "local-" in line
    assert not (tmp_path / "results").exists() or written(tmp_path / "results") == [], "nothing recorded"


def test_local_only_runs_when_the_environment_is_that_stack(tmp_path, matrix):
    stack, _ = the_stack(matrix)
    python = stack_environment(tmp_path, matrix)
    result = local_probe(python, matrix, tmp_path / "results", "--only", stack.id)
    assert result.exit_code == 0, result.output
    (record,) = written(tmp_path / "results")
    assert record.stack_id.startswith(LOCAL_PREFIX) and record.stack["torch"].startswith(stack.torch)


def test_pin_differences_compare_versions_not_spellings(matrix):
    stack, derived = the_stack(matrix)
    same = LocalStack(python=f"{stack.python}.7", torch=f"{stack.torch}.0+cu130", torch_cuda=derived.torch_cuda,
                      flashinfer=stack.flashinfer, sglang=stack.sglang,
                      kernel=f"{derived.kernel_package}=={derived.kernel_version}", nvcc=stack.cuda)
    assert pin_differences(same, stack, derived) == ()
    bare = LocalStack(python="3.9.2", torch=None, torch_cuda=None, flashinfer=None, sglang=None, kernel=None,
                      nvcc=None)
    found = pin_differences(bare, stack, derived)
    assert f"python 3.9 here, stack pins {stack.python}" in found
    assert f"torch not installed, stack pins {stack.torch}" in found
    assert f"{derived.kernel_package} not installed, stack pins {derived.kernel_version}" in found
    assert f"nvcc not found here, stack has nvcc {stack.cuda}" in found


# ------------------------------------------------------------------------------------------ partial runs


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_a_run_interrupted_after_its_first_probe_reads_as_partial_in_every_report(tmp_path, matrix):
    """SIGTERM while the second of two probes runs: run.json says why it ended, the reports say '1 of 2 probes
    ran' and the probe that never ran reads 'not run (run interrupted)'."""
    python = fake_environment(tmp_path, torch="2.9.1+cu128", torch_cuda="12.8", flashinfer="0.6.3", sglang="0.5.9",
                              kernel=("sgl-kernel", "0.3.21"), nvcc="13.0", sleep_for="kernel_cubins.py")
    results = tmp_path / "results"
    process = subprocess.Popen([sys.executable, "-m", "stackforge", "probe", "--matrix", str(matrix), "--local",
                                "--python", str(python), *FEATURES, "-j", "2", "--timeout", "300",
                                "--results", str(results)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: list(results.glob("*/*/*/gate.torch.arch-list.json")) or process.poll() is not None,
                 "the first probe's record")
        time.sleep(0.5)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, (out, err)
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    info = read_run_info(run_dir)
    assert (info.finished_at, info.planned, info.ended) == (None, 2, "interrupted by SIGTERM")
    (partial,) = load_results(results).partial
    assert [job.probe for job in partial.not_run] == ["gate.kernels.arch-coverage"]
    line = f"interrupted: 1 of 2 probes ran (run {run_dir.name}; interrupted by SIGTERM)"
    assert partial.line() == line

    report = CliRunner().invoke(cli, ["matrix", "--results", str(results), "--no-plan", "--format", "json"])
    assert report.exit_code == 0, report.output
    assert f"stackforge: warning: {line}" in report.output
    (row,) = json.loads(report.stdout)["rows"]
    cells = {cell["feature"]: cell for cell in row["cells"]}
    assert cells["kernel-arch-coverage"]["reason"] == "not run (run interrupted)"
    assert cells["kernel-arch-coverage"]["source"] == "none"            # nothing measured it
    assert cells["torch-kernels"]["reason"] != "not run (run interrupted)"
    text = CliRunner().invoke(cli, ["matrix", "--results", str(results), "--no-plan"]).stdout
    assert re.search(r"kernel-arch-coverage\s+not run\s*$", text, re.M), text
    for command in (["deadends", "--target", TARGET], ["pick", "--target", TARGET],
                    ["upgrade", "--target", TARGET, "--from-cuda", "12.8", "--to-cuda", "13.1"]):
        told = CliRunner().invoke(cli, [*command, "--results", str(results), "--matrix", str(matrix)])
        assert line in told.output, (command, told.output)


def planned(stack_id: str, probe: str, feature: str) -> PlannedJob:
    return PlannedJob(stack_id=stack_id, stack={"cuda": "13.1"}, target=TARGET, probe=probe, feature=feature,
                      tier=Tier.GATE)


def record(run_id: str, stack_id: str, probe: str, feature: str, status: Status, created_at: str) -> ResultRecord:
    return ResultRecord(run_id=run_id, stack_id=stack_id, stack={"cuda": "13.1"}, target=TARGET, probe=probe,
                        feature=feature, tier=Tier.GATE, outcome=Outcome(status, f"{status.value} said"),
                        provenance=Provenance(), created_at=created_at)


def test_not_run_never_hides_a_measurement_and_a_finished_run_is_not_partial(tmp_path):
    """An older run measured both probes; a newer one planned both, recorded one, was interrupted: the measured
    cell of the probe it never reached stays, the report still names the partial run; a finished run is not."""
    from stackforge.report.evidence import with_not_run

    results = tmp_path / "results"
    old = start_run(results, command=["stackforge", "probe"], run_id="20260101T000000Z-aaaaaa")
    write_record(old, record(old.name, "s", "p.one", "f-one", Status.PASS, "2026-01-01T00:00:01+00:00"))
    write_record(old, record(old.name, "s", "p.two", "f-two", Status.FAIL, "2026-01-01T00:00:02+00:00"))
    finish_run(old)
    new = start_run(results, command=["stackforge", "probe"], run_id="20260102T000000Z-bbbbbb",
                    jobs=[planned("s", "p.one", "f-one"), planned("s", "p.two", "f-two"),
                          planned("t", "p.one", "f-one")])
    write_record(new, record(new.name, "s", "p.one", "f-one", Status.SKIP, "2026-01-02T00:00:01+00:00"))
    end_run_early(new, "interrupted by SIGINT")
    loaded = load_results(results)
    warnings: list[str] = []
    records = {r.key: r for r in with_not_run(loaded, warnings.append)}
    assert records[("s", TARGET, "p.two")].outcome.status is Status.FAIL, "the measurement stays"
    assert records[("s", TARGET, "p.one")].outcome.status is Status.PASS
    assert records[("t", TARGET, "p.one")].outcome.reason == "not run (run interrupted)"
    assert warnings == [f"interrupted: 1 of 3 probes ran (run {new.name}; interrupted by SIGINT)"]
    finish_run(new)
    assert load_results(results).partial == ()


def test_a_run_that_recorded_no_end_is_unfinished(tmp_path):
    """Killed too hard to say (SIGKILL), or still running: 'unfinished', and its missing probes 'not run'."""
    results = tmp_path / "results"
    run = start_run(results, command=["stackforge", "probe"], jobs=[planned("s", "p.one", "f-one")])
    (partial,) = load_results(results).partial
    assert partial.line() == (f"unfinished: 0 of 1 probes ran (run {run.name}; it recorded no end: killed, or still "
                              "running)")
    assert partial.not_run_reason() == "not run (run unfinished)"


def test_a_campaign_that_ends_on_an_error_says_so(tmp_path):
    from stackforge.core.errors import DockerUnavailableError
    from stackforge.jobs.campaign import campaign_run
    from stackforge.results.store import ResultsFolder

    with pytest.raises(DockerUnavailableError):
        with campaign_run(ResultsFolder(tmp_path), matrix_source="m.yaml", shard=None, stacks=1,
                          jobs=4) as (run_dir, _):
            raise DockerUnavailableError("the engine went away")
    info = read_run_info(run_dir)
    assert (info.finished_at, info.planned, info.ended) == (None, 4, "ended early: the engine went away")
    (partial,) = load_results(tmp_path).partial
    assert partial.line() == (f"ended early: 0 of 4 jobs ran (run {run_dir.name}; ended early: the engine went away)")
