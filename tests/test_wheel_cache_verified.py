"""The wheel cache is verified: a reading never rests on an unpacked file that is not the wheel's.

A record of the wheel tier cites the official wheel's sha256, so the tree it was read from must be that
wheel's: an edited file (same size or not), a deleted one or an added one is noticed before the reading
counts, the tree is unpacked again with a one-line warning, and the reading is the true one. A wheel
that contradicts its own RECORD is refused. A corrupt index cache entry is rebuilt with a warning, never
reported as the network failing.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import http.server
import io
import json
import os
import threading
import zipfile
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.wheel_readings import ReadContext, ReadingStatus, ReleaseFile
from stackforge.edges.index import IndexUnreachableError, Release, index_config, releases
from stackforge.plan.preflight import Availability, Wanted, check_package
from stackforge.wheels.cache import MANIFEST_NAME, WheelCache, WheelFileError
from stackforge.wheels.tier import measure
from tests._wheel_helpers import COMM_SPEC, LoopbackIndex, comm_py, make_wheel, serve, sha256_of
from tests.test_preflight import _Index

GATE = "flashinfer/jit/comm.py"
SM120 = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie")


def _record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def with_record(wheel: Path, *, lie_about: str = "") -> Path:
    """``wheel`` with a ``*.dist-info/RECORD`` as the wheel spec writes it (``lie_about``: a member whose
    recorded hash is wrong)."""
    with zipfile.ZipFile(wheel) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    dist_info = next(name.split("/")[0] for name in members if name.endswith(".dist-info/METADATA"))
    rows = [_record_line(name, b"tampered" if name == lie_about else data) for name, data in members.items()]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([*rows, [f"{dist_info}/RECORD", "", ""]])
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr(f"{dist_info}/RECORD", text.getvalue())
    return wheel


@pytest.fixture()
def wheel(tmp_path) -> ReleaseFile:
    """flashinfer-python 0.6.16.post4 whose gate refuses sm_120, as the index lists it (a local file)."""
    path = with_record(make_wheel(tmp_path / "wheels", "flashinfer-python", "0.6.16.post4",
                                  {GATE: comm_py([9, 10]), "flashinfer/__init__.py": ""}))
    return ReleaseFile("flashinfer-python", "0.6.16.post4", path.name, str(path), sha256_of(path))


def _cache(tmp_path) -> WheelCache:
    """A new cache object on one root: what the next command opens."""
    return WheelCache.open(index_config(index_url="http://127.0.0.1:9/simple"), tmp_path / "cache")


def _measure(tmp_path, wheel: ReleaseFile, cache: WheelCache | None = None):
    release = Release(wheel.dist, wheel.version, (wheel,))
    return measure(COMM_SPEC, release, SM120, cache=cache or _cache(tmp_path)).reading


def _unpacked(tmp_path, wheel: ReleaseFile) -> Path:
    return tmp_path / "cache" / wheel.sha256


def _warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("stackforge: warning:")]


def test_an_edited_file_is_unpacked_again_and_the_fail_stays_a_fail(tmp_path, wheel, capsys):
    assert _measure(tmp_path, wheel).status is ReadingStatus.UNAVAILABLE
    gate = _unpacked(tmp_path, wheel) / GATE
    gate.write_text(comm_py([9, 10, 12]))                       # the edit that turned a fail into a pass
    reading = _measure(tmp_path, wheel)
    assert reading.status is ReadingStatus.UNAVAILABLE and "[9, 10]" in reading.summary
    (warning,) = _warnings(capsys)
    assert GATE in warning and "differs from the wheel's RECORD" in warning and wheel.filename in warning
    assert gate.read_text() == comm_py([9, 10])


def test_a_same_size_edit_is_caught_by_the_hash(tmp_path, wheel, capsys):
    cache = _cache(tmp_path)
    assert _measure(tmp_path, wheel, cache).status is ReadingStatus.UNAVAILABLE
    gate = _unpacked(tmp_path, wheel) / GATE
    text = gate.read_text()
    gate.write_text(text.replace("[9, 10]", "[9, 12]"))          # same size; the same cache object reads again
    assert len(gate.read_text()) == len(text)
    assert _measure(tmp_path, wheel, cache).status is ReadingStatus.UNAVAILABLE
    assert any(GATE in w for w in _warnings(capsys))
    assert gate.read_text() == text


def test_a_deleted_file_is_not_absent_in_the_release(tmp_path, wheel, capsys):
    assert _measure(tmp_path, wheel).status is ReadingStatus.UNAVAILABLE
    (_unpacked(tmp_path, wheel) / GATE).unlink()
    reading = _measure(tmp_path, wheel)
    assert reading.status is ReadingStatus.UNAVAILABLE, reading.summary
    (warning,) = _warnings(capsys)
    assert f"{GATE} is missing from the unpacked tree" in warning
    assert (_unpacked(tmp_path, wheel) / GATE).is_file()


def test_a_file_the_wheel_does_not_have_is_never_read(tmp_path, wheel, capsys):
    cache = _cache(tmp_path)
    root = cache.unpacked(wheel)
    (root / "flashinfer" / "planted.py").write_text("supported_major_versions = [12]\n")
    seen = cache.read(wheel, lambda tree: (tree / "flashinfer" / "planted.py").is_file()
                      and (tree / "flashinfer" / "planted.py").read_text())
    assert seen is False                                          # read again from a fresh tree, without it
    assert any("flashinfer/planted.py is not in the wheel" in w for w in _warnings(capsys))


def test_an_untouched_tree_is_read_without_a_warning_or_a_download(tmp_path, wheel, capsys):
    assert _measure(tmp_path, wheel).status is ReadingStatus.UNAVAILABLE
    manifest = json.loads((_unpacked(tmp_path, wheel) / MANIFEST_NAME).read_text())
    assert manifest["files"][GATE][1].startswith("sha256=") and "=" not in manifest["files"][GATE][1][7:]
    os.remove(wheel.url)                                           # a download would fail now
    assert _measure(tmp_path, wheel).status is ReadingStatus.UNAVAILABLE
    assert _warnings(capsys) == []


def test_a_corrupt_manifest_is_unpacked_again(tmp_path, wheel, capsys):
    assert _measure(tmp_path, wheel).status is ReadingStatus.UNAVAILABLE
    (_unpacked(tmp_path, wheel) / MANIFEST_NAME).write_text("{not json")
    assert _measure(tmp_path, wheel).status is ReadingStatus.UNAVAILABLE
    assert any("manifest is unreadable" in w for w in _warnings(capsys))


def test_a_wheel_that_contradicts_its_own_record_is_refused(tmp_path):
    path = with_record(make_wheel(tmp_path / "wheels", "flashinfer-python", "0.6.17", {GATE: comm_py([9, 10, 12])}),
                       lie_about=GATE)
    file = ReleaseFile("flashinfer-python", "0.6.17", path.name, str(path), sha256_of(path))
    with pytest.raises(WheelFileError, match="does not match the wheel's own RECORD"):
        _cache(tmp_path).unpacked(file)
    assert not (tmp_path / "cache" / file.sha256).exists()


# --------------------------------------------------------------------------- the index cache

@pytest.fixture()
def bisect_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("stackforge.wheels.bisect_campaign.load_readers", lambda: (COMM_SPEC,))
    index = LoopbackIndex()
    for version, majors in (("0.6.16.post4", [9, 10]), ("0.6.17", [9, 10, 12])):
        index.add("flashinfer-python", make_wheel(tmp_path / "w", "flashinfer-python", version,
                                                  {GATE: comm_py(majors)}))
    url, server = serve(index)
    yield (lambda: CliRunner().invoke(cli, ["bisect", "flashinfer-ar-fusion", "--target", "rtx-pro-6000-x8-pcie",
                                            "--index-url", url])), index
    server.shutdown()


@pytest.mark.parametrize("damage", ["{not json", "[]", '{"files": [{"nope": 1}]}', ""])
def test_a_corrupt_index_cache_entry_is_rebuilt_with_a_warning(tmp_path, bisect_cli, damage):
    invoke, index = bisect_cli
    first = invoke()
    assert first.exit_code == 0, first.output
    (entry,) = (tmp_path / "cache" / "index").glob("*.json")
    entry.write_text(damage)
    pages_before = sum(1 for hit in index.hits if hit.startswith("/simple/"))
    second = invoke()
    assert second.exit_code == 0, second.output
    assert "could not be read" not in second.output
    (warning,) = [line for line in second.output.splitlines() if line.startswith("stackforge: warning:")]
    assert str(entry) in warning and "asking the index again" in warning
    assert "0.6.16.post4" in second.stdout and "0.6.17" in second.stdout
    assert sum(1 for hit in index.hits if hit.startswith("/simple/")) == pages_before + 1
    assert json.loads(entry.read_text())["files"]                 # rebuilt
    third = invoke()
    assert third.exit_code == 0 and "warning" not in third.output   # and trusted again


def test_a_corrupt_cache_entry_with_the_index_down_is_still_the_network(tmp_path, capsys):
    served = LoopbackIndex()
    served.add("flashinfer-python", make_wheel(tmp_path / "w", "flashinfer-python", "0.6.17", {GATE: comm_py([12])}))
    url, server = serve(served)
    indexes = index_config(index_url=url)
    try:
        assert [r.version for r in releases("flashinfer-python", indexes=indexes, cache_dir=tmp_path / "index")] \
            == ["0.6.17"]
    finally:
        server.shutdown()
        server.server_close()
    (entry,) = (tmp_path / "index").glob("*.json")
    entry.write_text("{not json")
    with pytest.raises(IndexUnreachableError, match="could not be read"):
        releases("flashinfer-python", indexes=indexes, cache_dir=tmp_path / "index")
    assert any(str(entry) in w for w in _warnings(capsys))


def test_a_corrupt_preflight_cache_entry_is_rebuilt_not_the_index_missing(tmp_path, capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    server.hits = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        wanted, session = Wanted("torch", "2.14.1", url), requests.Session()
        assert check_package(wanted, "3.11", session=session, cache=tmp_path)[0] is Availability.AVAILABLE
        (entry,) = tmp_path.glob("*.json")
        entry.write_bytes(b"\x00\xff torn")
        status, detail = check_package(wanted, "3.11", session=session, cache=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert status is Availability.AVAILABLE, detail
    assert any(str(entry) in w for w in _warnings(capsys))
    assert json.loads(entry.read_text())["files"]


def test_a_full_disk_while_downloading_is_the_environment_not_the_network(tmp_path, wheel, monkeypatch):
    import errno
    import pathlib

    from stackforge.core.errors import EnvironmentFault
    real_open = pathlib.Path.open

    class Full(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    def open_(self, mode="r", *args, **kwargs):
        if mode == "wb" and self.suffix == ".whl" and self.parent == tmp_path / "cache":
            return Full()
        return real_open(self, mode, *args, **kwargs)
    monkeypatch.setattr(pathlib.Path, "open", open_)
    with pytest.raises(EnvironmentFault, match="writing into the wheel cache.*ENOSPC"):
        _cache(tmp_path).unpacked(wheel)
    assert not (tmp_path / "cache" / wheel.sha256).exists()
