"""The wheel tier: a reader on a release's wheel, and its reading as a result record."""

from __future__ import annotations

import dataclasses

import pytest

from stackforge.core.errors import SpecError
from stackforge.core.records import ResultRecord, Status, Tier
from stackforge.core.wheel_readings import ReadContext, ReadingStatus
from stackforge.edges.index import IndexConfig, find_release, releases
from stackforge.results.store import result_schema
from stackforge.wheels.cache import WheelCache
from stackforge.wheels.match import record_matches
from stackforge.wheels.tier import (
    SDIST_NO_METADATA,
    measure,
    outcome_status,
    pick_wheel,
    read_release,
    wheel_record,
)
from tests._wheel_helpers import COMM_SPEC, LoopbackIndex, comm_py, make_sdist, make_wheel, serve, sha256_of

SM120 = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie")


@pytest.fixture
def index(tmp_path):
    index = LoopbackIndex()
    for version, majors in (("0.6.16.post4", [9, 10]), ("0.6.17", [9, 10, 12])):
        index.add("flashinfer-python", make_wheel(tmp_path / "w", "flashinfer-python", version,
                                                  {"flashinfer/jit/comm.py": comm_py(majors)}))
    index.add("flashinfer-python", make_sdist(tmp_path / "w", "flashinfer-python", "0.6.18", {
        "flashinfer/__init__.py": "", "flashinfer/jit/comm.py": comm_py([9, 10, 12]),
        "include/flashinfer/x.cuh": "// headers live elsewhere in an sdist", "../escape.py": "outside"}))
    # flashinfer/jit/ is there without comm.py: a file gap, not a missing subpackage
    index.add("flashinfer-python", make_sdist(tmp_path / "w", "flashinfer-python", "0.6.19",
                                              {"flashinfer/__init__.py": "", "flashinfer/jit/__init__.py": ""}))
    corrupt = tmp_path / "w" / "flashinfer_python-0.6.20.tar.gz"
    corrupt.write_bytes(b"not a tar archive")
    index.add("flashinfer-python", corrupt)
    url, server = serve(index)
    yield IndexConfig(index_url=url), WheelCache.open(IndexConfig(index_url=url), tmp_path / "cache"), tmp_path
    server.shutdown()


def test_read_release_reads_the_wheel_of_that_version(index):
    indexes, cache, _ = index
    assert read_release(COMM_SPEC, "0.6.16.post4", SM120, indexes=indexes, cache=cache).status \
        is ReadingStatus.UNAVAILABLE
    reading = read_release(COMM_SPEC, "0.6.17", SM120, indexes=indexes, cache=cache)
    assert reading.status is ReadingStatus.AVAILABLE and reading.sites[0].line == 2


def test_an_sdist_only_release_is_read_statically_and_never_built(index):
    indexes, cache, tmp_path = index
    reading = read_release(COMM_SPEC, "0.6.18", SM120, indexes=indexes, cache=cache)
    assert reading.status is ReadingStatus.AVAILABLE and reading.sites[0].line == 2
    assert reading.summary.startswith("(read in the sdist, not built) ")
    # Only the importable package is unpacked, at a wheel's place; nothing lands outside the tree.
    trees = [p for p in (tmp_path / "cache").iterdir() if p.is_dir() and p.name != "index"]
    (tree,) = trees
    assert (tree / "flashinfer" / "jit" / "comm.py").is_file() and not (tree / "include").exists()
    assert not (tmp_path / "escape.py").exists() and not (tmp_path / "cache" / "escape.py").exists()


def test_a_file_an_sdist_lacks_is_no_verdict(index):
    indexes, cache, _ = index
    reading = read_release(COMM_SPEC, "0.6.19", SM120, indexes=indexes, cache=cache)
    assert reading.status is ReadingStatus.UNDECIDED
    assert reading.summary.startswith("sdist only: flashinfer/jit/comm.py not in the wheel; a file an sdist lacks")


def test_a_corrupt_sdist_is_undecided_with_the_cause(index):
    indexes, cache, _ = index
    reading = read_release(COMM_SPEC, "0.6.20", SM120, indexes=indexes, cache=cache)
    assert reading.status is ReadingStatus.UNDECIDED
    assert reading.summary.startswith("sdist only, and unreadable: ") and "not a readable sdist" in reading.summary


def test_metadata_facts_are_not_read_from_an_sdist(index):
    indexes, cache, _ = index
    spec = dataclasses.replace(COMM_SPEC, fact="metadata:requires-python")
    reading = read_release(spec, "0.6.18", SM120, indexes=indexes, cache=cache)
    assert (reading.status, reading.summary) == (ReadingStatus.UNDECIDED, SDIST_NO_METADATA)


def test_an_unknown_version_is_bad_input(index):
    indexes, cache, _ = index
    with pytest.raises(SpecError, match="0.6.99 is not on the configured indexes.*0.6.17"):
        read_release(COMM_SPEC, "0.6.99", SM120, indexes=indexes, cache=cache)


def test_py3_none_any_is_preferred():
    from stackforge.core.wheel_readings import ReleaseFile
    from stackforge.edges.index import Release
    files = tuple(ReleaseFile("x", "1", f"x-1-{tag}.whl", "u", "") for tag in
                  ("cp312-cp312-manylinux_2_28_aarch64", "cp312-cp312-manylinux_2_28_x86_64", "py3-none-any"))
    assert pick_wheel(Release("x", "1", files)).filename == "x-1-py3-none-any.whl"
    assert pick_wheel(Release("x", "1", files[:2])).filename.endswith("x86_64.whl")


def test_a_reading_becomes_a_wheel_tier_record_with_its_evidence(index):
    indexes, cache, tmp_path = index
    release = find_release(releases("flashinfer-python", indexes=indexes), "0.6.16.post4")
    record = wheel_record(measure(COMM_SPEC, release, SM120, cache=cache), target="rtx-pro-6000-x8-pcie",
                          ctx=SM120, run_id="r1")
    assert (record.tier, record.stack_id, record.probe, record.feature) == \
        (Tier.WHEEL, "wheel-flashinfer-python-0.6.16.post4", "wheel.flashinfer-python.flashinfer-ar-fusion",
         "flashinfer-ar-fusion")
    assert record.stack == {"flashinfer": "0.6.16.post4", "arch": "12.0", "depends_on": ["arch"]}
    assert record.outcome.status is Status.FAIL
    wheel = release.files[0]
    assert record.outcome.evidence.splitlines()[:2] == [
        "flashinfer/jit/comm.py:2: supported_major_versions = [9, 10]",
        f"wheel: {wheel.url} sha256:{sha256_of(tmp_path / 'w' / wheel.filename)}"]
    assert (record.provenance.versions, record.provenance.runner) == ({"flashinfer-python": "0.6.16.post4"}, "wheel")
    again = ResultRecord.from_json(record.to_json())
    assert again == record
    import jsonschema
    jsonschema.validate(record.to_json(), result_schema())


def test_statuses_map_to_record_statuses():
    assert outcome_status(ReadingStatus.AVAILABLE) is Status.PASS
    assert outcome_status(ReadingStatus.UNAVAILABLE) is Status.FAIL
    assert outcome_status(ReadingStatus.ABSENT) is Status.FAIL
    assert outcome_status(ReadingStatus.UNDECIDED) is getattr(Status, "UNDECIDED", Status.SKIP)


def test_a_record_matches_stacks_of_its_version_and_context(index):
    indexes, cache, _ = index
    release = find_release(releases("flashinfer-python", indexes=indexes), "0.6.17")
    record = wheel_record(measure(COMM_SPEC, release, SM120, cache=cache), target="t", ctx=SM120, run_id="r")
    context = dataclasses.asdict(SM120)
    assert record_matches(record, {"flashinfer": "0.6.17", "sglang": "0.5.23"}, context)
    assert record_matches(record, {"flashinfer": "0.6.17.0"}, context)
    assert not record_matches(record, {"flashinfer": "0.6.16.post4"}, context)
    assert not record_matches(record, {"sglang": "0.6.17"}, context)


def test_probe_tier_wheel_records_the_pinned_releases(tmp_path, monkeypatch):
    import json
    import os

    from click.testing import CliRunner

    from stackforge.cli import cli
    from stackforge.core.wheel_readings import ReaderSpec
    from stackforge.results.store import load_results
    from tests._wheel_helpers import read_comm_gate

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", str(tmp_path / "cache"))
    not_served = ReaderSpec("torch-symm-mem", "sglang", read_comm_gate, "x")
    monkeypatch.setattr("stackforge.wheels.tier.load_readers", lambda: (COMM_SPEC, not_served))
    index = LoopbackIndex()
    index.add("flashinfer-python", make_wheel(tmp_path / "w", "flashinfer-python", "0.7.2",
                                              {"flashinfer/jit/comm.py": comm_py([9, 10, 12])}))
    url, server = serve(index)
    matrix = tmp_path / "m.yaml"
    matrix.write_text("schema: 1\ntargets: [rtx-pro-6000-x8-pcie]\naxes: {cuda: ['13.1'], torch: ['2.14.1'], "
                      "flashinfer: ['0.7.2'], sglang: ['0.5.23'], python: ['3.12', '3.13']}\n")
    try:
        result = CliRunner().invoke(cli, ["probe", "--tier", "wheel", "--matrix", str(matrix), "--results",
                                          str(tmp_path / "results"), "--index-url", url])
    finally:
        server.shutdown()
    # The release the index does not serve is an error record: the run measured nothing there, so it exits 1.
    assert result.exit_code == 1, result.output
    assert "1 of 2 probe(s) errored" in result.output and "--index-url / --find-links" in result.output
    records = {r.probe: r for r in load_results(tmp_path / "results").records}
    assert set(records) == {"wheel.flashinfer-python.flashinfer-ar-fusion", "wheel.sglang.torch-symm-mem"}, \
        "two stacks (python 3.12, 3.13) pin the same release: one record per release x fact x target"
    fusion = records["wheel.flashinfer-python.flashinfer-ar-fusion"]
    assert (fusion.stack_id, fusion.outcome.status, fusion.tier) == ("wheel-flashinfer-python-0.7.2", Status.PASS,
                                                                     Tier.WHEEL)
    missing = records["wheel.sglang.torch-symm-mem"]
    assert missing.outcome.status is Status.ERROR and "sglang 0.5.23 is not on the configured indexes" in \
        missing.outcome.reason
    assert "summary: 1 admitted, 1 error" in result.output   # a wheel reading only admits: never "pass"
    json.dumps(fusion.to_json())
    refused = CliRunner().invoke(cli, ["probe", "--tier", "wheel", "--matrix", str(matrix), "--local"])
    assert refused.exit_code == 2 and "--tier wheel and --local cannot be combined" in refused.stderr
    assert CliRunner().invoke(cli, ["probe", "--matrix", str(matrix), "--index-url", url]).exit_code == 2
    dead = CliRunner().invoke(cli, ["probe", "--tier", "wheel", "--matrix", str(matrix), "--results",
                                    str(tmp_path / "results2"), "--index-url", "http://127.0.0.1:9/simple"])
    assert dead.exit_code == 3 and "http://127.0.0.1:9/simple" in dead.stderr and "refused" in dead.stderr
    assert not (tmp_path / "results2").exists() or not any((tmp_path / "results2").iterdir()), \
        "an index that does not answer leaves no run behind"
