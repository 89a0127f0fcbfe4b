"""``watch`` commits last: its reports are written before its state, and a fault never reads as news.

A report that cannot be written (a read-only folder, a full disk: writers monkeypatched to raise the OS
error, as root ignores permissions) leaves the state exactly as it was, so the next watch reports the
same releases again; the run ends with one line and exit 3, never 1 (news). A state that is a folder or
holds a bad version, and a package watch does not follow, are bad input: one line, exit 2.
"""

from __future__ import annotations

import errno
import json

from click.testing import CliRunner

from stackforge.cli import cli
from tests.test_watch import TARGET, _release, _watch, index  # noqa: F401 - index is a fixture

STATE = ("results", "watch-state.json")


def _failing_writes(monkeypatch, *, when, error: int = errno.ENOSPC) -> None:
    """Every atomic write whose path ``when`` accepts raises ``error`` (the disk is full, the folder read-only)."""
    import stackforge.core.fsio as fsio
    real = fsio.atomic_write_text

    def write(path, text, **kwargs):
        if when(path):
            raise OSError(error, "No space left on device" if error == errno.ENOSPC else "Read-only file system",
                          str(path))
        return real(path, text, **kwargs)
    monkeypatch.setattr(fsio, "atomic_write_text", write)
    monkeypatch.setattr("stackforge.watch.state.atomic_write_text", write)


def _one_error_line(output: str) -> str:
    (line,) = [line for line in output.splitlines() if line.startswith("stackforge: error:")]
    assert "Traceback" not in output
    return line


def test_a_report_that_cannot_be_written_leaves_the_state_and_the_releases_are_reported_again(
        tmp_path, index, monkeypatch):
    assert _watch(index, tmp_path).exit_code == 0
    state = tmp_path.joinpath(*STATE)
    before = state.read_bytes()
    _release(index, tmp_path, "0.6.17", [9, 10, 12])
    with monkeypatch.context() as patch:
        _failing_writes(patch, when=lambda path: str(path).endswith("watch.md"))
        failed = _watch(index, tmp_path, "--md", str(tmp_path / "watch.md"))
    assert failed.exit_code == 3, failed.output
    line = _one_error_line(failed.output)
    assert "writing the watch report" in line and "watch.md" in line and "ENOSPC" in line
    assert "the same releases" in line
    assert state.read_bytes() == before
    again = _watch(index, tmp_path, "--json", "--md", str(tmp_path / "watch.md"))
    assert again.exit_code == 1, again.output
    assert [r["version"] for r in json.loads(again.stdout)["releases"]] == ["0.6.17"]
    assert "flashinfer-python 0.6.17" in (tmp_path / "watch.md").read_text()
    assert json.loads(state.read_text())["seen"]["flashinfer-python"]["version"] == "0.6.17"


def test_a_read_only_json_report_folder_is_exit_3_and_not_news(tmp_path, index, monkeypatch):
    assert _watch(index, tmp_path).exit_code == 0
    before = tmp_path.joinpath(*STATE).read_bytes()
    _release(index, tmp_path, "0.6.17", [9, 10, 12])
    _failing_writes(monkeypatch, when=lambda path: path.name == "watch.json", error=errno.EROFS)
    failed = _watch(index, tmp_path, "--json-out", str(tmp_path / "out" / "watch.json"))
    assert failed.exit_code == 3
    assert "EROFS" in _one_error_line(failed.output)
    assert tmp_path.joinpath(*STATE).read_bytes() == before


def test_a_state_that_cannot_be_written_is_exit_3_after_the_report(tmp_path, index, monkeypatch):
    assert _watch(index, tmp_path).exit_code == 0
    before = tmp_path.joinpath(*STATE).read_bytes()
    _release(index, tmp_path, "0.6.17", [9, 10, 12])
    _failing_writes(monkeypatch, when=lambda path: path.name == "watch-state.json")
    failed = _watch(index, tmp_path, "--md", str(tmp_path / "watch.md"))
    assert failed.exit_code == 3
    assert "writing the watch state" in _one_error_line(failed.output)
    assert "flashinfer-python 0.6.17" in (tmp_path / "watch.md").read_text()   # the report came first
    assert tmp_path.joinpath(*STATE).read_bytes() == before


def test_a_state_that_is_a_folder_is_bad_input_naming_it(tmp_path, index):
    tmp_path.joinpath(*STATE).mkdir(parents=True)
    result = _watch(index, tmp_path)
    assert result.exit_code == 2, result.output
    line = _one_error_line(result.output)
    assert str(tmp_path.joinpath(*STATE)) in line and "not a file" in line
    assert tmp_path.joinpath(*STATE).is_dir()


def test_a_state_with_a_bad_version_is_bad_input_naming_it(tmp_path, index):
    assert _watch(index, tmp_path).exit_code == 0
    state = tmp_path.joinpath(*STATE)
    data = json.loads(state.read_text())
    data["seen"]["flashinfer-python"]["version"] = "0.6.x; rm -rf /"
    state.write_text(json.dumps(data))
    result = _watch(index, tmp_path)
    assert result.exit_code == 2, result.output
    line = _one_error_line(result.output)
    assert f"corrupt watch state {state}" in line and "flashinfer-python" in line and "0.6.x" in line
    assert json.loads(state.read_text()) == data


def test_a_package_watch_does_not_follow_is_refused_with_the_known_ones(tmp_path, index):
    result = CliRunner().invoke(cli, ["watch", "--package", "numpy", "--target", TARGET,
                                      "--results", str(tmp_path / "results"), "--index-url", index.url])
    assert result.exit_code == 2, result.output
    line = _one_error_line(result.output)
    assert "'numpy'" in line and "flashinfer-python" in line and "sglang" in line and "torch" in line
    assert not tmp_path.joinpath(*STATE).exists()
