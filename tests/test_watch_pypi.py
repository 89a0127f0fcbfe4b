"""``stackforge watch`` against the real index (network), with the shipped readers and rules: FlashInfer
0.6.17 replayed as if new admits allreduce fusion on sm_120, with the code on both sides, and no rule
needs a patch. Wheels are cached under the checkout's .cache/wheels (as compat verify's test does)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.cli import cli

pytestmark = pytest.mark.pypi
REPO = Path(__file__).resolve().parents[1]


def test_flashinfer_0_6_17_replayed_as_new_release(tmp_path, monkeypatch):
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", os.environ.get("STACKFORGE_WHEEL_CACHE") or str(REPO / ".cache" / "wheels"))
    result = CliRunner().invoke(cli, ["watch", "--package", "flashinfer-python", "--after", "0.6.16.post4",
                                      "--until", "0.6.17", "--target", "rtx-pro-6000-x8-pcie", "--json",
                                      "--results", str(tmp_path / "results")])
    assert result.exit_code == 1, result.output
    (release,) = json.loads(result.stdout)["releases"]
    assert (release["version"], release["previous"]) == ("0.6.17", "0.6.16.post4")
    fusion = [c for c in release["changed"] if c["fact"] == "flashinfer-ar-fusion"]
    assert [c["target"] for c in fusion] == ["rtx-pro-6000-x8-pcie"]
    before, after = fusion[0]["before"], fusion[0]["after"]
    assert (before["status"], after["status"]) == ("unavailable", "available")
    assert before["sites"] and after["sites"], "the code on both sides"
    assert after["file"]["url"].startswith("https://files.pythonhosted.org/") and len(after["file"]["sha256"]) == 64
    assert release["rules"] and all(r["verdict"] != "wrong" for r in release["rules"])
    assert release["proposed_patches"] == []
    assert not (tmp_path / "results" / "watch-state.json").exists(), "a replay leaves the state alone"


def test_the_shipped_sglang_pins_agree_with_the_index():
    result = CliRunner().invoke(cli, ["compat", "pins"])
    assert result.exit_code == 0, result.output
    assert "agrees with the index" in result.stderr
