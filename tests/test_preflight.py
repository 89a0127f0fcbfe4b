"""Preflight against real HTTP indexes on loopback (PEP 691 JSON), including an unreachable one."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest

from stackforge.preflight import Availability, Wanted, check_package, classify_files, run_preflight
from stackforge.plan import load_knowledge, plan_matrix
from stackforge.matrix import load_matrix

COMPAT = Path(__file__).parent / "data" / "compat_min"
FILES = {
    "torch": ["torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "torch-2.14.1-cp312-cp312-win_amd64.whl"],
    "oldpkg": ["oldpkg-1.0.tar.gz"],
}


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        name = self.path.strip("/").split("/")[-1]
        self.server.hits.append(self.path)
        if name not in FILES:
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"meta": {"api-version": "1.0"}, "name": name,
                           "files": [{"filename": f, "url": f} for f in FILES[name]]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def index_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    server.hits = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple", server
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_classify_files_is_pure_and_strict():
    assert classify_files(FILES["torch"], "2.14.1", "3.11")[0] is Availability.AVAILABLE
    assert classify_files(FILES["torch"], "2.14.1", "3.12")[0] is Availability.MISSING
    assert classify_files(["x-1.0-cp310-abi3-manylinux2014_x86_64.whl"], "1.0", "3.12")[0] is Availability.AVAILABLE
    assert classify_files(["x-1.0-py3-none-any.whl"], "1.0", "3.12")[0] is Availability.AVAILABLE
    assert classify_files(FILES["oldpkg"], "1.0", "3.12")[0] is Availability.SDIST_ONLY


def test_check_package_against_a_real_index(index_url, tmp_path):
    import requests
    url, server = index_url
    session = requests.Session()
    status, detail = check_package(Wanted("torch", "2.14.1", url), "3.11", session=session, cache=tmp_path)
    assert status is Availability.AVAILABLE and detail.startswith("torch-2.14.1-cp311")
    assert check_package(Wanted("torch", "9.9", url), "3.11", session=session, cache=tmp_path)[0] is Availability.MISSING
    assert check_package(Wanted("nope", "1", url), "3.11", session=session, cache=tmp_path)[0] is Availability.MISSING
    hits = len(server.hits)
    check_package(Wanted("torch", "2.14.1", url), "3.11", session=session, cache=tmp_path)
    assert len(server.hits) == hits, "the second answer must come from the cache"


def test_unreachable_index_is_reported_and_the_rest_goes_on(index_url, tmp_path):
    import requests
    url, _ = index_url
    dead = f"http://127.0.0.1:{closed_port()}/simple"
    session = requests.Session()
    status, detail = check_package(Wanted("torch", "2.14.1", dead), "3.11", session=session, cache=tmp_path)
    assert status is Availability.UNREACHABLE and "ConnectionError" in detail
    assert check_package(Wanted("torch", "2.14.1", url), "3.11", session=session, cache=tmp_path)[0] \
        is Availability.AVAILABLE


def test_run_preflight_over_a_plan(tmp_path, monkeypatch, index_url):
    url, _ = index_url
    monkeypatch.setattr("stackforge.preflight.PYPI_SIMPLE", url)
    path = tmp_path / "m.yaml"
    path.write_text("schema: 1\ntargets: [h200-x8-nvswitch]\n"
                    "axes: {cuda: ['13.1'], torch: ['2.14.1'], flashinfer: ['0.7.2'], sglang: ['0.5.23'],"
                    " python: ['3.11'], flavour: [wheels], os: [debian12]}\n")
    report = run_preflight(plan_matrix(load_matrix(path), load_knowledge(COMPAT)), cache_dir=str(tmp_path / "c"))
    statuses = {c.package: c.status for c in report.checks}
    assert statuses["torch"] is Availability.AVAILABLE
    assert statuses["flashinfer-python"] is Availability.MISSING
    assert not report.ok
    assert "PREFLIGHT" in report.render()
