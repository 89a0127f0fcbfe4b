"""A run that measured nothing never hides one that did: evidence ranks before time in every merge, the newer
non-measurement is kept apart for a note, and a record dated in the future is refused."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from matrix_fixtures import CU131, TARGET, record

from stackforge.cli import cli
from stackforge.core.errors import RecordError
from stackforge.results.store import finish_run, load_results, merge_records, merge_with_shadowed, start_run, write_record

OLD, NEW = "2026-03-01T02:00:00+00:00", "2026-03-02T02:00:00+00:00"


def at(rec, when: str, run_id: str):
    return dataclasses.replace(rec, created_at=when, run_id=run_id)


def run(root: Path, run_id: str, *records) -> Path:
    run_dir = start_run(root, command=["stackforge", "probe"], run_id=run_id, host="ci-1")
    for rec in records:
        write_record(run_dir, dataclasses.replace(rec, run_id=run_id))
    finish_run(run_dir)
    return run_dir


@pytest.mark.parametrize(("measured", "nothing"), [("pass", "skip"), ("fail", "error"), ("pass", "undecided"),
                                                    ("timeout", "skip"), ("crash", "error")])
def test_an_older_measurement_outranks_a_newer_record_that_measured_nothing(measured, nothing):
    old = at(record(CU131, "torch-kernels", measured, tier="gate", probe="gate.torch.arch-list"), OLD, "r1")
    new = at(record(CU131, "torch-kernels", nothing, tier="gate", probe="gate.torch.arch-list",
                    reason="no image for this stack: not built here"), NEW, "r2")
    for order in itertools.permutations([[old], [new]]):
        winners, shadowed = merge_with_shadowed(*order)
        assert [r.outcome.status.value for r in winners] == [measured]
        assert [r.outcome.status.value for r in shadowed] == [nothing]
    assert merge_records([new], [old]) == merge_records([old], [new]) == (old,)


def test_between_two_measurements_or_two_non_measurements_the_newest_wins():
    old = at(record(CU131, "torch-kernels", "pass", tier="gate", probe="p"), OLD, "r1")
    new = at(record(CU131, "torch-kernels", "fail", tier="gate", probe="p"), NEW, "r2")
    assert merge_records([old], [new]) == (new,)
    assert merge_with_shadowed([old], [new])[1] == ()
    skip_old = at(record(CU131, "torch-kernels", "skip", tier="gate", probe="p"), OLD, "r1")
    error_new = at(record(CU131, "torch-kernels", "error", tier="gate", probe="p"), NEW, "r2")
    assert merge_records([error_new], [skip_old]) == (error_new,)
    # An older non-measurement under a newer measurement is no note: the measurement is the last word.
    assert merge_with_shadowed([skip_old], [new])[1] == ()


def test_the_reports_keep_the_measurement_and_say_what_the_last_run_said(tmp_path):
    results = tmp_path / "results"
    passed = record(CU131, "torch-kernels", "pass", tier="gate", probe="gate.torch.arch-list",
                    reason="torch's arch list has sm_120", created_at=OLD)
    missing = record(CU131, "torch-kernels", "skip", tier="gate", probe="gate.torch.arch-list",
                     reason="no image for this stack: not built here", created_at=NEW)
    run(results, "20260301T020000Z-aaaaaa", passed)
    run(results, "20260302T020000Z-bbbbbb", missing)
    loaded = load_results(results)
    assert [r.outcome.status.value for r in loaded.records] == ["pass"]
    assert "last run skip (no image for this stack: not built here)" in loaded.shadowed_note()
    result = CliRunner().invoke(cli, ["matrix", "--results", str(results), "--target", TARGET, "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "kept 1 measured record(s) over newer runs that measured nothing" in result.stderr
    assert '"status": "pass"' in result.stdout


def test_a_record_dated_in_the_future_is_refused_with_its_path(tmp_path):
    results = tmp_path / "results"
    future = (datetime.now(timezone.utc) + timedelta(days=400)).replace(microsecond=0).isoformat()
    run(results, "20260301T020000Z-aaaaaa", record(CU131, "torch-kernels", "pass", tier="gate", probe="p",
                                                  created_at=future),
        record(CU131, "nvcc-codegen", "pass", tier="gate", probe="q", created_at=OLD))
    loaded = load_results(results)
    assert [r.probe for r in loaded.records] == ["q"]
    assert len(loaded.problems) == 1 and "after this machine's clock" in loaded.problems[0].message
    with pytest.raises(RecordError, match="a record from the future would win every later merge"):
        loaded.raise_for_problems()
    refused = CliRunner().invoke(cli, ["matrix", "--results", str(results), "--target", TARGET])
    assert refused.exit_code == 2 and "from the future" in refused.stderr
