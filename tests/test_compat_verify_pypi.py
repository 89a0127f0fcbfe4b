"""``stackforge compat verify`` against the real PyPI wheels: one shipped rule, its bound moved by one
release in a --compat copy, must fail naming the rule and the bound the wheels show; the shipped rule
passes. Needs PyPI (as CI has); the wheels are cached under the checkout's .cache/wheels."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from stackforge.cli import cli

pytestmark = pytest.mark.pypi
REPO = Path(__file__).resolve().parents[1]
RULE = "sglang-ar-fusion-rejects-sm12"


@pytest.fixture()
def wheel_cache(monkeypatch):
    folder = Path(os.environ.get("STACKFORGE_WHEEL_CACHE") or REPO / ".cache" / "wheels")
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", str(folder))
    return folder


def moved_copy(tmp_path: Path, bound: str) -> Path:
    """A --compat folder holding the shipped rule with its sglang bound replaced."""
    shipped = yaml.safe_load((REPO / "compat" / "rules" / "sglang.yaml").read_text())
    (rule,) = [r for r in shipped["rules"] if r["id"] == RULE]
    rule["when"]["sglang"] = bound
    folder = tmp_path / "compat"
    (folder / "rules").mkdir(parents=True)
    (folder / "rules" / "moved.yaml").write_text(yaml.safe_dump({"schema": 1, "rules": [rule]}, sort_keys=False))
    return folder


def test_a_bound_moved_by_one_release_fails_with_the_measured_bound(tmp_path, wheel_cache):
    result = CliRunner().invoke(cli, ["--compat", str(moved_copy(tmp_path, ">=0.5.15")), "compat", "verify",
                                      "--rule", RULE])
    assert result.exit_code == 1, result.output
    assert f"{'WRONG':<14} {RULE}" in result.output
    assert "measured bound sglang >=0.5.14" in result.output


def test_the_shipped_rule_is_confirmed(wheel_cache):
    result = CliRunner().invoke(cli, ["compat", "verify", "--rule", RULE])
    assert result.exit_code == 0, result.output
    assert f"{'CONFIRMED':<14} {RULE}" in result.output
    assert "witnessed 1 / 1 rules" in result.output
