"""Golden tests of ``stackforge upgrade`` on the fixed workspace tests/data/upgrade (see tests/upgrade_fixtures.py).

A change to how an upgrade is judged or written shows up here as a reviewable diff of the report.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from matrix_fixtures import CU128, TARGET
from upgrade_fixtures import UPGRADE_DATA, write_workspace

from stackforge.cli import cli

GOLDEN_DIR = Path(__file__).resolve().parent / "upgrade"


def upgrade(workspace: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["upgrade", *args, "--target", TARGET, "--results", str(workspace / "results"),
                                      "--plan", str(workspace / "plan.json"), "--builds", str(workspace / "out")])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_cuda_128_to_131_md(check_golden):
    check_golden(GOLDEN_DIR / "cu128-to-cu131.md",
                 upgrade(UPGRADE_DATA, "--from-cuda", "12.8", "--to-cuda", "13.1", "--format", "md"))


def test_cuda_128_to_131_one_screen(check_golden):
    text = upgrade(UPGRADE_DATA, "--from-cuda", "12.8", "--to-cuda", "13.1")
    assert max(len(line) for line in text.splitlines()) <= 200
    check_golden(GOLDEN_DIR / "cu128-to-cu131.txt", text)


def test_cuda_128_to_131_json(check_golden):
    text = upgrade(UPGRADE_DATA, "--from-cuda", "12.8", "--to-cuda", "13.1", "--format", "json")
    assert json.loads(text)["schema"] == "stackforge.upgrade"
    check_golden(GOLDEN_DIR / "cu128-to-cu131.json", text)


def test_from_side_predicted_only_md(check_golden, tmp_path):
    workspace = write_workspace(tmp_path, without=(CU128,))
    check_golden(GOLDEN_DIR / "cu128-predicted-only-to-cu131.md",
                 upgrade(workspace, "--from-cuda", "12.8", "--to-cuda", "13.1", "--format", "md"))
