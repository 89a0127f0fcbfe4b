"""Matrix axes that follow the index: selectors, SGLang's own pins, the lock file and ``plan --update-lock``.

The index is a loopback PEP 691 server (tests/_wheel_helpers.py) holding small real wheels whose
METADATA carries the pins, so "a new release appears" is a test: add a file, resolve again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.errors import SpecError
from stackforge.plan.lock import read_lock
from stackforge.plan.release_pins import pins_from_metadata
from stackforge.plan.selectors import Selector, choose, parse_selector
from tests._wheel_helpers import LoopbackIndex, make_wheel, serve

SGLANG_METADATA = {
    "0.5.21": "Requires-Python: >=3.10\nRequires-Dist: torch==2.13.0\nRequires-Dist: flashinfer_python[cu13]==0.6.18\n"
              "Requires-Dist: sglang-kernel==0.4.7\nRequires-Dist: cuda-python>=13.0\n",
    "0.5.22": "Requires-Python: >=3.11\nRequires-Dist: torch==2.14.1\nRequires-Dist: flashinfer_python[cu13]==0.7.1\n"
              "Requires-Dist: sglang-kernel==0.4.9\n",
    "0.5.23": "Requires-Python: >=3.11\nRequires-Dist: torch==2.14.1\nRequires-Dist: flashinfer_python[cu13]==0.7.2\n"
              "Requires-Dist: sglang-kernel==0.4.10\n",
}

FOLLOW_MATRIX = """\
schema: 1
name: follow
targets: [rtx-pro-6000-x8-pcie]
defaults: {python: "3.11", flavour: wheels, os: debian12}
axes:
  cuda: ["13.1"]
  sglang: {latest: 2}
derive: {from: sglang}
"""


# --------------------------------------------------------------------------- pure parts

@pytest.mark.parametrize(("value", "message"), [
    ({"latest": 0}, "whole number from 1 to 20"),
    ({"latest": True}, "whole number"),
    ({"spec": ">>0.7"}, "not a PEP 440 version specifier"),
    ({"newest": 2}, "must be a list of versions"),
])
def test_a_bad_selector_names_its_line(value, message):
    with pytest.raises(SpecError, match=message) as caught:
        parse_selector("sglang", value, source="m.yaml", line=7)
    assert "m.yaml:7" in str(caught.value)


def test_a_selector_on_an_axis_without_a_distribution_is_refused():
    with pytest.raises(SpecError, match="cannot follow the index"):
        parse_selector("cuda", {"latest": 2}, source="m.yaml", line=3)


def test_selectors_choose_final_releases_only():
    available = ["0.5.9", "0.5.10rc1", "0.5.10", "0.5.11.dev0", "0.5.11"]
    assert choose(Selector("sglang", latest=2), available) == ("0.5.10", "0.5.11")
    assert choose(Selector("sglang", spec=">=0.5.10"), available) == ("0.5.10", "0.5.11")
    with pytest.raises(SpecError, match=r"spec >=0.6 selects nothing .*0.5.9, 0.5.10, 0.5.11"):
        choose(Selector("sglang", spec=">=0.6"), available)


def test_pins_come_from_the_srt_extra_and_the_base_requirements():
    old = pins_from_metadata("0.4.8", "Requires-Python: >=3.8\nRequires-Dist: torch==2.7.1; extra == \"srt\"\n"
                                      "Requires-Dist: flashinfer_python==0.2.6.post1; extra == \"srt\"\n"
                                      "Requires-Dist: sgl-kernel==0.1.9; extra == \"srt\"\n"
                                      "Requires-Dist: torch==9.9; extra == \"other\"\n").as_row()
    assert old == {"torch": "2.7.1", "flashinfer": "0.2.6.post1", "kernel_package": "sgl-kernel", "kernel": "0.1.9",
                   "python": ">=3.8"}
    new = pins_from_metadata("0.5.21", SGLANG_METADATA["0.5.21"]).as_row()
    assert new["flashinfer_extra"] == "cu13" and new["cuda_python"] == ">=13.0" and new["kernel"] == "0.4.7"


# --------------------------------------------------------------------------- against an index

@pytest.fixture()
def index(tmp_path):
    served = LoopbackIndex(core_metadata=True)
    for number, (version, metadata) in enumerate(SGLANG_METADATA.items()):
        wheel = make_wheel(tmp_path / "wheels", "sglang", version, {"sglang/__init__.py": ""}, metadata=metadata)
        served.add("sglang", wheel, upload_time=f"2026-10-{10 + number}T00:00:00Z")
    url, server = serve(served)
    served.url = url
    yield served
    server.shutdown()


def _matrix(tmp_path: Path, text: str = FOLLOW_MATRIX) -> Path:
    path = tmp_path / "follow.yaml"
    path.write_text(text)
    return path


def _plan(*args: str):
    return CliRunner().invoke(cli, ["plan", *args])


def test_update_lock_writes_the_lock_and_the_plan_takes_each_releases_pins(tmp_path, index):
    matrix = _matrix(tmp_path)
    result = _plan("--matrix", str(matrix), "--update-lock", "--index-url", index.url, "--json")
    assert result.exit_code == 0, result.output
    assert "sglang: latest 2 -> 0.5.22, 0.5.23 (new lock)" in result.stderr
    cells = json.loads(result.stdout)["cells"]
    assert [(c["stack"]["sglang"], c["stack"]["torch"], c["stack"]["flashinfer"], c["stack"]["kernel"])
            for c in cells] == [("0.5.22", "2.14.1", "0.7.1", "0.4.9"), ("0.5.23", "2.14.1", "0.7.2", "0.4.10")]
    assert cells[1]["derived"]["kernel_package"] == "sglang-kernel"
    lock = read_lock(tmp_path / "follow.lock.yaml")
    (axis,) = lock.axes
    assert axis.releases[-1].uploaded == "2026-10-12T00:00:00Z" and len(axis.releases[-1].files[0][1]) == 64
    assert lock.pins_of("0.5.23").metadata_sha256 == axis.releases[-1].files[0][1]
    assert any("/simple/sglang/" in hit for hit in index.no_cache_hits), "the listing is asked afresh"


def test_the_plan_works_offline_on_the_lock(tmp_path, index):
    matrix = _matrix(tmp_path)
    assert _plan("--matrix", str(matrix), "--update-lock", "--index-url", index.url).exit_code == 0
    hits = len(index.hits)
    result = _plan("--matrix", str(matrix), "--json")
    assert result.exit_code == 0, result.output
    assert len(index.hits) == hits, "plan never asks the index"
    assert [c["stack"]["sglang"] for c in json.loads(result.stdout)["cells"]] == ["0.5.22", "0.5.23"]


def test_a_new_release_moves_the_lock_and_says_what_moved(tmp_path, index):
    matrix = _matrix(tmp_path)
    assert _plan("--matrix", str(matrix), "--update-lock", "--index-url", index.url).exit_code == 0
    wheel = make_wheel(tmp_path / "wheels", "sglang", "0.5.24", {"sglang/__init__.py": ""},
                       metadata="Requires-Dist: torch==2.15.0\nRequires-Dist: flashinfer_python==0.7.4\n")
    index.add("sglang", wheel, upload_time="2026-11-30T00:00:00Z")
    yanked = make_wheel(tmp_path / "wheels", "sglang", "0.5.25", {"sglang/__init__.py": ""})
    index.add("sglang", yanked, yanked=True)
    (tmp_path / "wheels" / "sglang-0.5.26.post-x-py3-none-any.whl").write_bytes(b"")
    index.files["sglang-0.5.26.post-x-py3-none-any.whl"] = tmp_path / "wheels" / "sglang-0.5.26.post-x-py3-none-any.whl"
    index.projects["sglang"].append({"filename": "sglang-0.5.26.post-x-py3-none-any.whl", "sha256": "0" * 64,
                                     "yanked": False, "requires_python": ""})
    result = _plan("--matrix", str(matrix), "--update-lock", "--index-url", index.url, "--json")
    assert result.exit_code == 0, result.output
    assert "sglang: + 0.5.24, - 0.5.22" in result.stderr
    assert "sglang 0.5.25 is yanked: not chosen" in result.stderr
    assert "sglang-0.5.26.post-x-py3-none-any.whl skipped: its version is not PEP 440" in result.stderr
    assert [c["stack"]["torch"] for c in json.loads(result.stdout)["cells"]] == ["2.14.1", "2.15.0"]


def test_an_unreachable_index_leaves_the_old_lock(tmp_path, index):
    matrix = _matrix(tmp_path)
    assert _plan("--matrix", str(matrix), "--update-lock", "--index-url", index.url).exit_code == 0
    before = (tmp_path / "follow.lock.yaml").read_bytes()
    result = _plan("--matrix", str(matrix), "--update-lock", "--index-url", "http://127.0.0.1:9/simple")
    assert result.exit_code == 3
    assert "http://127.0.0.1:9/simple could not be read: refused" in result.output
    assert (tmp_path / "follow.lock.yaml").read_bytes() == before


def test_a_selector_that_selects_nothing_is_exit_2(tmp_path, index):
    matrix = _matrix(tmp_path, FOLLOW_MATRIX.replace("{latest: 2}", '{spec: ">=0.6"}'))
    result = _plan("--matrix", str(matrix), "--update-lock", "--index-url", index.url)
    assert result.exit_code == 2
    assert "sglang: spec >=0.6 selects nothing on the index (sglang has: 0.5.21, 0.5.22, 0.5.23)" in result.output


def test_a_missing_stale_or_corrupt_lock_is_an_error_with_the_remedy(tmp_path, index):
    matrix = _matrix(tmp_path)
    missing = _plan("--matrix", str(matrix))
    assert missing.exit_code == 2 and "has no lock file" in missing.output and "--update-lock" in missing.output
    assert _plan("--matrix", str(matrix), "--update-lock", "--index-url", index.url).exit_code == 0
    matrix.write_text(FOLLOW_MATRIX.replace("{latest: 2}", "{latest: 3}"))
    stale = _plan("--matrix", str(matrix))
    assert stale.exit_code == 2
    assert "follow.lock.yaml is stale: axis sglang is now 'latest 3', the lock chose for 'latest 2'" in stale.output
    (tmp_path / "follow.lock.yaml").write_text("schema: 1\naxes: [not, a, mapping\n")
    corrupt = _plan("--matrix", str(matrix))
    assert corrupt.exit_code == 2 and "lock" in corrupt.output and "restore it" in corrupt.output
    assert (tmp_path / "follow.lock.yaml").read_text().startswith("schema: 1\naxes: [not"), "never reset"


def test_derive_refuses_an_axis_it_would_set(tmp_path):
    matrix = _matrix(tmp_path, FOLLOW_MATRIX.replace('  cuda: ["13.1"]\n', '  cuda: ["13.1"]\n  torch: ["2.14.1"]\n'))
    result = _plan("--matrix", str(matrix))
    assert result.exit_code == 2
    assert "derive: {from: sglang} sets torch from each SGLang release's pins; remove the axis" in result.output


def test_update_lock_on_a_matrix_that_lists_its_versions_is_refused():
    result = _plan("--update-lock")
    assert result.exit_code == 2 and "lists its versions" in result.output


def test_the_pins_file_gains_a_row_for_a_new_release_and_reuses_the_rest(tmp_path, index):
    from stackforge.edges.index import IndexConfig
    from stackforge.plan.lock_resolve import refresh_pins_file
    from stackforge.plan.pins_file import PinsFile, read_pins_file, write_pins_file

    indexes = IndexConfig(index_url=index.url)
    first = refresh_pins_file(PinsFile("0.5.22", "", ()), indexes=indexes)
    assert [row.sglang for row in first.pins.rows] == ["0.5.22", "0.5.23"], "from `since` on"
    path = tmp_path / "sglang_pins.yaml"
    write_pins_file(path, first.pins)
    assert read_pins_file(path) == first.pins
    wheel = make_wheel(tmp_path / "wheels", "sglang", "0.5.24", {"sglang/__init__.py": ""},
                       metadata="Requires-Dist: torch==2.15.0\n")
    index.add("sglang", wheel)
    metadata_reads = sum(hit.endswith(".metadata") for hit in index.hits)
    second = refresh_pins_file(read_pins_file(path), indexes=indexes)
    assert second.changes == ("+ sglang 0.5.24: torch 2.15.0",)
    assert sum(hit.endswith(".metadata") for hit in index.hits) == metadata_reads + 1, "known rows are reused"


def test_derive_over_listed_versions_reads_their_pins(tmp_path, index):
    matrix = _matrix(tmp_path, FOLLOW_MATRIX.replace("{latest: 2}", '["0.5.21"]'))
    result = _plan("--matrix", str(matrix), "--update-lock", "--index-url", index.url, "--json")
    assert result.exit_code == 0, result.output
    (cell,) = json.loads(result.stdout)["cells"]
    assert (cell["stack"]["torch"], cell["stack"]["flashinfer"], cell["stack"]["kernel"]) == ("2.13.0", "0.6.18", "0.4.7")
    assert read_lock(tmp_path / "follow.lock.yaml").pins_of("0.5.21") is not None
