"""The wheel cache: sha256-addressed, verified, unpacked atomically; nothing half-written on failure."""

from __future__ import annotations

import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from stackforge.core.errors import StackforgeError
from stackforge.edges.index import IndexConfig, IndexUnreachableError, find_release, releases
from stackforge.wheels.cache import WheelCache, WheelFileError, WheelHashMismatch, default_root
from tests._wheel_helpers import LoopbackIndex, comm_py, make_wheel, serve, sha256_of


@pytest.fixture
def served(tmp_path):
    index = LoopbackIndex()
    wheel = make_wheel(tmp_path / "w", "flashinfer-python", "0.6.17",
                       {"flashinfer/jit/comm.py": comm_py([9, 10, 12]), "csrc/k.cu": "__global__ void k() {}",
                        "flashinfer/data/cutlass/include/cute.hpp": "//", "flashinfer/libx.so": "\x7fELF",
                        "flashinfer/data/include/fmhaRunner.cuh": "// mSM == kSM_100"})
    index.add("flashinfer-python", wheel)
    url, server = serve(index)
    yield index, url, wheel
    server.shutdown()


def _release_file(url: str, version: str = "0.6.17"):
    return find_release(releases("flashinfer-python", indexes=IndexConfig(index_url=url)), version).files[0]


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_default_root_and_its_override():
    assert default_root({"STACKFORGE_WHEEL_CACHE": "/x/y"}) == Path("/x/y")
    assert default_root({}) == Path.home() / ".cache" / "stackforge" / "wheels"


def test_a_wheel_is_downloaded_verified_and_unpacked_under_its_sha256(served, tmp_path):
    index, url, wheel = served
    cache = WheelCache.open(IndexConfig(index_url=url), tmp_path / "cache")
    file = _release_file(url)
    root = cache.unpacked(file)
    assert root == tmp_path / "cache" / sha256_of(wheel)
    assert "supported_major_versions = [9, 10, 12]" in (root / "flashinfer" / "jit" / "comm.py").read_text()
    assert _leftovers(tmp_path / "cache") == [sha256_of(wheel)], "no temporary file or folder is left"
    assert not (root / "flashinfer" / "data" / "cutlass").exists() and not (root / "csrc" / "k.cu").exists()
    assert (root / "flashinfer" / "data" / "include" / "fmhaRunner.cuh").is_file()
    downloads = sum("/files/" in hit for hit in index.hits)
    assert cache.unpacked(file) == root
    assert sum("/files/" in hit for hit in index.hits) == downloads, "a cached wheel is not fetched again"


def test_a_sha256_mismatch_is_refused_and_nothing_is_kept(served, tmp_path):
    index, url, wheel = served
    index.projects["flashinfer-python"][0]["sha256"] = "0" * 64
    cache = WheelCache.open(IndexConfig(index_url=url), tmp_path / "cache")
    with pytest.raises(WheelHashMismatch) as caught:
        cache.unpacked(_release_file(url))
    assert sha256_of(wheel) in caught.value.one_line() and "refused" in caught.value.one_line()
    assert _leftovers(tmp_path / "cache") == []


def test_an_interrupted_download_leaves_nothing_half_written(served, tmp_path, monkeypatch):
    _, url, _ = served
    cache = WheelCache.open(IndexConfig(index_url=url), tmp_path / "cache")

    def interrupted_while_unpacking(wheel, into, file):
        (into / "half.py").write_text("x")
        raise KeyboardInterrupt
    monkeypatch.setattr("stackforge.wheels.cache._unzip", interrupted_while_unpacking)
    with pytest.raises(KeyboardInterrupt):
        cache.unpacked(_release_file(url))
    assert _leftovers(tmp_path / "cache") == []


def test_an_unreachable_file_host_is_an_index_error_and_leaves_nothing(served, tmp_path):
    _, url, _ = served
    file = _release_file(url)
    cache = WheelCache.open(IndexConfig(index_url=url), tmp_path / "cache")
    gone = replace(file, url="http://127.0.0.1:9/files/" + file.filename)
    with pytest.raises(IndexUnreachableError) as caught:
        cache.unpacked(gone)
    assert caught.value.exit_code == 3 and "refused" in caught.value.cause
    assert _leftovers(tmp_path / "cache") == []


def test_a_member_escaping_its_folder_is_refused(tmp_path):
    evil = tmp_path / "w" / "flashinfer_python-0.1-py3-none-any.whl"
    evil.parent.mkdir()
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("../escaped.py", "x = 1\n")
    index = LoopbackIndex()
    index.add("flashinfer-python", evil)
    url, server = serve(index)
    try:
        cache = WheelCache.open(IndexConfig(index_url=url), tmp_path / "cache")
        with pytest.raises(WheelFileError):
            cache.unpacked(_release_file(url, "0.1"))
    finally:
        server.shutdown()
    assert _leftovers(tmp_path / "cache") == [] and not (tmp_path / "escaped.py").exists()


def test_a_tree_unpacked_by_another_policy_is_unpacked_again(served, tmp_path):
    _, url, wheel = served
    cache = WheelCache.open(IndexConfig(index_url=url), tmp_path / "cache")
    stale = tmp_path / "cache" / sha256_of(wheel)
    stale.mkdir(parents=True)
    (stale / "old.txt").write_text("from an older stackforge")
    root = cache.unpacked(_release_file(url))
    assert root == stale and not (root / "old.txt").exists() and (root / "flashinfer" / "jit" / "comm.py").is_file()


def test_errors_are_stackforge_errors():
    assert issubclass(WheelHashMismatch, StackforgeError) and issubclass(WheelFileError, StackforgeError)
