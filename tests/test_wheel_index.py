"""The index client shared by preflight and the wheel tier: releases, hashes, yanked, pre-releases, causes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from stackforge.edges.index import (
    IndexConfig,
    IndexUnreachableError,
    find_release,
    releases,
    with_credentials,
)
from tests._wheel_helpers import LoopbackIndex, comm_py, make_wheel, serve, sha256_of

VERSIONS = ["0.6.9", "0.6.16.post4", "0.6.17", "0.6.18rc1", "0.6.10"]


def _index(tmp_path: Path, *, html: bool = False) -> LoopbackIndex:
    index = LoopbackIndex(html=html)
    for version in VERSIONS:
        index.add("flashinfer-python", make_wheel(tmp_path / "w", "flashinfer-python", version,
                                                  {"flashinfer/jit/comm.py": comm_py([9, 10])}),
                  requires_python=">=3.10")
    index.add("flashinfer-python", make_wheel(tmp_path / "w", "flashinfer-python", "0.6.11",
                                              {"flashinfer/jit/comm.py": comm_py([9])}), yanked=True)
    sdist = tmp_path / "w" / "flashinfer_python-0.6.12.tar.gz"
    sdist.write_bytes(b"not really a tarball")
    index.add("flashinfer-python", sdist)
    return index


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("html", [False, True], ids=["pep691-json", "pep503-html"])
def test_releases_sorted_by_version_without_pre_releases_or_yanked_files(tmp_path, html):
    index = _index(tmp_path, html=html)
    url, server = serve(index)
    try:
        found = releases("Flashinfer_Python", indexes=IndexConfig(index_url=url), cache_dir=tmp_path / "c")
        assert [r.version for r in found] == ["0.6.9", "0.6.10", "0.6.12", "0.6.16.post4", "0.6.17"]
        wheel = found[-1].files[0]
        assert (wheel.dist, wheel.kind, wheel.index, wheel.requires_python) == \
            ("flashinfer-python", "wheel", url, ">=3.10")
        assert wheel.sha256 == sha256_of(tmp_path / "w" / wheel.filename)
        assert wheel.url.endswith("/files/" + wheel.filename) and wheel.url.startswith("http://127.0.0.1")
        assert [f.kind for f in find_release(found, "0.6.12").files] == ["sdist"]
        everything = releases("flashinfer-python", indexes=IndexConfig(index_url=url), include_pre=True,
                              include_yanked=True, cache_dir=tmp_path / "c")
        assert [r.version for r in everything] == ["0.6.9", "0.6.10", "0.6.11", "0.6.12", "0.6.16.post4",
                                                   "0.6.17", "0.6.18rc1"]
        assert find_release(everything, "0.6.11").yanked
    finally:
        server.shutdown()


def test_index_pages_are_cached_on_disk(tmp_path):
    index = _index(tmp_path)
    url, server = serve(index)
    try:
        releases("flashinfer-python", indexes=IndexConfig(index_url=url), cache_dir=tmp_path / "c")
        hits = len(index.hits)
        releases("flashinfer-python", indexes=IndexConfig(index_url=url), cache_dir=tmp_path / "c")
        assert len(index.hits) == hits, "the second listing must come from the cache"
    finally:
        server.shutdown()


def test_the_same_file_in_two_locations_is_taken_from_the_one_with_a_sha256(tmp_path):
    index = _index(tmp_path)
    url, server = serve(index)
    folder = tmp_path / "w"   # a find-links folder: same files, no hashes
    try:
        found = releases("flashinfer-python", indexes=IndexConfig(index_url=None, extra_index_urls=(url,),
                                                                  find_links=(str(folder),)),
                         cache_dir=tmp_path / "c")
        wheel = find_release(found, "0.6.17").files[0]
        assert wheel.index == url and wheel.sha256 == sha256_of(folder / wheel.filename)
        only_folder = releases("flashinfer-python", indexes=IndexConfig(index_url=None, find_links=(str(folder),)))
        assert find_release(only_folder, "0.6.17").files[0].sha256 == ""
        assert find_release(only_folder, "0.6.17").files[0].index == str(folder)
    finally:
        server.shutdown()


def test_a_file_index_with_pages_and_hashes_is_read(tmp_path):
    wheel = make_wheel(tmp_path / "files", "flashinfer-python", "0.6.17", {"flashinfer/jit/comm.py": comm_py([9])})
    page = tmp_path / "simple" / "flashinfer-python"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="../../files/{wheel.name}#sha256={sha256_of(wheel)}" '
                                     f'data-requires-python="&gt;=3.10">{wheel.name}</a>')
    found = releases("flashinfer-python", indexes=IndexConfig(index_url=(tmp_path / "simple").as_uri()))
    (file,) = found[0].files
    assert (found[0].version, file.sha256, file.requires_python) == ("0.6.17", sha256_of(wheel), ">=3.10")
    assert file.url == wheel.resolve().as_uri()


def test_an_index_without_the_project_lists_no_release(tmp_path):
    url, server = serve(LoopbackIndex())
    try:
        assert releases("flashinfer-python", indexes=IndexConfig(index_url=url)) == []
    finally:
        server.shutdown()


def test_an_unreachable_index_names_its_url_and_the_cause(tmp_path):
    refused = f"http://127.0.0.1:{closed_port()}/simple"
    with pytest.raises(IndexUnreachableError) as caught:
        releases("sglang", indexes=IndexConfig(index_url=refused), cache_dir=tmp_path / "c")
    assert caught.value.exit_code == 3 and refused in caught.value.one_line()
    assert "refused" in caught.value.cause
    with pytest.raises(IndexUnreachableError) as caught:
        releases("sglang", indexes=IndexConfig(index_url="http://no-such-host.invalid/simple"))
    assert caught.value.cause.startswith("DNS")
    url, server = serve(LoopbackIndex())
    try:   # TLS spoken to a plain-HTTP server: the handshake fails
        with pytest.raises(IndexUnreachableError) as caught:
            releases("sglang", indexes=IndexConfig(index_url=url.replace("http://", "https://")))
        assert caught.value.cause.startswith("TLS")
    finally:
        server.shutdown()
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


def test_credentials_are_neither_cached_nor_shown_but_used_for_downloads(tmp_path):
    index = _index(tmp_path)
    url, server = serve(index)
    secret = url.replace("http://", "http://alice:S3CRET@")
    try:
        found = releases("flashinfer-python", indexes=IndexConfig(index_url=secret), cache_dir=tmp_path / "c")
        file = find_release(found, "0.6.17").files[0]
        assert "S3CRET" not in file.url + file.index
        assert "S3CRET" not in "".join(p.read_text() for p in (tmp_path / "c").iterdir())
        assert "alice:S3CRET@" in with_credentials(file.url, IndexConfig(index_url=secret))
    finally:
        server.shutdown()
