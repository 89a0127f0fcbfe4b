"""`stackforge bisect` end to end against a loopback index of real (small) wheels."""

from __future__ import annotations

import json
import os
import socket

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.wheel_readings import ReaderSpec
from tests._wheel_helpers import COMM_SPEC, LoopbackIndex, comm_py, make_wheel, read_comm_gate, serve

TARGET = "rtx-pro-6000-x8-pcie"   # sm_120
HISTORY = [("0.6.9", [9, 10]), ("0.6.10", [9, 10]), ("0.6.15", [9, 10]), ("0.6.16", [9, 10]),
           ("0.6.16.post4", [9, 10]), ("0.6.17", [9, 10, 12]), ("0.6.18", [9, 10, 12]), ("0.7.0rc1", [9, 10]),
           ("0.7.0", [9, 10, 12])]


@pytest.fixture
def bisect_cli(tmp_path, monkeypatch):
    """A loopback index holding HISTORY, pip's own configuration out of the way, a fresh wheel cache."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("stackforge.wheels.bisect_campaign.load_readers", lambda: (COMM_SPEC,))
    index = LoopbackIndex()
    for version, majors in HISTORY:
        index.add("flashinfer-python", make_wheel(tmp_path / "w", "flashinfer-python", version,
                                                  {"flashinfer/jit/comm.py": comm_py(majors)}))
    url, server = serve(index)

    def invoke(*args: str, index_url: str = url):
        return CliRunner().invoke(cli, ["bisect", *args, "--index-url", index_url])
    yield invoke, index, tmp_path
    server.shutdown()


def test_the_boundary_is_printed_with_evidence_on_both_sides(bisect_cli):
    invoke, index, _ = bisect_cli
    result = invoke("flashinfer-ar-fusion", "--target", TARGET)
    assert result.exit_code == 0, result.output
    assert ("flashinfer-python 0.6.16.post4 (unavailable) flashinfer/jit/comm.py:2 supported_major_versions = "
            "[9, 10] -> 0.6.17 (available) flashinfer/jit/comm.py:2 supported_major_versions = [9, 10, 12]") \
        in result.stdout
    assert "sha256:" in result.stdout and "0.7.0rc1" not in result.stdout
    downloads = [hit for hit in index.hits if "/files/" in hit]
    assert len(downloads) == len(set(downloads)) < len(HISTORY) - 1


def test_json_names_every_release_read_and_the_change(bisect_cli):
    invoke, _, _ = bisect_cli
    result = invoke("flashinfer-ar-fusion", "--target", TARGET, "--json")
    data = json.loads(result.stdout)
    (search,) = data["searches"]
    assert (search["package"], search["mode"], data["context"]["arch"]) == ("flashinfer-python", "binary", "12.0")
    (change,) = search["changes"]
    assert (change["before"]["version"], change["after"]["version"]) == ("0.6.16.post4", "0.6.17")
    assert change["after"]["sites"] == [{"path": "flashinfer/jit/comm.py", "line": 2,
                                         "code": "supported_major_versions = [9, 10, 12]"}]
    assert len(change["after"]["wheel"]["sha256"]) == 64


def test_all_reports_a_history_that_is_not_monotone(bisect_cli):
    invoke, _, _ = bisect_cli
    result = invoke("flashinfer-ar-fusion", "--target", TARGET, "--all", "--pre", "--json")
    (data,) = json.loads(result.stdout)["searches"]
    assert data["mode"] == "all" and len(data["read"]) == len(HISTORY)
    assert [(c["before"]["version"], c["after"]["version"]) for c in data["changes"]] == \
        [("0.6.16.post4", "0.6.17"), ("0.6.18", "0.7.0rc1"), ("0.7.0rc1", "0.7.0")]


def test_from_and_to_narrow_the_range(bisect_cli):
    invoke, _, _ = bisect_cli
    result = invoke("flashinfer-ar-fusion", "--target", TARGET, "--from", "0.6.17", "--to", "0.7.0", "--json")
    (data,) = json.loads(result.stdout)["searches"]
    assert data["releases"] == ["0.6.17", "0.6.18", "0.7.0"] and data["changes"] == []
    empty = invoke("flashinfer-ar-fusion", "--target", TARGET, "--from", "0.8")
    assert empty.exit_code == 2
    assert "no release of flashinfer-python between 0.8 and the last" in empty.stderr
    assert "0.6.9 .. 0.7.0" in empty.stderr
    assert invoke("flashinfer-ar-fusion", "--target", TARGET, "--to", "not-a-version").exit_code == 2


def test_unknown_feature_target_and_distribution_exit_2_listing_the_valid_ones(bisect_cli, monkeypatch):
    invoke, _, _ = bisect_cli
    result = invoke("no-such-feature", "--target", TARGET)
    assert result.exit_code == 2 and "unknown feature 'no-such-feature'; known features: " in result.stderr
    assert "flashinfer-ar-fusion" in result.stderr
    result = invoke("flashinfer-ar-fusion", "--target", "no-such-box")
    assert result.exit_code == 2 and "unknown target 'no-such-box'" in result.stderr and TARGET in result.stderr
    result = invoke("flashinfer-ar-fusion", "--target", TARGET, "--package", "sglang")
    assert result.exit_code == 2 and "it is read from: flashinfer-python" in result.stderr



def test_a_feature_read_from_several_distributions_is_searched_in_each(bisect_cli, monkeypatch, tmp_path):
    invoke, index, _ = bisect_cli
    twice = (COMM_SPEC, ReaderSpec("flashinfer-ar-fusion", "sglang", read_comm_gate, "x"))
    monkeypatch.setattr("stackforge.wheels.bisect_campaign.load_readers", lambda: twice)
    for version, majors in (("0.5.13", [9, 10]), ("0.5.14", [9, 10]), ("0.5.15", [9])):
        index.add("sglang", make_wheel(tmp_path / "s", "sglang", version, {"flashinfer/jit/comm.py": comm_py(majors)}))
    result = invoke("flashinfer-ar-fusion", "--target", TARGET, "--json")
    assert result.exit_code == 0, result.output
    assert [s["package"] for s in json.loads(result.stdout)["searches"]] == ["flashinfer-python", "sglang"]
    result = invoke("flashinfer-ar-fusion", "--target", TARGET, "--package", "sglang")
    assert result.exit_code == 0 and "flashinfer-ar-fusion (sglang)" in result.stdout
    assert "flashinfer-python 0.6" not in result.stdout
    ranged = invoke("flashinfer-ar-fusion", "--target", TARGET, "--from", "0.6.10")
    assert ranged.exit_code == 2 and "read from several: flashinfer-python, sglang" in ranged.stderr
    assert "--package" in ranged.stderr


def test_an_unreachable_index_exits_3_naming_url_and_cause(bisect_cli):
    invoke, _, tmp_path = bisect_cli
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = f"http://127.0.0.1:{port}/simple"
    result = invoke("flashinfer-ar-fusion", "--target", TARGET, index_url=dead)
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1 and dead in result.stderr and "refused" in result.stderr
    assert not (tmp_path / "cache").exists() or not any(p.name != "index" for p in (tmp_path / "cache").iterdir())


def test_a_wheel_whose_sha256_differs_from_the_index_is_refused(bisect_cli):
    invoke, index, tmp_path = bisect_cli
    for entry in index.projects["flashinfer-python"]:
        entry["sha256"] = "f" * 64
    result = invoke("flashinfer-ar-fusion", "--target", TARGET)
    assert result.exit_code == 1 and "refused" in result.stderr and "f" * 64 in result.stderr
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["index"]


def test_results_records_every_release_read_and_deadends_names_the_boundary(bisect_cli, tmp_path):
    from stackforge.core.records import Tier
    from stackforge.report.deadends import release_boundaries
    from stackforge.results.store import load_results

    invoke, _, _ = bisect_cli
    result = invoke("flashinfer-ar-fusion", "--target", TARGET, "--results", str(tmp_path / "results"), "--json")
    assert result.exit_code == 0, result.output
    (search,) = json.loads(result.stdout)["searches"]
    records = load_results(tmp_path / "results").records
    assert len(records) == len(search["read"]) and {r.tier for r in records} == {Tier.WHEEL}
    (boundary,) = release_boundaries(records, "flashinfer-ar-fusion")
    assert (boundary.last_blocked, boundary.first_unblocked) == ("0.6.16.post4", "0.6.17")


def test_stack_side_context_options_reach_the_readers(bisect_cli):
    invoke, _, _ = bisect_cli
    result = invoke("flashinfer-ar-fusion", "--target", TARGET, "--cuda", "12.8", "--python", "3.12",
                    "--torch-cuda", "12.8", "--kernel-package", "sglang-kernel", "--json", "--from", "0.6.17")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["context"] == {
        "arch": "12.0", "gpu_count": 8, "interconnect": "pcie", "multicast": False, "cuda": "12.8", "nvcc": True,
        "python": "3.12", "torch_cuda": "12.8", "kernel_package": "sglang-kernel"}
    text = invoke("flashinfer-ar-fusion", "--target", TARGET, "--cuda", "12.8", "--from", "0.6.17")
    assert "(sm_120, 8x pcie, CUDA 12.8)" in text.stdout


def test_index_credentials_reach_no_result_file(bisect_cli, tmp_path, monkeypatch):
    """A private index's ``user:password@`` is used to fetch, never written: not in run.json's
    command line, not in a record's evidence, not in the output."""
    invoke, index, _ = bisect_cli
    url = invoke.__kwdefaults__["index_url"]
    secret_url = url.replace("http://", "http://alice:s3cr3t@", 1)
    argv = ["stackforge", "bisect", "flashinfer-ar-fusion", "--target", TARGET, "--index-url", secret_url,
            "--results", str(tmp_path / "results")]
    monkeypatch.setattr("sys.argv", argv)
    result = invoke(*argv[2:5], "--results", str(tmp_path / "results"), index_url=secret_url)
    assert result.exit_code == 0, result.output
    assert "s3cr3t" not in result.output
    written = [p for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in written) and len(written) > 1
    leaked = [p.name for p in written if "s3cr3t" in p.read_text(encoding="utf-8")]
    assert leaked == [], leaked
    run_json = next(p for p in written if p.name == "run.json").read_text(encoding="utf-8")
    assert "http://alice@" not in run_json and url in run_json


def test_every_feature_is_taken_or_refused_with_the_tier_that_decides_it():
    """bisect takes what `list features` prints: a feature maps to the facts that decide it; one no reader
    decides exits 2 naming the tier that does."""
    from stackforge.core.errors import SpecError
    from stackforge.plan.features import load_feature_catalog
    from stackforge.wheels.tier import load_readers, resolve_specs

    readers = load_readers()
    both = resolve_specs(readers, "pcie-allreduce", None)
    assert {(s.dist, s.fact) for s in both} == {("flashinfer-python", "flashinfer-pcie-ipc-ar"),
                                                ("sglang", "sglang-pcie-ipc-ar")}
    assert [s.fact for s in resolve_specs(readers, "pcie-allreduce", "sglang")] == ["sglang-pcie-ipc-ar"]
    assert [s.fact for s in resolve_specs(readers, "sglang-trtllm-mha-prefill", None)] == ["sglang-trtllm-mha-prefill"]
    with pytest.raises(SpecError, match="no wheel reader decides nvcc-codegen: nvcc-codegen is decided by the image"):
        resolve_specs(readers, "nvcc-codegen", None)
    with pytest.raises(SpecError, match="nccl-graph-ring needs a GPU: only the runtime tier decides it"):
        resolve_specs(readers, "nccl-graph-ring", None)
    decided = [name for name in load_feature_catalog().features if _resolves(readers, name)]
    assert {"flashinfer-ar-fusion", "pcie-allreduce", "trtllm-gen-fmha", "nvfp4-gemm"} <= set(decided)


def _resolves(readers, name):
    from stackforge.core.errors import SpecError
    from stackforge.wheels.tier import resolve_specs

    try:
        return bool(resolve_specs(readers, name, None))
    except SpecError:
        return False
