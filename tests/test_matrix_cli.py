"""The matrix, diff, deadends, pick and results commands through the real CLI entry point."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from matrix_fixtures import CU128, CU130, CU131, DIGESTS, TARGET, record, seed_records, seed_workspace

from stackforge.cli import cli
from stackforge.core.records import RESULT_SCHEMA_VERSION
from stackforge.results.store import load_results, start_run, write_record


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A results folder with one run of the seed records, and the plan as JSON."""
    monkeypatch.chdir(tmp_path)
    seed_workspace(tmp_path)
    return tmp_path


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_matrix_md_to_stdout(workspace):
    result = invoke("matrix", "--plan", "plan.json", "--format", "md")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"### stackforge matrix · {TARGET}")
    assert "**Legend**" in result.stdout and "runs: run-a" in result.stdout
    assert invoke("matrix", "--plan", "plan.json", "--evidence").stdout == result.stdout


def test_matrix_fits_one_screen_by_default(workspace):
    result = invoke("matrix", "--plan", "plan.json")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("matrix ") and f" on {TARGET}: " in lines[0]
    assert any(line.startswith(f"  [1] ") for line in lines) and max(map(len, lines)) <= 200


@pytest.mark.parametrize("fmt, marker", [("html", "<!DOCTYPE html>"), ("json", '"schema": "stackforge.matrix"'),
                                         ("csv", "target,stack_id,plan_status,feature"), ("md", "| stack |")])
def test_matrix_formats_written_atomically(workspace, fmt, marker):
    out = workspace / "site" / f"matrix.{fmt}"
    result = invoke("matrix", "--plan", "plan.json", "--format", fmt, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert marker in out.read_text() and result.stdout == ""
    assert f"wrote {out}" in result.stderr
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_matrix_without_plan_file_plans_or_degrades(workspace):
    result = invoke("matrix", "--no-plan", "--format", "json")
    data = json.loads(result.stdout)
    assert {r["plan_status"] for r in data["rows"]} == {"unplanned"}
    # No --plan: the shipped planner runs; its targets differ from these records' only if the data does.
    result = invoke("matrix", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["target"]["name"] == TARGET


def test_corrupt_records_refuse_with_every_path(workspace):
    target_dir = workspace / "results" / "run-a" / CU131 / TARGET
    (target_dir / "torn.json").write_text('{"schema": "stackforge.resu')
    newer = dict(record(CU131, "x", "pass").to_json(), probe="newer", schema_version=RESULT_SCHEMA_VERSION + 1)
    (target_dir / "newer.json").write_text(json.dumps(newer))
    result = invoke("matrix", "--plan", "plan.json")
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("stackforge: error: 2 unusable result files in results:")
    assert str(Path("results/run-a") / CU131 / TARGET / "torn.json") in lines[0]
    assert "newer.json: result record schema_version 2 is newer than this stackforge understands (1)" in lines[0]
    assert "--skip-bad" in lines[0]

    skipped = invoke("matrix", "--plan", "plan.json", "--skip-bad")
    assert skipped.exit_code == 0
    assert "warning: --skip-bad: ignoring 2 unusable result files in results:" in skipped.stderr
    assert "torn.json" in skipped.stderr and "newer.json" in skipped.stderr
    assert "  [1] " in skipped.stdout


def test_bad_plan_file_is_a_one_line_error(workspace):
    (workspace / "bad.json").write_text("{nope")
    result = invoke("matrix", "--plan", "bad.json")
    assert result.exit_code == 2 and "bad.json: cannot read plan JSON" in result.stderr
    result = invoke("matrix", "--plan", "missing.json")
    assert result.exit_code == 2 and "plan file does not exist" in result.stderr


def test_deadends_command(workspace):
    result = invoke("deadends", "--plan", "plan.json", "--format", "md")
    assert result.exit_code == 0
    assert "- [ ] **torch-symm-mem** — DEAD END on 3 of 3 stacks" in result.stdout   # open: nothing unblocks it
    screen = invoke("deadends", "--plan", "plan.json").stdout                           # one screen by default
    assert "torch-symm-mem" in screen and "3/3 stacks" in screen and max(map(len, screen.splitlines())) <= 200
    full = invoke("deadends", "--plan", "plan.json", "--evidence").stdout
    assert "- [ ] **torch-symm-mem** — DEAD END on 3 of 3 stacks" in full
    data = json.loads(invoke("deadends", "--plan", "plan.json", "--format", "json").stdout)
    assert [d["feature"] for d in data["dead_ends"]] == ["flashinfer-jit", "flashinfer-ar-fusion", "torch-symm-mem",
                                                          "nccl-graph-tree"]


def test_pick_exit_codes(workspace):
    picked = invoke("pick", "--plan", "plan.json", "--require", "flashinfer-ar-fusion", "--driver", "595.10")
    assert picked.exit_code == 0
    assert picked.stdout == DIGESTS[CU131] + "\n"                             # stdout: the reference only
    assert f"picked {CU131}" in picked.stderr and "✔ flashinfer-ar-fusion: pass (runtime probe" in picked.stderr

    # On 585.1 only the gate passed flashinfer-ar-fusion: a gate that runs nothing admits, it does not prove.
    admitted = invoke("pick", "--plan", "plan.json", "--require", "flashinfer-ar-fusion", "--driver", "585.1")
    assert admitted.exit_code == 4 and admitted.stdout == ""
    assert "flashinfer-ar-fusion: admitted by the code only, not measured working" in admitted.stderr

    nothing = invoke("pick", "--plan", "plan.json", "--require", "torch-symm-mem,flashinfer-jit")
    assert nothing.exit_code == 4 and nothing.stdout == ""
    assert f"no image qualifies for {TARGET}; closest first:" in nothing.stderr
    assert "✘ torch-symm-mem: fail (runtime probe" in nothing.stderr
    assert nothing.stderr.strip().splitlines()[-1].startswith("stackforge: error: no image qualifies")

    bad = invoke("pick", "--plan", "plan.json", "--require", "warp-drive")
    assert bad.exit_code == 2 and "unknown feature(s)" in bad.stderr


def test_pick_json(workspace):
    result = invoke("pick", "--plan", "plan.json", "--require", "flashinfer-ar-fusion", "--driver", "595.10",
                    "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["image"] == DIGESTS[CU131]
    failed = invoke("pick", "--plan", "plan.json", "--require", "torch-symm-mem", "--format", "json")
    assert failed.exit_code == 4 and json.loads(failed.stdout)["status"] == "nothing-qualifies"


def test_matrix_diff_command(workspace):
    run_b = start_run(workspace / "results", command=["t"], run_id="run-b")
    flipped = record(CU128, "custom-allreduce", "fail", run_id="run-b", created_at="2026-03-02T02:00:00+00:00")
    for rec in seed_records():
        write_record(run_b, dataclasses.replace(rec, run_id="run-b"))
    write_record(run_b, flipped)
    result = invoke("matrix", "diff", "results/run-a", "results/run-b")
    assert result.exit_code == 1                                              # a regression
    assert "1 status change(s); 0 metric change(s) beyond noise" in result.stdout
    assert f"REGRESSION: `{CU128}` · `custom-allreduce`" in result.stdout
    same = invoke("matrix", "diff", "results/run-a", "results/run-a", "--fail-on", "change", "--format", "json")
    assert same.exit_code == 0 and json.loads(same.stdout)["status_changes"] == []
    never = invoke("matrix", "diff", "results/run-a", "results/run-b", "--fail-on", "never")
    assert never.exit_code == 0


def test_results_merge_and_check(workspace):
    other = start_run(workspace / "shard2", command=["t"], run_id="run-s2")
    write_record(other, record("cu132-extra", "serve", "pass", tier="bench", run_id="run-s2"))
    result = invoke("results", "merge", "results", "shard2", "--out", "merged", "--run-id", "nightly-7")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(Path("merged") / "nightly-7")
    merged = load_results(workspace / "merged" / "nightly-7")
    assert len(merged.records) == len(seed_records()) + 1 and merged.runs[0].merged_from == ("run-a", "run-s2")
    assert invoke("results", "check", "merged").exit_code == 0
    (workspace / "merged" / "nightly-7" / CU128 / TARGET / "bad.json").write_text("[")
    checked = invoke("results", "check", "merged")
    assert checked.exit_code == 2 and "bad.json" in checked.stderr
