"""matrix diff: status changes, and metric changes beyond each run's own noise."""

from __future__ import annotations

import json

import pytest
from matrix_fixtures import CU128, CU131, TARGET, plan_dict, record, seed_records

from stackforge.core.errors import RecordError
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import build_matrix
from stackforge.report.compat_matrix_write import write_matrix_json
from stackforge.report.diff import (
    MetricStats,
    diff_snapshots,
    load_snapshot,
    metric_stats,
    snapshot_from_matrix_json,
    snapshot_from_records,
    write_diff,
)
from stackforge.results.store import start_run, write_record


def bench(stack, probe, metrics, status="pass", run_id="a", feature=None):
    return record(stack, feature or probe, status, tier="bench", probe=probe, metrics=metrics, run_id=run_id)


def summary(median, low, high, n=5):
    return {"n": n, "median": median, "minimum": low, "maximum": high}


RUN_A = [bench(CU128, "serve", {"output_throughput": summary(89.5, 88.9, 90.1)}),
         bench(CU131, "serve", {"output_throughput": summary(112.0, 111.2, 112.9)}),
         bench(CU131, "allreduce", {"busbw": {"samples": [20.1, 20.4, 19.9, 20.2]}}),
         record(CU128, "flashinfer-jit", "pass", tier="gate")]
RUN_B = [bench(CU128, "serve", {"output_throughput": summary(89.9, 89.1, 90.6)}, run_id="b"),      # within noise
         bench(CU131, "serve", {"output_throughput": summary(98.0, 97.1, 98.8)}, run_id="b"),      # regression
         bench(CU131, "allreduce", {"busbw": {"samples": [20.3, 20.0, 20.5, 19.8]}}, run_id="b"),  # within noise
         record(CU128, "flashinfer-jit", "fail", tier="gate", run_id="b")]                        # flipped


def test_exactly_one_status_flip_and_one_metric_beyond_noise():
    diff = diff_snapshots(snapshot_from_records(RUN_A, "a"), snapshot_from_records(RUN_B, "b"))
    assert [(c.key, c.before.status, c.after.status) for c in diff.status_changes] == [
        ((TARGET, CU128, "flashinfer-jit"), "admitted", "fail")]     # a gate pass of the JIT only admits
    assert [c.key for c in diff.metric_changes] == [(TARGET, CU131, "serve", "output_throughput")]
    change = diff.metric_changes[0]
    assert change.trend == "regression" and change.delta == pytest.approx(-14.0)
    assert change.noise == pytest.approx(1.7)                      # the wider of the two observed ranges
    assert (diff.metrics_compared, diff.within_noise) == (3, 2)
    assert len(diff.regressions) == 2


def test_noise_rule():
    from stackforge.report.diff import _significant

    tight = MetricStats(100.0, 99.5, 100.5, 1.0)
    assert _significant(tight, MetricStats(103.0, 102.6, 103.4, 0.8))[0]              # disjoint, 3 % > 2 %
    assert not _significant(tight, MetricStats(100.9, 100.4, 101.4, 1.0))[0]          # ranges overlap
    assert not _significant(MetricStats(1000.0, 999.9, 1000.1, 0.2), MetricStats(1001.0, 1000.9, 1001.1, 0.2))[0]
    # single values: noise unknown, only a change over 10 % counts
    assert not _significant(MetricStats(100.0), MetricStats(108.0))[0]
    assert _significant(MetricStats(100.0), MetricStats(85.0)) == (True, None)
    # cv-only summaries still give a spread
    assert metric_stats({"median": 50.0, "cv": 0.02, "n": 5}).spread == pytest.approx(2.0)
    assert metric_stats({"median": 50.0, "stdev": 0.5}).spread == pytest.approx(1.0)
    assert metric_stats({"median": 50.0, "min": 49, "max": 52, "n": 1}).spread is None


def test_lower_is_better_for_latencies():
    a = [bench(CU131, "ar", {"latency_us": summary(30.0, 29.5, 30.5)})]
    b = [bench(CU131, "ar", {"latency_us": summary(40.0, 39.5, 40.5)}, run_id="b")]
    change = diff_snapshots(snapshot_from_records(a, "a"), snapshot_from_records(b, "b")).metric_changes[0]
    assert change.trend == "regression"
    faster = diff_snapshots(snapshot_from_records(b, "b"), snapshot_from_records(a, "a")).metric_changes[0]
    assert faster.trend == "improvement"


def test_nested_per_size_metrics_are_compared():
    a = [bench(CU131, "ar", {"busbw": {"1048576": summary(10.0, 9.9, 10.1), "note": "x"}})]
    b = [bench(CU131, "ar", {"busbw": {"1048576": summary(5.0, 4.9, 5.1)}}, run_id="b")]
    diff = diff_snapshots(snapshot_from_records(a, "a"), snapshot_from_records(b, "b"))
    assert [c.key[3] for c in diff.metric_changes] == ["busbw.1048576"]


def test_run_parameters_are_not_metrics():
    a = [bench(CU131, "ar", {"world_size": 8, "peak_busbw_size_bytes": 1 << 30, "peak_busbw_gbps": 40.0,
                             "rows": [{"size_bytes": 8}]})]
    b = [bench(CU131, "ar", {"world_size": 4, "peak_busbw_size_bytes": 1 << 20, "peak_busbw_gbps": 20.0,
                             "rows": [{"size_bytes": 16}]}, run_id="b")]
    diff = diff_snapshots(snapshot_from_records(a, "a"), snapshot_from_records(b, "b"))
    assert [c.key[3] for c in diff.metric_changes] == ["peak_busbw_gbps"]
    assert diff.metrics_compared == 1


def test_appearing_and_disappearing_cells_are_reported():
    diff = diff_snapshots(snapshot_from_records(RUN_A[:1], "a"), snapshot_from_records(RUN_A[1:2], "b"))
    assert {(c.before is None, c.after is None) for c in diff.status_changes} == {(False, True), (True, False)}
    assert diff.regressions == ()


def test_matrix_json_and_run_folders_diff_the_same(tmp_path):
    plan = Plan.from_json(plan_dict())
    (tmp_path / "a.json").write_text(write_matrix_json(build_matrix(RUN_A, plan, TARGET)))
    (tmp_path / "b.json").write_text(write_matrix_json(build_matrix(RUN_B, plan, TARGET)))
    from_json = diff_snapshots(load_snapshot(tmp_path / "a.json"), load_snapshot(tmp_path / "b.json"))
    for name, records in (("ra", RUN_A), ("rb", RUN_B)):
        run_dir = start_run(tmp_path / name, command=["t"], run_id=name)
        for rec in records:
            write_record(run_dir, rec)
    from_runs = diff_snapshots(load_snapshot(tmp_path / "ra" / "ra"), load_snapshot(tmp_path / "rb"))
    assert [c.key for c in from_json.status_changes] == [c.key for c in from_runs.status_changes]
    assert [c.key for c in from_json.metric_changes] == [c.key for c in from_runs.metric_changes]


def test_renderings_and_bad_inputs(tmp_path):
    diff = diff_snapshots(snapshot_from_records(RUN_A, "a"), snapshot_from_records(RUN_B, "b"))
    md = write_diff(diff, "md")
    assert "REGRESSION: `" + CU128 in md and "admitted (gate) → fail (gate)" in md
    assert "REGRESSION: `" + CU131 + "` · serve · output_throughput" in md and "(-12.5%)" in md
    data = json.loads(write_diff(diff, "json"))
    assert data["noise_rule"] == {"k": 1.0, "relative_threshold": 0.02, "no_spread_relative_threshold": 0.1}
    assert data["regressions"] == 2
    with pytest.raises(RecordError, match="not a stackforge matrix JSON"):
        snapshot_from_matrix_json({"schema": "x"}, "x.json")
    with pytest.raises(RecordError, match="newer"):
        snapshot_from_matrix_json({"schema": "stackforge.matrix", "schema_version": 2}, "x.json")
    with pytest.raises(RecordError, match="no such file"):
        load_snapshot(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(RecordError, match="cannot read matrix JSON"):
        load_snapshot(tmp_path / "bad.json")


def test_seed_against_itself_is_empty():
    snapshot = snapshot_from_records(seed_records(), "s")
    diff = diff_snapshots(snapshot, snapshot)
    assert not diff.changed and diff.within_noise == diff.metrics_compared > 0
