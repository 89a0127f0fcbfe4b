"""Preflight against real HTTP indexes on loopback (PEP 691 JSON), including an unreachable one."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.edges.pip_config import parse_pip_config_list
from stackforge.plan.matrix_file import load_matrix
from stackforge.plan.planner import load_knowledge, plan_matrix
from stackforge.plan.preflight import (
    Availability,
    IndexConfig,
    IndexSource,
    Wanted,
    check_package,
    classify_files,
    find_package,
    index_config,
    run_preflight,
)

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


def test_run_preflight_over_a_plan(tmp_path, index_url):
    url, _ = index_url
    path = tmp_path / "m.yaml"
    path.write_text("schema: 1\ntargets: [h200-x8-nvswitch]\n"
                    "axes: {cuda: ['13.1'], torch: ['2.14.1'], flashinfer: ['0.7.2'], sglang: ['0.5.23'],"
                    " python: ['3.11'], flavour: [wheels], os: [debian12]}\n")
    report = run_preflight(plan_matrix(load_matrix(path), load_knowledge(COMPAT)), cache_dir=str(tmp_path / "c"),
                           indexes=IndexConfig(index_url=url))
    statuses = {c.package: c.status for c in report.checks}
    assert statuses["torch"] is Availability.AVAILABLE
    assert statuses["flashinfer-python"] is Availability.MISSING
    assert not report.ok
    assert "PREFLIGHT" in report.render()


# ------------------------------------------------------------------------- pip's index configuration


def test_pip_config_list_is_read_with_pips_precedence():
    text = ("global.index-url='https://global/simple'\n"
            "install.index-url='https://install/simple'\n"
            "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
            ":env:.find-links='/opt/wheels'\n"
            "global.find-links='/elsewhere'\n"
            "not a setting line\n")
    assert parse_pip_config_list(text).values() == {"index-url": "https://install/simple",
                                                    "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
                                                    "find-links": "/opt/wheels"}


def test_index_config_command_line_then_environment_then_files():
    files = parse_pip_config_list("global.index-url='https://files/simple'\nglobal.extra-index-url='https://x/simple'\n"
                                  "global.cert='/ca.pem'\n")
    assert index_config(pip_config=files).index_url == "https://files/simple"
    from_env = index_config(pip_config=files, env={"PIP_INDEX_URL": "https://env/simple",
                                                     "PIP_FIND_LINKS": "/w1 /w2", "HOME": "/root"})
    assert (from_env.index_url, from_env.find_links, from_env.cert) == ("https://env/simple", ("/w1", "/w2"),
                                                                        "/ca.pem")
    given = index_config(index_url="https://cli/simple", extra_index_urls=["https://y/simple"],
                         pip_config=files, env={"PIP_INDEX_URL": "https://env/simple"})
    # --index-url replaces the configured index; --extra-index-url adds to the configured ones (as in pip).
    assert given.index_url == "https://cli/simple"
    assert given.extra_index_urls == ("https://x/simple", "https://y/simple")
    assert index_config().index_url == "https://pypi.org/simple"
    assert index_config(env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/w"}).sources("pypi") == (
        IndexSource("/w", index=False),)


class _HtmlIndex(http.server.BaseHTTPRequestHandler):
    """A PEP 503 mirror: HTML only, whatever the client asks for (as many mirrors are)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        name = self.path.strip("/").split("/")[-1]
        if name not in FILES:
            self.send_response(404)
            self.end_headers()
            return
        links = "".join(f'<a href="../../files/{f}#sha256=00">{f}</a><br>' for f in FILES[name])
        body = f"<!DOCTYPE html><html><body>{links}</body></html>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_an_html_only_mirror_is_read(tmp_path):
    import requests
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlIndex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        mirror = IndexConfig(index_url=f"http://127.0.0.1:{server.server_address[1]}/simple")
        status, detail, where = find_package(Wanted("torch", "2.14.1", "pypi"), "3.11", session=requests.Session(),
                                             cache=tmp_path, indexes=mirror)
    finally:
        server.shutdown()
        server.server_close()
    assert status is Availability.AVAILABLE and detail.startswith("torch-2.14.1-cp311")
    assert where == mirror.index_url


def _file_index(root: Path, files: dict[str, list[str]]) -> str:
    """A PEP 503 index on disk, laid out like /opt/pypi/simple: <project>/index.html linking ../../files/."""
    (root / "files").mkdir(parents=True)
    for project, names in files.items():
        (root / "simple" / project).mkdir(parents=True)
        links = "".join(f'<a href="../../files/{n}#sha256=00">{n}</a>\n' for n in names)
        (root / "simple" / project / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
        for name in names:
            (root / "files" / name).write_bytes(b"")
    return (root / "simple").as_uri()


def test_file_indexes_and_find_links_folders_are_read(tmp_path):
    import requests
    session = requests.Session()
    index = _file_index(tmp_path / "mirror", {"torch": FILES["torch"]})
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "sglang-0.5.23-py3-none-any.whl").write_bytes(b"")
    (wheels / "other-0.5.23-py3-none-any.whl").write_bytes(b"")
    config = IndexConfig(index_url=index, find_links=(str(wheels),))

    def look(package, version):
        return find_package(Wanted(package, version, "pypi"), "3.11", session=session, cache=tmp_path / "c",
                            indexes=config)

    assert look("torch", "2.14.1")[:1] == (Availability.AVAILABLE,) and look("torch", "2.14.1")[2] == index
    assert look("sglang", "0.5.23") == (Availability.AVAILABLE, "sglang-0.5.23-py3-none-any.whl", str(wheels))
    assert look("other", "9.9")[0] is Availability.MISSING        # a find-links file of another version
    assert look("flashinfer-python", "0.7.2")[0] is Availability.MISSING
    gone = IndexConfig(index_url=(tmp_path / "nowhere" / "simple").as_uri())
    assert find_package(Wanted("torch", "2.14.1", "pypi"), "3.11", session=session, cache=tmp_path / "c",
                        indexes=gone)[0] is Availability.UNREACHABLE


# ------------------------------------------------------------------------------ plan --preflight (CLI)


STACK_FILES = {"torch": ["torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl"],
               "flashinfer-python": ["flashinfer_python-0.7.2-py3-none-any.whl"],
               "sglang": ["sglang-0.5.23-py3-none-any.whl"],
               "sglang-kernel": ["sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl"]}


@pytest.fixture
def preflight_cli(tmp_path, monkeypatch):
    """A one-stack matrix, and pip's configuration reduced to what each test sets (no config files).

    The mirrors here hold placeholder files, so the stack locks are not resolved (--no-resolve); the
    resolution of --preflight is tested against PyPI in tests/test_stack_lock_pypi.py.
    """
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", str(tmp_path / "wheels"))   # the ABI reading's cache
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    matrix = tmp_path / "m.yaml"
    matrix.write_text("schema: 1\ntargets: [rtx-pro-6000-x8-pcie]\naxes: {cuda: ['13.1'], torch: ['2.14.1'], "
                      "flashinfer: ['0.7.2'], sglang: ['0.5.23'], python: ['3.12']}\n")

    def invoke(*args: str):
        return CliRunner().invoke(cli, ["plan", "--matrix", str(matrix), "--preflight", "--no-resolve", "--cache-dir",
                                        str(tmp_path / "cache"), *args])
    return invoke


def test_preflight_passes_against_the_mirror_the_build_is_given(preflight_cli, tmp_path):
    result = preflight_cli("--index-url", _file_index(tmp_path / "mirror", STACK_FILES))
    assert result.exit_code == 0, result.output
    preflight_lines = [line.split()[0] for line in result.stdout.partition("PREFLIGHT")[2].splitlines()[1:] if line]
    # the mirror's files are placeholders, not zips: the ABI reading says it skipped them, and that is no failure
    assert [word for word in preflight_lines if word != "warning:"] == ["available"] * len(STACK_FILES), result.stdout
    assert all(line.strip().startswith("warning: abi: reading skipped:") and "not a zip" in line
               for line in result.stdout.splitlines() if line.strip().startswith("warning:")), result.stdout


def test_preflight_exits_1_when_a_pinned_file_is_missing(preflight_cli, tmp_path):
    mirror = _file_index(tmp_path / "mirror", {**STACK_FILES, "sglang": []})
    result = preflight_cli("--index-url", mirror)
    assert result.exit_code == 1, result.output
    assert "missing" in result.stdout and "sglang==0.5.23" in result.stdout
    assert "preflight failed: 1 missing, 0 unreachable" in result.stdout
    as_json = preflight_cli("--json", "--index-url", mirror)
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["preflight"]["ok"] is False


def test_preflight_exits_1_when_the_index_is_unreachable(preflight_cli, tmp_path):
    result = preflight_cli("--index-url", f"http://127.0.0.1:{closed_port()}/simple")
    assert result.exit_code == 1, result.output
    assert result.stdout.count("unreachable ") == len(STACK_FILES)
    mirror = _file_index(tmp_path / "mirror", STACK_FILES)
    assert preflight_cli("--index-url", mirror).exit_code == 0


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An index that wants credentials it does not accept: every page answers 401."""

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="index"')
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_index_credentials_are_never_shown_nor_stored(preflight_cli, tmp_path, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # An index that asks for credentials answers 401: reported, with nothing of the URL's secrets.
        shown = preflight_cli("--index-url", f"http://127.0.0.1:{server.server_port}/simple")
        as_json = preflight_cli("--json", "--index-url", f"http://127.0.0.1:{server.server_port}/simple")
        # Credentials in the URL are refused before any request (tests/test_index_story.py has more).
        refused = preflight_cli("--index-url", f"http://alice:S3CRETTOKEN@127.0.0.1:{server.server_port}/simple")
    finally:
        server.shutdown()
        server.server_close()
    assert shown.exit_code == 1 and "401" in shown.stdout and "unreachable" in shown.stdout, shown.output
    assert json.loads(as_json.stdout)["preflight"]["indexes"]["index_url"].startswith("http://127.0.0.1:")
    assert refused.exit_code == 2 and "carries credentials" in refused.output, refused.output
    stored = "".join(path.read_text() for path in (tmp_path / "cache").rglob("*") if path.is_file())
    for text in (shown.output, as_json.output, refused.output, stored):
        assert "S3CRETTOKEN" not in text and "alice" not in text


def test_redact_urls_removes_credentials_from_exception_text():
    from stackforge.edges.pip_config import redact_urls, without_credentials
    assert without_credentials("https://u:p@host/simple") == "https://host/simple"
    text = "401 Client Error: Unauthorized for url: https://u:tok@host/simple/pip/"
    assert redact_urls(text, ["https://u:tok@host/simple"]) == \
        "401 Client Error: Unauthorized for url: https://host/simple/pip/"
    assert redact_urls("see ftp://x:y@h/a and http://h/b") == "see ftp://h/a and http://h/b"


def test_a_multi_line_setting_is_unescaped():
    # pip config list prints values with repr(): lines of a multi-line value come out as \n escapes.
    config = parse_pip_config_list("global.extra-index-url='\\nhttps://a/simple\\nhttps://b/simple'\n"
                                   "global.cert='/c.pem'\n:env:.timeout=\"30\"\n")
    assert config.setting("extra-index-url").value.split() == ["https://a/simple", "https://b/simple"]
    assert (config.setting("cert").value, config.setting("timeout").value) == ("/c.pem", "30")


def test_a_multi_line_setting_read_from_a_real_pip(tmp_path, monkeypatch):
    import sys

    from stackforge.edges.pip_config import read_pip_config
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url =\n    https://a.example/simple\n    https://b.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    extra = read_pip_config(sys.executable).setting("extra-index-url")
    assert extra is not None and extra.value.split() == ["https://a.example/simple", "https://b.example/simple"]
