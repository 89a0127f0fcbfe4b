"""Unknown targets and features are exit 2 with the valid names, never an empty answer (issue #11, 2).

A typo'd ``matrix diff --target`` used to report ``0 regression(s)`` and exit 0: the nightly
regression gate silently off. ``matrix --feature nosuch`` likewise drew an empty column.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from matrix_fixtures import CU128, TARGET, plan_dict, record

from stackforge.cli import cli
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import build_matrix
from stackforge.report.compat_matrix_write import write_matrix_json
from stackforge.results.store import finish_run, start_run, write_record

TYPO = "rtx-pro-6000-x8-pice"
BEFORE = [record(CU128, "flashinfer-jit", "pass", tier="gate", run_id="a")]
AFTER = [record(CU128, "flashinfer-jit", "fail", tier="gate", run_id="b")]   # a regression


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """Two run folders with one regression between them, and the same two runs as matrix JSON."""
    monkeypatch.chdir(tmp_path)
    plan = Plan.from_json(plan_dict())
    for name, records in (("a", BEFORE), ("b", AFTER)):
        run_dir = start_run(tmp_path / "results", command=["stackforge", "probe"], run_id=name)
        for rec in records:
            write_record(run_dir, rec)
        finish_run(run_dir)
        (tmp_path / f"{name}.json").write_text(write_matrix_json(build_matrix(records, plan, TARGET)))
    return tmp_path


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("inputs", [("results/a", "results/b"), ("a.json", "b.json")])
def test_diff_with_an_unknown_target_is_exit_2_with_the_valid_ones(runs, inputs):
    result = _invoke("matrix", "diff", *inputs, "--target", TYPO)
    assert result.exit_code == 2, result.output
    assert "regression" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"stackforge: error: unknown target '{TYPO}'")
    assert f"targets there: {TARGET}" in lines[0]


@pytest.mark.parametrize("inputs", [("results/a", "results/b"), ("a.json", "b.json")])
def test_diff_with_the_right_target_still_gates(runs, inputs):
    result = _invoke("matrix", "diff", *inputs, "--target", TARGET)
    assert result.exit_code == 1, result.output
    assert "1 regression" in result.stdout


def test_matrix_with_an_unknown_feature_is_exit_2_with_the_valid_ones(runs):
    (runs / "plan.json").write_text(json.dumps(plan_dict()))
    result = _invoke("matrix", "--results", "results/b", "--plan", "plan.json", "--feature", "nosuch")
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line.startswith("stackforge: error: unknown feature(s): nosuch; known: ") and "\n" not in line
    assert "flashinfer-jit" in line and "flashinfer-ar-fusion" in line


def test_matrix_features_known_to_the_rules_or_the_records_are_accepted(runs):
    (runs / "plan.json").write_text(json.dumps(plan_dict()))
    result = _invoke("matrix", "--results", "results/b", "--plan", "plan.json", "--format", "json",
                     "--feature", "flashinfer-jit", "--feature", "ep-a2a")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["features"] == ["flashinfer-jit", "ep-a2a"]


def test_matrix_accepts_a_feature_only_a_probe_decides(runs):
    """nccl-global-tree has a probe and no rule: asking for its column before any record is no typo."""
    (runs / "plan.json").write_text(json.dumps(plan_dict()))
    result = _invoke("matrix", "--results", "results/b", "--plan", "plan.json", "--format", "json",
                     "--feature", "nccl-global-tree")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["features"] == ["nccl-global-tree"]


def test_deadends_with_an_unknown_target_is_exit_2_with_the_valid_ones(runs):
    result = _invoke("deadends", "--results", "results/b", "--no-plan", "--target", TYPO)
    assert result.exit_code == 2, result.output
    assert "no results or plan entries for target" in result.stderr
    assert TARGET in result.stderr


def test_a_plan_json_from_an_older_stackforge_is_refused_with_how_to_remake_it(runs):
    """Its derived.min_driver meant the toolkit's GA driver; without driver_floor, pick and the html
    would show another floor than `plan` does now."""
    old = plan_dict()
    for cell in old["cells"]:
        del cell["driver_floor"]
    (runs / "old-plan.json").write_text(json.dumps(old))
    for command in (("pick", "--target", TARGET), ("matrix", "--format", "html")):
        result = _invoke(*command, "--results", "results/b", "--plan", "old-plan.json")
        assert result.exit_code == 2, result.output
        line = result.stderr.strip()
        assert "\n" not in line and "written by an older stackforge" in line, line
        assert "re-run `stackforge plan --json`" in line
