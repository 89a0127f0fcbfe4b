"""A run's host check (``host.json``) reaches the reports: a GPU failure of a run whose host check failed is
the host's (undecided), in ``matrix`` and ``deadends`` read from a results folder, not only in build_matrix."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from matrix_fixtures import CU128, CU131, seed_workspace

from stackforge.cli import cli
from stackforge.results.store import HOST_FILE, load_results, write_host_facts

WEDGED = {"check": {"status": "fail", "reason": "persistence mode off and Fabric Manager stopped"}}


def _cell(folder: Path, feature: str) -> dict:
    result = CliRunner().invoke(cli, ["matrix", "--results", str(folder / "results"), "--plan",
                                      str(folder / "plan.json"), "--format", "json"])
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout)["rows"] if r["stack_id"] == CU128)
    return next(c for c in row["cells"] if c["feature"] == feature)


def test_a_failed_host_check_makes_the_runs_gpu_failures_undecided(tmp_path: Path) -> None:
    folder = seed_workspace(tmp_path)
    assert _cell(folder, "nccl-graph-tree")["status"] == "timeout"           # the stack's, without host facts
    write_host_facts(folder / "results" / "run-a", WEDGED)
    assert load_results(folder / "results").hosts["run-a"]["check"]["status"] == "fail"
    cell = _cell(folder, "nccl-graph-tree")
    assert cell["status"] == "undecided"
    assert "host check of this run failed (persistence mode off" in json.dumps(cell)
    dead = CliRunner().invoke(cli, ["deadends", "--results", str(folder / "results"), "--plan",
                                    str(folder / "plan.json"), "--format", "json"])
    assert dead.exit_code == 0, dead.output
    dead_on = {d["feature"]: {s["stack_id"] for s in d["dead_on"]} for d in json.loads(dead.stdout)["dead_ends"]}
    assert CU128 not in dead_on.get("nccl-graph-tree", set())


def test_a_passing_host_check_blames_nothing(tmp_path: Path) -> None:
    folder = seed_workspace(tmp_path)
    write_host_facts(folder / "results" / "run-a", {"check": {"status": "warn", "reason": "persistence mode off"}})
    assert _cell(folder, "nccl-graph-tree")["status"] == "timeout"


def test_a_corrupt_host_file_is_named_not_skipped(tmp_path: Path) -> None:
    folder = seed_workspace(tmp_path)
    (folder / "results" / "run-a" / HOST_FILE).write_text("[1, 2", encoding="utf-8")
    result = CliRunner().invoke(cli, ["matrix", "--results", str(folder / "results"), "--plan",
                                      str(folder / "plan.json")])
    assert result.exit_code == 2
    assert HOST_FILE in result.stderr and "corrupt JSON" in result.stderr


def test_pick_and_upgrade_read_the_host_check_too(tmp_path: Path) -> None:
    folder = seed_workspace(tmp_path)
    args = ["--results", str(folder / "results"), "--plan", str(folder / "plan.json"), "--format", "json"]

    def upgrade_change() -> str:
        result = CliRunner().invoke(cli, ["upgrade", CU128, CU131, *args])
        assert result.exit_code == 0, result.output
        return next(f for f in json.loads(result.stdout)["features"] if f["feature"] == "nccl-graph-tree")["from"]

    def pick_cell() -> str:
        result = CliRunner().invoke(cli, ["pick", "--only", CU128, "--require", "nccl-graph-tree", *args])
        return result.stdout

    assert upgrade_change()["status"] == "timeout"
    assert "host check of this run failed" not in pick_cell()
    write_host_facts(folder / "results" / "run-a", WEDGED)
    assert upgrade_change()["status"] == "undecided"
    assert "host check of this run failed" in pick_cell()
