"""``upgrade --read-wheels`` on a fresh results folder (network): the first answer comes from the pinned
releases' own code, read from their wheels, not from the rules alone. Wheels are cached under the
checkout's .cache/wheels (as compat verify's test does)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.cli import cli

pytestmark = pytest.mark.pypi
REPO = Path(__file__).resolve().parents[1]


def test_upgrade_reads_the_wheels_first_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", os.environ.get("STACKFORGE_WHEEL_CACHE") or str(REPO / ".cache" / "wheels"))
    result = CliRunner().invoke(cli, ["upgrade", "--from-cuda", "12.8", "--to-cuda", "13.1", "--target",
                                      "rtx-pro-6000-x8-pcie", "--results", str(tmp_path / "results"),
                                      "--read-wheels", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "reading the pinned releases' wheels from the index" in result.stderr
    report = json.loads(result.stdout)
    assert not report["predictions_only"]
    evidence = {f["feature"]: f["to"]["evidence"] for f in report["features"]}
    assert evidence["flashinfer-ar-fusion"] == "measured (wheel)"
    assert report["summary"]["admitted"] >= 1


def test_the_readme_example_is_real_output(tmp_path, monkeypatch):
    """Every line the README quotes as the answer is what `upgrade --read-wheels` prints on the default matrix."""
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", os.environ.get("STACKFORGE_WHEEL_CACHE") or str(REPO / ".cache" / "wheels"))
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## The answer, on one screen"):]
    quoted = section[section.index("```text\n") + 8:]
    quoted = [line for line in quoted[:quoted.index("```")].splitlines() if line.strip() != "..."]
    result = CliRunner().invoke(cli, ["upgrade", "--from-cuda", "12.8", "--to-cuda", "13.1", "--target",
                                      "rtx-pro-6000-x8-pcie", "--results", str(tmp_path / "results"), "--read-wheels"])
    assert result.exit_code == 0, result.output
    printed = result.stdout.splitlines()
    assert len(quoted) >= 12 and [line for line in quoted if line not in printed] == []
