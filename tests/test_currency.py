"""Every report says how current it is: the newest releases its evidence read, and newer ones the last
watch saw on the index (pure, from records and the watch state; no network)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.records import Provenance
from stackforge.watch.currency import currency
from stackforge.watch.state import SeenRelease, WatchState, state_path, write_state


class _Record:
    def __init__(self, versions: dict[str, str], created_at: str) -> None:
        self.provenance, self.created_at = Provenance(versions=versions), created_at


def test_the_newest_release_read_per_distribution_and_when():
    records = [_Record({"flashinfer_python": "0.6.3", "sglang": "0.5.9"}, "2026-11-01T00:00:00Z"),
               _Record({"flashinfer-python": "0.7.2"}, "2026-11-02T00:00:00Z")]
    state = WatchState({"flashinfer-python": SeenRelease("0.7.4", "2026-11-11T02:34:25Z"),
                        "sglang": SeenRelease("0.5.9")}, "2026-12-02T02:32:49Z")
    current = currency(records, [], state)
    assert [(r.dist, r.version) for r in current.read] == [("sglang", "0.5.9"), ("flashinfer-python", "0.7.2")]
    line = current.line(Path("results"))
    assert line.startswith("current as of: sglang 0.5.9 (2026-11-01T00:00Z), flashinfer-python 0.7.2")
    assert "the index has newer: flashinfer-python 0.7.4 (uploaded 2026-11-11)" in line
    assert "`stackforge watch --package flashinfer-python --after 0.7.2`" in line


def test_without_a_watch_it_says_the_index_was_not_compared():
    line = currency([], [{"sglang": "0.5.23", "torch": "2.14.1"}], None).line(Path("res"))
    assert "[no results; the plan pins]" in line and "not compared with the index (`stackforge watch --results res`" in line


def test_deadends_says_how_current_it_is(tmp_path):
    write_state(state_path(tmp_path), WatchState({"sglang": SeenRelease("0.5.99", "2026-12-01T00:00:00Z")},
                                                 "2026-12-02T00:00:00Z"))
    result = CliRunner().invoke(cli, ["deadends", "--results", str(tmp_path), "--target", "rtx-pro-6000-x8-pcie"])
    assert result.exit_code == 0, result.output
    assert "the index has newer: sglang 0.5.99" in result.stderr.splitlines()[-1]
