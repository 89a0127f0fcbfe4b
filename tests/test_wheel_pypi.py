"""Integration: the wheel tier against PyPI itself (network), through pip's own configuration here.

Two small FlashInfer wheels (about 9 MB each) on both sides of the allreduce-fusion boundary on
sm_120, into a fresh wheel cache: listing, download, sha256 check, unpack, read, bisect.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from tests._wheel_helpers import COMM_SPEC

pytestmark = pytest.mark.pypi


def test_bisect_finds_the_flashinfer_allreduce_fusion_boundary_on_pypi(tmp_path, monkeypatch):
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("stackforge.wheels.bisect_campaign.load_readers", lambda: (COMM_SPEC,))
    result = CliRunner().invoke(cli, ["bisect", "flashinfer-ar-fusion", "--target", "rtx-pro-6000-x8-pcie",
                                      "--from", "0.6.16.post4", "--to", "0.6.17", "--json"])
    assert result.exit_code == 0, result.output
    (search,) = json.loads(result.stdout)["searches"]
    (change,) = search["changes"]
    assert (change["before"]["version"], change["after"]["version"]) == ("0.6.16.post4", "0.6.17")
    assert change["before"]["sites"][0]["code"].replace(" ", "") == "supported_major_versions=[9,10]"
    assert change["after"]["sites"][0]["code"].replace(" ", "") == "supported_major_versions=[9,10,12]"
    wheel = change["after"]["wheel"]
    assert wheel["url"].startswith("https://files.pythonhosted.org/") and len(wheel["sha256"]) == 64
    assert (tmp_path / "cache" / wheel["sha256"] / "flashinfer" / "jit" / "comm.py").is_file()
    assert not list((tmp_path / "cache").glob(".partial-*")), "nothing half-written is left"
