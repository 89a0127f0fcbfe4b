"""Golden test of ``stackforge plan --json`` on the shipped default matrix.

A change to a rule, a table or the matrix shows up here as a reviewable diff of the plan.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from stackforge.cli import cli

GOLDEN_DIR = Path(__file__).resolve().parent


def test_default_plan_json_matches_golden(check_golden):
    result = CliRunner().invoke(cli, ["plan", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    kept = [c["stack_id"] for c in payload["cells"] if c["status"] == "kept"]
    # Matrix order: the 13.1 include extends a cell of the axes in place; the two 12.8 flavours are
    # include entries of their own, added after the axes' cells.
    assert kept == ["cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12",
                    "cu128-torch2.9.1-fi0.6.3-sgl0.5.9-py312",
                    "cu128-torch2.9.1-fi0.6.3-sgl0.5.9-py311-wheels-debian12"]
    check_golden(GOLDEN_DIR / "plan" / "default.plan.json", result.output)


def test_the_plan_read_back_from_its_json_writes_the_same_json():
    """``Plan.from_json`` is the inverse of ``Plan.to_json``: the reports, pick and CI read a plan file
    into the same model the planner makes."""
    from stackforge.plan.planner import Plan

    data = json.loads((GOLDEN_DIR / "plan" / "default.plan.json").read_text(encoding="utf-8"))
    assert Plan.from_json(data, path="default.plan.json").to_json() == data
