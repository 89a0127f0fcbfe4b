"""One driver floor everywhere; pick's --cuda/--only and the plan it is given; conflicting options.

Through the real CLI entry point (click's CliRunner) on the shipped compat data and default matrix.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from matrix_fixtures import CU128, CU131, DIGESTS, TARGET, plan_dict, record, seed_records, seed_workspace

from stackforge.cli import cli
from stackforge.core.data import resolve_matrix_path
from stackforge.core.errors import NothingQualifiesError
from stackforge.plan.planner import Plan, plan_file
from stackforge.report.pick import pick

WHEELS_131 = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env=env or {"COLUMNS": "200"})


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A results folder with one run of the seed records, and the seed plan as JSON."""
    monkeypatch.chdir(tmp_path)
    seed_workspace(tmp_path)
    return tmp_path


# ----------------------------------------------------------------------------- one driver floor (#6)

def test_plan_header_explain_json_and_pick_agree_on_the_driver_floor():
    table = invoke("plan", "--cuda", "13.1")
    row = next(line for line in table.output.splitlines() if line.startswith(WHEELS_131))
    assert ">= 580 " in row and "590.44.01" not in row
    explain = invoke("plan", "--explain", WHEELS_131).output
    assert "  driver          >= 580\n" in explain
    assert "CUDA 13.x minor-version compatibility" in explain
    # The toolkit's bundled driver is shown as what it is, not as a floor.
    assert "toolkit driver  590.44.01 (bundled with CUDA 13.1; not required" in explain
    cell = next(c for c in json.loads(invoke("plan", "--json", "--cuda", "13.1").output)["cells"]
                if c["stack_id"] == WHEELS_131)
    assert cell["driver_floor"]["version"] == "580"
    assert cell["derived"]["min_driver"] == "580" and cell["derived"]["toolkit_driver"] == "590.44.01"


def test_pick_with_the_help_example_driver_does_not_block_cuda_13_1():
    # `pick --help` shows --driver 580.95.05: a 13.x driver, enough for every 13.1 stack.
    plan = Plan.from_json(plan_file(resolve_matrix_path(None), cuda="13.1").to_json())
    records = [record(WHEELS_131, "flashinfer-jit", "pass", digest="sha256:" + "d" * 64)]
    chosen = pick(records, plan, TARGET, ["flashinfer-jit"], driver="580.95.05").picked()
    assert chosen.candidate.stack_id == WHEELS_131
    assert any("driver 580.95.05 meets >= 580" in line for line in chosen.why())
    with pytest.raises(NothingQualifiesError, match="driver 575.51 is too old: this stack needs >= 580"):
        pick(records, plan, TARGET, ["flashinfer-jit"], driver="575.51").picked()


def test_driver_floor_is_data_with_a_source():
    from stackforge.plan.derive import load_tables
    tables = load_tables()
    assert tables.cuda_driver_floor["13"] == "580" and tables.cuda_driver_floor["12"] == "525"
    assert "minor-version-compatibility" in tables.sources["cuda_driver_floor"][0].url


# ----------------------------------------------------------------------------- pick --cuda / --only / plan (#7)

def test_pick_cuda_filter(workspace):
    result = invoke("pick", "--plan", "plan.json", "--cuda", "12.8")
    assert result.exit_code == 0, result.output
    assert f"picked {CU128}" in result.stderr


def test_pick_only_and_unknown_only(workspace):
    result = invoke("pick", "--plan", "plan.json", "--only", CU128)
    assert result.exit_code == 0, result.output
    assert f"picked {CU128}" in result.stderr
    bad = invoke("pick", "--plan", "plan.json", "--only", "cu999-nothing")
    assert bad.exit_code == 2
    assert bad.stderr.startswith("stackforge: error: unknown stack id(s) for --only: cu999-nothing; valid: ")
    assert CU131 in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_pick_cuda_that_no_stack_has_lists_the_toolkits(workspace):
    bad = invoke("pick", "--plan", "plan.json", "--cuda", "99.9")
    assert bad.exit_code == 2
    assert "no stack with CUDA 99.9" in bad.stderr and "12.8, 13.0, 13.1" in bad.stderr


def test_pick_respects_the_plan_it_is_given(workspace):
    # A plan with only the CUDA 12.8 stack: the (faster) measured 13.1 stack is not in it.
    plan = plan_dict()
    plan["cells"] = [c for c in plan["cells"] if c["stack_id"] == CU128]
    (workspace / "only128.json").write_text(json.dumps(plan))
    result = invoke("pick", "--plan", "only128.json")
    assert result.exit_code == 0, result.output
    assert f"picked {CU128}" in result.stderr and result.stdout.strip() != DIGESTS[CU131]


def test_scope_without_plan_keeps_measured_stacks():
    from stackforge.report.pick import Scope
    chosen = pick(seed_records(), Plan.empty(), TARGET, scope=Scope(plan_only=False)).picked()
    assert chosen.candidate.stack_id == CU131


# ----------------------------------------------------------------------------- conflicting options (#10)

@pytest.mark.parametrize("args, words", [
    (["plan", "--json", "--explain", WHEELS_131], "--json and --explain cannot be combined"),
    (["plan", "--explain", WHEELS_131, "--preflight"], "--explain and --preflight cannot be combined"),
    (["plan", "--cache-dir", "/tmp/x"], "--cache-dir is only used with --preflight"),
    (["plan", "--explain", WHEELS_131, "--explain", "x"], "--explain was given 2 times; it takes one value"),
    (["pick", "--target", "a", "--target", "b"], "--target was given 2 times"),
    (["matrix", "diff", "--target", "a", "--target", "b", "x", "y"], "--target was given 2 times"),
    (["pick", "--plan", "plan.json", "--no-plan"], "--no-plan and --plan cannot be combined"),
    (["deadends", "--plan", "plan.json", "--matrix", "default"], "--plan and --matrix cannot be combined"),
    (["probe", "--python", "/usr/bin/python3"], "--python is only used with --local"),
    (["bench", "--local", "--builds", "out"], "--local and --builds cannot be combined"),
])
def test_conflicting_or_ignored_options_are_one_line_errors(args, words):
    result = invoke(*args)
    assert result.exit_code == 2
    assert result.output.startswith(f"stackforge: error: {words}")
    assert len(result.output.strip().splitlines()) == 1


def test_repeated_cuda_keeps_every_value():
    result = invoke("plan", "--json", "--cuda", "13.1", "--cuda", "12.8")
    cudas = {c["stack"]["cuda"] for c in json.loads(result.output)["cells"]}
    assert cudas == {"12.8", "13.1"}


# ----------------------------------------------------------------------------- terminal width (#12)

def test_plan_fits_80_columns_and_keeps_ids_whole():
    for args in (["plan"], ["plan", "--explain", WHEELS_131]):
        result = invoke(*args, env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        long_lines = [line for line in result.output.splitlines() if len(line) > 80]
        assert long_lines == []
    table = invoke("plan", env={"COLUMNS": "80"}).output
    assert f"\n{WHEELS_131}\n" in table


def test_plan_without_a_terminal_keeps_full_reasons():
    # No COLUMNS and no terminal (a file or a pipe): nothing wraps and nothing is cut with "...".
    result = CliRunner().invoke(cli, ["plan"], env={"COLUMNS": ""})
    pruned = [line for line in result.output.splitlines() if line.startswith("cu128-torch2.9.1-fi0.6.3-sgl0.5.23")]
    assert pruned and "stackforge does not compose." in pruned[0]
    assert "..." not in result.output


def test_predicted_dead_ends_read_as_words():
    table = invoke("plan", "--cuda", "13.1").output
    assert "unavailable: flashinfer-ar-fusion" in table and "xflashinfer" not in table


# ----------------------------------------------------------------------------- nothing selected (#13)

def test_plan_cuda_no_stack_has_is_exit_2_with_the_matrix_values():
    result = invoke("plan", "--cuda", "99.9")
    assert result.exit_code == 2
    assert result.output.startswith("stackforge: error: no stack of this matrix has CUDA 99.9; its stacks "
                                    "have CUDA 12.8, 13.1")


def test_empty_axes_is_exit_2_with_file_and_line(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("schema: 1\nname: empty\ntargets: [rtx-pro-6000-x8-pcie]\naxes: {}\n")
    result = invoke("plan", "--matrix", str(path))
    assert result.exit_code == 2
    assert "the matrix has no stacks" in result.output and "empty.yaml:4" in result.output


def test_shipped_files_cite_only_matrices_that_exist():
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    cited = {(path.name, ref) for folder in ("matrices", "compat") for path in (root / folder).rglob("*.yaml")
             for ref in re.findall(r"matrices/[\w.-]+\.yaml", path.read_text(encoding="utf-8"))}
    assert [c for c in cited if not (root / c[1]).is_file()] == []
