"""matrix, deadends and pick from predictions alone, before anything is probed (issue #11, 5).

Without a results folder these commands used to refuse to run. Now they run from the plan, say
"predictions only — no probe results", keep every cell labelled predicted, and ``pick`` never
presents a predicted stack as a known-good image (exit 4, nothing on stdout).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from matrix_fixtures import CU128, CU130, CU131, TARGET, plan_dict

from stackforge.cli import cli

SAYS = "predictions only — no probe results"


@pytest.fixture
def plan_only(tmp_path, monkeypatch):
    """A plan file and no results folder at all."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan_dict()))
    return tmp_path


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_matrix_runs_from_predictions_and_says_so(plan_only, fmt):
    result = _invoke("matrix", "--plan", "plan.json", "--format", fmt)
    assert result.exit_code == 0, result.output
    assert SAYS in result.stdout
    assert SAYS in result.stderr   # and the warning line, for scripts that only show stderr


def test_every_cell_of_a_predictions_only_matrix_is_predicted_or_untested(plan_only):
    result = _invoke("matrix", "--plan", "plan.json", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["predictions_only"] is True and data["runs"] == []
    cells = [cell for row in data["rows"] for cell in row["cells"]]
    assert cells and {cell["source"] for cell in cells} <= {"predicted", "none"}
    assert not any(cell.get("measurements") for cell in cells)
    by_stack = {row["stack_id"]: {c["feature"]: c for c in row["cells"]} for row in data["rows"]}
    assert by_stack[CU128]["flashinfer-ar-fusion"]["status"] == "unavailable"
    assert by_stack[CU128]["flashinfer-ar-fusion"]["source"] == "predicted"


@pytest.mark.parametrize("fmt", ["md", "text", "json"])
def test_deadends_runs_from_predictions_and_says_so(plan_only, fmt):
    result = _invoke("deadends", "--plan", "plan.json", "--format", fmt)
    assert result.exit_code == 0, result.output
    if fmt == "json":
        data = json.loads(result.stdout)
        assert data["predictions_only"] is True
        assert {e["source"] for d in data["dead_ends"] for e in d["dead_on"]} == {"predicted"}
    else:
        assert SAYS in result.stdout and "flashinfer-ar-fusion" in result.stdout


def test_pick_never_presents_a_prediction_as_known_good(plan_only):
    result = _invoke("pick", "--plan", "plan.json", "--require", "flashinfer-jit")
    assert result.exit_code == 4, result.output
    assert result.stdout == ""                       # no image reference to capture
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"stackforge: error: no image qualifies for target {TARGET}: {SAYS}")
    # The stacks the rules allow are named as the ones to build and probe, newest first.
    assert f"the rules allow 3 stack(s), newest first: {CU131}, {CU130}, {CU128}" in error


def test_pick_names_only_stacks_no_rule_or_driver_rules_out(plan_only):
    result = _invoke("pick", "--plan", "plan.json", "--require", "torch-symm-mem")
    assert result.exit_code == 4, result.output
    assert "the rules allow 1 stack(s), newest first: " + CU131 + " (hint" in result.stderr
    result = _invoke("pick", "--plan", "plan.json", "--require", "torch-symm-mem", "--driver", "580.0")
    assert result.exit_code == 4 and "the rules, the plan or the driver rule out every stack" in result.stderr


def test_pick_json_with_predictions_only(plan_only):
    result = _invoke("pick", "--plan", "plan.json", "--format", "json")
    assert result.exit_code == 4, result.output
    data = json.loads(result.stdout)
    assert data["predictions_only"] is True and data["status"] == "nothing-qualifies" and data["exit_code"] == 4


def test_no_plan_and_no_results_is_still_an_error(plan_only):
    result = _invoke("matrix", "--no-plan")
    assert result.exit_code == 2 and "results folder does not exist" in result.stderr
