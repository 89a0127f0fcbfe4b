"""Defects found in review (watch, wheel cache, CI pull request): each test fails on the code before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackforge.core.wheel_readings import ReleaseFile
from stackforge.edges.index import index_config
from stackforge.wheels.cache import WheelCache
from tests._wheel_helpers import comm_py, make_wheel, sha256_of


def test_a_reader_that_looks_for_a_file_the_wheel_lacks_reads_once_without_a_new_download(tmp_path, capsys):
    # Opening a path the wheel does not have (a reader trying a file that moved, catching the OSError) is a
    # reading of absence, not a tree that differs from the wheel: no warning, no re-unpack, no WheelFileError.
    path = make_wheel(tmp_path / "wheels", "flashinfer-python", "0.6.16", {"flashinfer/jit/comm.py": comm_py([9]),
                                                                           "flashinfer/__init__.py": ""})
    wheel = ReleaseFile("flashinfer-python", "0.6.16", path.name, str(path), sha256_of(path))
    cache = WheelCache.open(index_config(index_url="http://127.0.0.1:9/simple"), tmp_path / "cache")

    def reader(root: Path) -> str:
        try:
            return (root / "flashinfer" / "jit" / "moved.py").read_text()
        except FileNotFoundError:
            return "absent"

    assert cache.read(wheel, reader) == "absent"
    assert "warning" not in capsys.readouterr().err


class _ListAnsweringApi:
    """A GitHub API stand-in whose every answer is JSON but a list: a proxy or an odd Enterprise server."""

    def request(self, method, url, **kwargs):
        import requests

        response = requests.Response()
        response.status_code = 200
        # GET .../pulls finds nothing (an empty list, as it should); GET the repository answers a list too.
        response._content = b"[]"
        response.headers["Content-Type"] = "application/json"
        return response


def test_an_api_answer_that_is_not_an_object_is_a_one_line_api_error_not_a_traceback():
    from stackforge.ci.pull_request import GitHubApiError, PullRequestSpec, open_or_update

    spec = PullRequestSpec(repo="o/n", branch="watch/abc", title="t", body="b")
    with pytest.raises(GitHubApiError, match="not a JSON object"):
        open_or_update(spec, token="tok", session=_ListAnsweringApi())
