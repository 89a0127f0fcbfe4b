"""--out to a path that cannot be created: one line on stderr, exit 2, nothing half done (issue #11, 3)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from matrix_fixtures import seed_workspace

from stackforge.cli import cli


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """Results of one run, the plan as JSON, and a regular file where a folder would have to be."""
    monkeypatch.chdir(tmp_path)
    seed_workspace(tmp_path)
    (tmp_path / "a-file").write_text("not a folder\n")
    return tmp_path


COMMANDS = {
    "matrix": ["matrix", "--plan", "plan.json"],
    "deadends": ["deadends", "--plan", "plan.json"],
    "matrix diff": ["matrix", "diff", "results/run-a", "results/run-a"],
    "ci github": ["ci", "github", "--matrix", "default"],
    "render": ["render", "--cuda", "13.1"],
    "results merge": ["results", "merge", "results/run-a"],
}


def _one_line_exit_2(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("stackforge: error: --out "), result.stderr
    assert needle in lines[0]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_out_under_a_regular_file_is_one_line_exit_2(workspace, name):
    result = CliRunner().invoke(cli, [*COMMANDS[name], "--out", "a-file/deeper/out.md"])
    _one_line_exit_2(result, "a-file is not a folder")
    assert (workspace / "a-file").read_text() == "not a folder\n"


@pytest.mark.parametrize("name", ["matrix", "deadends", "matrix diff", "ci github"])
def test_file_out_that_is_a_folder_is_one_line_exit_2(workspace, name):
    (workspace / "a-folder").mkdir()
    result = CliRunner().invoke(cli, [*COMMANDS[name], "--out", "a-folder"])
    _one_line_exit_2(result, "it exists and is not a file")


@pytest.mark.parametrize("name", ["render", "results merge"])
def test_folder_out_that_is_a_file_is_one_line_exit_2(workspace, name):
    result = CliRunner().invoke(cli, [*COMMANDS[name], "--out", "a-file"])
    _one_line_exit_2(result, "it exists and is not a folder")


def test_a_write_that_fails_after_the_check_is_the_same_one_line_error(workspace, monkeypatch):
    # A race (a folder turned into a file after the check) is still the path's fault: exit 2. A full
    # disk is the host's: exit 3 (tests/test_exit_statuses.py).
    def raced(*args, **kwargs):
        raise NotADirectoryError(20, "Not a directory")
    monkeypatch.setattr("stackforge.cli._evidence.atomic_write_text", raced)
    result = CliRunner().invoke(cli, [*COMMANDS["matrix"], "--out", "site/matrix.md"])
    _one_line_exit_2(result, "Not a directory")


@pytest.mark.parametrize("name", ["matrix", "deadends", "ci github"])
def test_out_into_folders_yet_to_create_still_works(workspace, name):
    out = workspace / "new" / "folders" / "out.txt"
    result = CliRunner().invoke(cli, [*COMMANDS[name], "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file()
