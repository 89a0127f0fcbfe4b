"""The CLI's contract for faults: one line on stderr, a distinct exit code, nothing written."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from stackforge.cli import cli


@pytest.mark.parametrize("args", [
    ["build", "--cuda", "13.1", "--no-progress"],
    ["probe", "--cuda", "13.1"],
    ["bootstrap-base"],
])
def test_missing_docker_is_one_line_exit_3(args, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 3, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("stackforge: error: no Docker engine answers at unix:///nonexistent/docker.sock")
    assert "Traceback" not in result.output
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_unknown_command_lists_nothing_half_done():
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command 'frobnicate'" in result.output


def test_probe_unknown_feature_lists_known_ones():
    result = CliRunner().invoke(cli, ["probe", "--local", "--feature", "warp-drive"])
    assert result.exit_code == 2
    assert "unknown feature or probe id(s): warp-drive; known: " in result.output
    assert "flashinfer-ar-fusion" in result.output
