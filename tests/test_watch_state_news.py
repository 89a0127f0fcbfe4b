"""Which releases a watch counts as new: by upload time, not version order (a backport is read, a yanked
release is reported once), and a state from a "future" index is warned about.

A loopback index with small real wheels, as in test_watch.py (the allreduce-fusion reader and rule).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from tests._wheel_helpers import LoopbackIndex, comm_py, make_wheel, watched_comm_index

TARGET = "rtx-pro-6000-x8-pcie"


@pytest.fixture()
def index(tmp_path, monkeypatch):
    with watched_comm_index(tmp_path, monkeypatch) as served:
        for version in ("0.6.15", "0.6.16.post4"):
            _release(served, tmp_path, version)
        yield served


def _release(served: LoopbackIndex, tmp_path, version: str, **kwargs) -> None:
    """A release uploaded after every release before it (one day later each)."""
    wheel = make_wheel(tmp_path / "wheels", "flashinfer-python", version, {"flashinfer/jit/comm.py": comm_py([9, 10])})
    served.add("flashinfer-python", wheel, upload_time=f"2026-08-{len(served.files) + 1:02d}T00:00:00.123456Z",
               **kwargs)


def _watch(index, tmp_path):
    result = CliRunner().invoke(cli, ["watch", "--package", "flashinfer-python", "--target", TARGET, "--json",
                                      "--results", str(tmp_path / "results"), "--index-url", index.url])
    return result, (json.loads(result.stdout) if result.stdout.strip() else None)


def _state(tmp_path) -> dict:
    return json.loads((tmp_path / "results" / "watch-state.json").read_text())


def test_a_yanked_newest_release_is_reported_once(tmp_path, index):
    assert _watch(index, tmp_path)[0].exit_code == 0
    _release(index, tmp_path, "0.6.17", yanked=True)
    result, report = _watch(index, tmp_path)
    assert result.exit_code == 1, result.output
    (release,) = report["releases"]
    assert release["version"] == "0.6.17" and release["yanked"]
    again, report = _watch(index, tmp_path)
    assert again.exit_code == 0, again.output
    assert report["releases"] == []
    seen = _state(tmp_path)["seen"]["flashinfer-python"]
    assert seen["version"] == "0.6.16.post4" and seen["last_upload"].startswith("2026-08-03")


def test_a_backport_uploaded_after_the_last_watch_is_read(tmp_path, index):
    assert _watch(index, tmp_path)[0].exit_code == 0
    _release(index, tmp_path, "0.6.15.post1")          # lower than the newest, uploaded after the last watch
    result, report = _watch(index, tmp_path)
    assert result.exit_code == 1, result.output
    (release,) = report["releases"]
    assert release["version"] == "0.6.15.post1" and release["previous"] == "0.6.15" and not release["unread"]
    assert _watch(index, tmp_path)[0].exit_code == 0   # read once, not again


@pytest.mark.parametrize(("last_upload", "words"), [
    ("2999-01-01T00:00:00Z", "is later than now"),
    ("2026-09-30T00:00:00Z", "is later than any upload on the index (2026-08-02T00:00:00Z)"),
])
def test_a_state_from_a_future_index_is_warned_about(tmp_path, index, last_upload, words):
    assert _watch(index, tmp_path)[0].exit_code == 0
    path = tmp_path / "results" / "watch-state.json"
    state = _state(tmp_path)
    state["seen"]["flashinfer-python"] = {"version": "0.6.15", "uploaded": "", "last_upload": last_upload}
    path.write_text(json.dumps(state))
    result, report = _watch(index, tmp_path)
    warnings = [n for n in report["notes"] if n.startswith("warning: flashinfer-python")]
    assert len(warnings) == 1 and words in warnings[0], report["notes"]
    # The upload mark cannot be trusted: versions decide, so the release after the seen one is still read.
    assert result.exit_code == 1 and [r["version"] for r in report["releases"]] == ["0.6.16.post4"]
    assert f"  warning: flashinfer-python: the watch state's last upload {last_upload}" in result.output   # stderr
    # The watch writes the index's own latest upload, which repairs the state.
    assert _state(tmp_path)["seen"]["flashinfer-python"]["last_upload"] == "2026-08-02T00:00:00.123456Z"


def test_a_state_without_upload_marks_still_reads_by_version(tmp_path, index):
    assert _watch(index, tmp_path)[0].exit_code == 0
    path = tmp_path / "results" / "watch-state.json"
    state = _state(tmp_path)
    state["seen"]["flashinfer-python"] = {"version": "0.6.15", "uploaded": ""}   # a state from before the marks
    path.write_text(json.dumps(state))
    result, report = _watch(index, tmp_path)
    assert result.exit_code == 1 and [r["version"] for r in report["releases"]] == ["0.6.16.post4"]


def test_an_upload_mark_that_is_not_a_time_is_a_corrupt_state(tmp_path, index):
    assert _watch(index, tmp_path)[0].exit_code == 0
    path = tmp_path / "results" / "watch-state.json"
    state = _state(tmp_path)
    state["seen"]["flashinfer-python"]["last_upload"] = "yesterday"
    path.write_text(json.dumps(state))
    result, _ = _watch(index, tmp_path)
    assert result.exit_code == 2 and "corrupt watch state" in result.output and "last_upload" in result.output
