"""The compatibility matrix: how cells are decided, and the md / json / csv / html renderings."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from click.testing import CliRunner
from matrix_fixtures import (
    CU128,
    CU130,
    CU131,
    FEATURES,
    PRUNED,
    RULES,
    TARGET,
    plan_dict,
    record,
    seed_records,
)

from stackforge.core.errors import RecordError, SpecError
from stackforge.core.records import Verdict
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import (
    COMPAT_MATRIX_SCHEMA,
    CellSource,
    CellStatus,
    build_matrix,
    choose_target,
    decide_cell,
    key_metric,
    metric_center,
)
from stackforge.report.compat_matrix_html import write_matrix_html
from stackforge.report.compat_matrix_write import write_matrix_csv, write_matrix_json, write_matrix_md
from stackforge.report.formats import write_matrix


@pytest.fixture
def report():
    return build_matrix(seed_records(), Plan.from_json(plan_dict()), TARGET,
                        runs=("20260301T020000Z-aaaaaa",))


# ---------------------------------------------------------------------------------------------- deciding cells


def test_runtime_outranks_gate_and_worst_outcome_wins():
    gate_pass = record(CU128, "flashinfer-jit", "pass", tier="gate")
    run_fail = record(CU128, "flashinfer-jit", "fail")
    cell = decide_cell("flashinfer-jit", [gate_pass, run_fail])
    assert (cell.status, cell.source, cell.tier.value) == (CellStatus.FAIL, CellSource.MEASURED, "runtime")
    assert cell.records == (gate_pass, run_fail)                  # every record stays as evidence
    bench_crash = record(CU128, "flashinfer-jit", "crash", tier="bench", probe="b")
    assert decide_cell("flashinfer-jit", [run_fail, bench_crash]).status is CellStatus.CRASH


def test_probe_error_does_not_hide_a_pass_but_a_failure_does():
    passed = record(CU131, "serve", "pass", tier="bench", probe="a")
    broke = record(CU131, "serve", "error", tier="bench", probe="b")
    assert decide_cell("serve", [passed, broke]).status is CellStatus.PASS
    assert decide_cell("serve", [broke]).status is CellStatus.ERROR
    assert decide_cell("serve", [passed, record(CU131, "serve", "timeout", tier="bench", probe="c")]).status \
        is CellStatus.TIMEOUT


def test_skips_fall_back_to_the_prediction_then_to_skip():
    skipped = record(CU130, "torch-symm-mem", "skip", reason="no GPU on this host")
    predicted = decide_cell("torch-symm-mem", [skipped], RULES["torch-symm-mem-sm120"])
    assert (predicted.status, predicted.source) == (CellStatus.UNAVAILABLE, CellSource.PREDICTED)
    assert predicted.records == (skipped,)
    alone = decide_cell("torch-symm-mem", [skipped])
    assert (alone.status, alone.source) == (CellStatus.SKIP, CellSource.MEASURED)
    assert alone.reason == "no GPU on this host"
    assert decide_cell("x", []).status is CellStatus.UNTESTED


def test_an_undecided_record_is_kept_but_decides_nothing():
    """A probe that could not reach the deciding code path (``undecided``) is evidence kept in the cell,
    never a verdict: the prediction shows, else the cell is undecided and says by whom and why."""
    undecided = record(CU131, "torch-symm-mem", "undecided", tier="gate", probe="gate.sglang.symm-mem",
                       reason="the constructor needs a running server's published config",
                       evidence="ValueError: config namespace 'exec' not published")
    alone = decide_cell("torch-symm-mem", [undecided])
    assert (alone.status, alone.source, alone.tier) == (CellStatus.UNDECIDED, CellSource.NONE, None)
    assert alone.reason == ("undecided by gate.sglang.symm-mem: the constructor needs a running server's "
                            "published config")
    assert alone.evidence == "ValueError: config namespace 'exec' not published"
    assert alone.records == (undecided,) and alone.decisive is None and not alone.dead
    predicted = decide_cell("torch-symm-mem", [undecided], RULES["torch-symm-mem-sm120"])
    assert (predicted.status, predicted.source) == (CellStatus.UNAVAILABLE, CellSource.PREDICTED)
    assert predicted.reason == RULES["torch-symm-mem-sm120"].reason
    assert predicted.undecided.startswith("undecided by gate.sglang.symm-mem: ")
    skipped = record(CU131, "torch-symm-mem", "skip", reason="no GPU on this host")
    assert decide_cell("torch-symm-mem", [skipped, undecided]).status is CellStatus.UNDECIDED
    # Any real verdict decides; the undecided record stays as evidence only.
    run_pass = record(CU131, "torch-symm-mem", "pass")
    measured = decide_cell("torch-symm-mem", [undecided, run_pass])
    assert (measured.status, measured.source) == (CellStatus.PASS, CellSource.MEASURED)
    assert measured.undecided == ""
    assert undecided in measured.records
    assert decide_cell("torch-symm-mem", [undecided, record(CU131, "torch-symm-mem", "error")]).status \
        is CellStatus.ERROR


def test_undecided_cells_render_with_who_and_why():
    plan = Plan.from_json(plan_dict())
    records = [*seed_records(),
               record(CU131, "nccl-graph-tree", "undecided", tier="gate", probe="gate.x",
                      reason="needs a server", evidence="ValueError: config namespace 'exec' not published"),
               record(CU130, "torch-symm-mem", "undecided", tier="gate", probe="gate.y", reason="needs a server too")]
    report = build_matrix(records, plan, TARGET)
    cell = report.row(CU131).cell("nccl-graph-tree")
    assert cell.status is CellStatus.UNDECIDED
    md = write_matrix_md(report)
    assert "🤷 undecided" in md and "left undecided by their probes" in md
    assert "undecided by gate.x: needs a server" in md and "config namespace 'exec' not published" in md
    assert "undecided by gate.y: needs a server too" in md         # a predicted cell says it too
    data = json.loads(write_matrix_json(report))
    assert "undecided" in data["legend"]
    cells = {(r["stack_id"], c["feature"]): c for r in data["rows"] for c in r["cells"]}
    assert cells[(CU131, "nccl-graph-tree")]["status"] == "undecided"
    assert cells[(CU130, "torch-symm-mem")]["status"] == "unavailable"
    assert cells[(CU130, "torch-symm-mem")]["undecided"] == "undecided by gate.y: needs a server too"
    rows = list(csv.DictReader(io.StringIO(write_matrix_csv(report))))
    assert next(r for r in rows if r["stack_id"] == CU131 and r["feature"] == "nccl-graph-tree")["undecided"] \
        == "undecided by gate.x: needs a server"
    html = write_matrix_html(report)
    assert 'data-status="undecided"' in html and "undecided by gate.y: needs a server too" in html


def test_measured_pass_against_a_rule_is_flagged_not_hidden():
    cell = decide_cell("flashinfer-ar-fusion", [record(CU130, "flashinfer-ar-fusion", "pass")],
                       RULES["fi-arfusion-sm120"])
    assert cell.status is CellStatus.PASS and cell.source is CellSource.MEASURED
    assert cell.contradicted.startswith("rule contradicted by measurement: rule fi-arfusion-sm120")
    assert cell.prediction.verdict is Verdict.UNAVAILABLE          # both kept
    agreeing = decide_cell("flashinfer-ar-fusion", [record(CU128, "flashinfer-ar-fusion", "fail")],
                           RULES["fi-arfusion-sm120"])
    assert agreeing.contradicted == "" and agreeing.unpredicted is False
    surprise = decide_cell("nccl-graph-tree", [record(CU128, "nccl-graph-tree", "timeout")])
    assert surprise.unpredicted is True


def test_metric_center_reads_numbers_summaries_and_samples():
    assert metric_center(3) == 3.0
    assert metric_center({"median": 5, "minimum": 1}) == 5.0
    assert metric_center({"samples": [1, 9, 3]}) == 3.0
    assert metric_center([2, 4]) == 3.0
    assert metric_center(True) is None and metric_center("fast") is None and metric_center({"x": 1}) is None
    metric = key_metric([record(CU131, "serve", "pass", tier="bench", metrics={"output_throughput": {"median": 7}})])
    assert (metric.name, metric.value, metric.unit) == ("output_throughput", 7.0, "tok/s")


# ---------------------------------------------------------------------------------------------- building


def test_rows_are_in_version_order_with_plan_status(report):
    assert [r.stack_id for r in report.rows] == [CU128, PRUNED, CU130, CU131]
    assert [r.plan_status for r in report.rows] == ["kept", "pruned", "kept", "kept"]
    assert report.features == FEATURES


def test_cells_match_the_records(report):
    cu128 = report.row(CU128)
    assert [(c.feature, c.status.value, c.how) for c in cu128.cells] == [
        ("flashinfer-jit", "fail", "runtime"), ("flashinfer-ar-fusion", "fail", "runtime"),
        ("custom-allreduce", "pass", "runtime"), ("torch-symm-mem", "crash", "runtime"),
        ("nccl-graph-tree", "timeout", "runtime"), ("serve", "pass", "bench")]
    assert cu128.cell("serve").metric.value == 89.5
    cu130 = report.row(CU130)
    assert cu130.cell("flashinfer-jit").how == "gate"
    assert cu130.cell("torch-symm-mem").status is CellStatus.UNAVAILABLE
    assert cu130.cell("custom-allreduce").status is CellStatus.HAZARD
    assert cu130.cell("serve").status is CellStatus.UNTESTED
    pruned = report.row(PRUNED)
    assert {c.status for c in pruned.cells} == {CellStatus.PRUNED}
    assert pruned.pruned_by[0].rule.id == "torch-no-cu128-from-212"


def test_records_of_other_targets_and_unplanned_stacks():
    records = seed_records() + [record("cu129-extra", "serve", "pass", tier="bench"),
                                record(CU128, "serve", "fail", tier="bench", target="h200-x8-nvswitch")]
    report = build_matrix(records, Plan.from_json(plan_dict()), TARGET)
    assert report.row("cu129-extra").plan_status == "unplanned"
    assert report.row(CU128).cell("serve").status is CellStatus.PASS     # the h200 record does not leak in
    assert build_matrix(records, Plan.empty(), TARGET, features=["serve"]).features == ("serve",)


def test_choose_target():
    plan = Plan.from_json(plan_dict())
    assert choose_target(seed_records(), plan, None) == TARGET
    with pytest.raises(SpecError, match="choose one with --target"):
        choose_target(seed_records() + [record(CU128, "serve", "pass", target="b200-x8")], plan, None)
    with pytest.raises(SpecError, match="no results or plan entries for target 'nope'"):
        choose_target(seed_records(), plan, "nope")


@pytest.mark.parametrize("data, fragment", [
    ({"schema": "other"}, "not a stackforge plan"),
    ({"schema": "stackforge.plan", "schema_version": 9}, "newer than this stackforge"),
    ({"schema": "stackforge.plan", "schema_version": 1, "cells": [{"stack": {}, "driver_floor": {}}]},
     "malformed plan"),
    ({"schema": "stackforge.plan", "schema_version": 1,
      "cells": [{"stack_id": "s", "target": "t", "driver_floor": {},
                 "predictions": [{"feature": "f", "verdict": "nope"}]}]},
     "malformed plan"),
])
def test_bad_plans_are_record_errors(data, fragment):
    with pytest.raises(RecordError, match=fragment):
        Plan.from_json(data, path="plan.json")


def test_the_real_plan_json_is_understood(tmp_path):
    """Consume what `stackforge plan --json` really prints (the real planner and the shipped data)."""
    from stackforge.cli import cli

    result = CliRunner().invoke(cli, ["plan", "--json"])
    if result.exit_code != 0:
        pytest.skip(f"the shipped matrix does not plan here: {result.output.strip()[:200]}")
    plan = Plan.from_json(json.loads(result.output))
    assert plan.cells and plan.targets
    target = plan.cells[0].target.name
    report = build_matrix([], plan, target)
    assert len(report.rows) == len({c.stack_id for c in plan.cells_for_target(target)})
    pruned = [r for r in report.rows if r.plan_status == "pruned"]
    assert all(r.pruned_by and r.pruned_by[0].rule.reason for r in pruned)
    assert any(c.source is CellSource.PREDICTED for _, c in report.cells())


# ---------------------------------------------------------------------------------------------- markdown


def test_markdown_table_legend_and_footnotes(report):
    text = write_matrix_md(report)
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 4                                           # header, rule, 4 stacks
    assert all(line.count("|") == len(FEATURES) + 2 for line in table)   # no stray pipes break a row
    cu128_row = next(line for line in table if CU128 in line and "~~" not in line)
    assert "❌ run[^" in cu128_row and "💥 run" in cu128_row and "⏳ run" in cu128_row
    assert "✅ bench 89.5 tok/s" in cu128_row
    # A gate pass of flashinfer-ar-fusion only shows the code admits sm_120 (compat/knowledge.yaml tiers).
    assert "‼️☑️ gate" in text and "🚫 rule" in text and "⛔ pruned by `torch-no-cu128-from-212`" in text
    assert "**Legend**" in text and "rule contradicted by measurement" in text
    footnotes = dict(re.findall(r"^\[\^(\d+)\]: (.*)$", text, re.MULTILINE))
    refs = set(re.findall(r"\[\^(\d+)\](?!:)", text))
    assert refs == set(footnotes)                                         # every reference resolves
    assert any("No supported CUDA architectures found for major versions [12]" in n for n in footnotes.values())
    assert any("torch-no-cu128-from-212" in n and "https://github.com/pytorch/test-infra" in n
               for n in footnotes.values())
    hazard_notes = [n for n in footnotes.values() if "custom-ar-pcie" in n]
    assert len(hazard_notes) == 1                                         # one rule, one shared note


def test_large_matrices_still_fit_a_pr_comment():
    features = [f"feature-{i}" for i in range(12)]
    records = [record(f"cu13{i % 10}-torch2.{i}.0-fi0.{i}.0-sgl0.5.{i}-py312", f, status, tier=tier, probe=f"{f}-{tier}",
                      evidence="x" * 500)
               for i in range(60) for f in features for status, tier in (("pass", "gate"), ("fail", "runtime"))]
    report = build_matrix(records, Plan.empty(), TARGET)
    text = write_matrix_md(report)
    assert len(text) <= 60_000
    assert "shortened to fit a PR comment" in text
    assert text.count("\n| `cu13") == 60                                   # every stack is still a row
    small = write_matrix_md(build_matrix(seed_records(), Plan.from_json(plan_dict()), TARGET))
    assert "shortened" not in small


def test_markdown_survives_hostile_evidence():
    evil = record(CU128, "serve", "fail", tier="bench", reason="a | b\nc", evidence="x`y`|z\n" * 200)
    text = write_matrix_md(build_matrix([evil], Plan.empty(), TARGET))
    row = next(line for line in text.splitlines() if line.startswith(f"| `{CU128}`"))
    assert row.count("|") - row.count("\\|") == 3
    note = next(line for line in text.splitlines() if line.startswith("[^1]:"))
    assert "`x'y'\\|z" in note and note.count("x'y'\\|z") == 200        # the whole evidence: files are never cut


# ---------------------------------------------------------------------------------------------- json / csv


def test_json_envelope(report):
    data = json.loads(write_matrix_json(report))
    assert set(data) == {"schema", "schema_version", "matrix", "target", "runs", "predictions_only", "features",
                         "legend", "rows"}
    assert (data["schema"], data["schema_version"]) == (COMPAT_MATRIX_SCHEMA, 1)
    assert data["target"]["name"] == TARGET and data["target"]["arch"] == "12.0"
    assert data["features"] == list(FEATURES)
    row = data["rows"][0]
    assert set(row) == {"stack_id", "stack", "plan_status", "pruned_by", "derived", "images", "cells"}
    cell = row["cells"][0]
    assert set(cell) == {"feature", "status", "source", "tier", "reason", "evidence", "metric", "contradicted",
                         "unpredicted", "undecided", "prediction", "measurements"}
    assert [m["tier"] for m in cell["measurements"]] == ["gate", "runtime"]
    assert data["rows"][1]["pruned_by"][0]["rule"] == "torch-no-cu128-from-212"


def test_csv_has_one_line_per_cell(report):
    rows = list(csv.DictReader(io.StringIO(write_matrix_csv(report))))
    assert len(rows) == 4 * len(FEATURES)
    serve = next(r for r in rows if r["stack_id"] == CU131 and r["feature"] == "serve")
    assert (serve["status"], serve["source"], serve["tier"], serve["metric_value"]) == ("pass", "measured",
                                                                                       "bench", "112.0")
    assert serve["image"].startswith("ghcr.io/acme/stackforge@sha256:")
    pruned = next(r for r in rows if r["stack_id"] == PRUNED)
    assert (pruned["status"], pruned["rule"]) == ("pruned", "torch-no-cu128-from-212")


def test_unknown_format_is_a_spec_error(report):
    with pytest.raises(SpecError, match="unknown format 'pdf'"):
        write_matrix(report, "pdf")


# ---------------------------------------------------------------------------------------------- html


def test_html_is_self_contained_and_escapes_evidence():
    hostile = record(CU128, "serve", "fail", tier="bench", reason="<b>bold</b>",
                     evidence='</pre><script>alert("x")</script><img src="https://evil.example/x.png">')
    plan = plan_dict()
    for prediction in plan["cells"][0]["predictions"]:
        prediction["sources"] = [{"ref": "evil", "url": "javascript:alert(1)", "confidence": "x"}]
    text = write_matrix_html(build_matrix(seed_records() + [hostile], Plan.from_json(plan), TARGET))
    assert text.startswith("<!DOCTYPE html>")
    assert "default-src 'none'" in text                                  # nothing may load from anywhere
    assert '<script>alert("x")</script>' not in text and "&lt;script&gt;alert(" in text
    assert not re.search(r"<(script|img|link|iframe)[^>]+(src|href)=", text)
    assert 'href="javascript' not in text and "evil (x)" in text          # shown, not clickable
    assert text.count("<script>") == 1 and text.count("<style>") == 1
    assert 'id="filter"' in text and 'id="legend"' in text and 'id="matrix"' in text
    assert text.count("<tr class=") == 4


def test_html_cells_carry_status_evidence_and_sort_keys(report):
    text = write_matrix_html(report)
    cell = re.search(r'<td class="cell st-fail src-measured"[^>]*title="([^"]*)"', text)
    assert cell and "fail (runtime)" in cell.group(1)
    assert ('<details><summary><span class="glyph"><svg class="mark" width="12" height="12" viewBox="0 0 12 12" '
            'role="img" aria-label="fail">') in text
    assert '</svg></span> <b>fail</b> <span class="how">run</span></summary>' in text
    assert "No supported CUDA architectures found for major versions [12]" in text
    assert 'class="cell st-admitted src-measured contradicted"' in text
    assert re.search(r'data-rank="0" data-metric="112.0"', text)


def test_markdown_notes_carry_whole_reasons_and_evidence_within_budget():
    reason = "rendezvous refused: " + "SM120 is not in the arch table; " * 15 + "END-OF-REASON"
    evidence = "RuntimeError: " + "frame " * 120 + "END-OF-EVIDENCE"
    text = write_matrix_md(build_matrix([record(CU131, "torch-symm-mem", "fail", reason=reason, evidence=evidence)],
                                  Plan.empty(), TARGET))
    assert "END-OF-REASON" in text and "END-OF-EVIDENCE" in text and "…" not in text


def test_html_shows_the_same_driver_floor_as_plan_and_pick():
    from stackforge.core.data import resolve_matrix_path
    from stackforge.plan.planner import Plan, plan_file
    plan = Plan.from_json(plan_file(resolve_matrix_path(None)).to_json())
    html = write_matrix_html(build_matrix([], plan, TARGET))
    # CUDA 12.8 stack on the RTX PRO 6000 box: the target's own 570.26 lifts the 12.x floor of 525.
    assert "driver ≥ 570.26" in html and "driver ≥ 580" in html and "driver ≥ 525" not in html


def test_a_plan_made_here_and_one_read_from_its_json_give_the_same_report():
    """Reports take the plan model as the planner makes it; no JSON round trip stands in between."""
    from stackforge.core.data import resolve_matrix_path
    from stackforge.plan.planner import plan_file

    planned = plan_file(resolve_matrix_path(None))
    read_back = Plan.from_json(json.loads(json.dumps(planned.to_json())), path="plan.json")
    for target in (t.name for t in planned.targets):
        here, there = build_matrix([], planned, target), build_matrix([], read_back, target)
        assert write_matrix_json(here) == write_matrix_json(there)
        assert write_matrix_md(here) == write_matrix_md(there)
