"""`stackforge ci pull-request` against a local server speaking the GitHub REST API subset it uses;
conditional index requests (ETag / If-Modified-Since, 304); `ci github` from any directory."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import yaml
from click.testing import CliRunner

from stackforge.ci.github import WorkflowConfig, workflow
from stackforge.ci.pull_request import MAX_BODY, PullRequestSpec, fit_body, open_or_update
from stackforge.cli import cli
from stackforge.core.errors import SpecError
from stackforge.edges.index import IndexSource, project_files

TOKEN = "ghs_TESTTOKEN1234567890abcdef"


class FakeGitHub:
    """The pulls endpoints of one repository, in memory; every request is logged."""

    def __init__(self) -> None:
        self.pulls: list[dict[str, Any]] = []
        self.log: list[tuple[str, str, dict[str, Any] | None, str]] = []   # method, path+query, json, auth
        self.fail_with: int | None = None

    def handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        payload = json.loads(handler.rfile.read(length)) if length else None
        self.log.append((method, handler.path, payload, handler.headers.get("Authorization", "")))
        if handler.headers.get("Authorization") != f"Bearer {TOKEN}" or self.fail_with:
            return self._send(handler, self.fail_with or 401, {"message": f"Bad credentials {TOKEN}"})
        url = urlsplit(handler.path)
        parts = url.path.strip("/").split("/")
        if parts[:3] != ["repos", "o", "n"]:
            return self._send(handler, 404, {"message": "Not Found"})
        if method == "GET" and parts[3:] == []:
            return self._send(handler, 200, {"full_name": "o/n", "default_branch": "trunk"})
        if method == "GET" and parts[3:] == ["pulls"]:
            query = parse_qs(url.query)
            head = query["head"][0]
            found = [p for p in self.pulls if p["state"] == query["state"][0] and f"o:{p['head']}" == head]
            return self._send(handler, 200, found)
        if method == "POST" and parts[3:] == ["pulls"]:
            assert payload is not None
            if any(p["head"] == payload["head"] and p["state"] == "open" for p in self.pulls):
                return self._send(handler, 422, {"message": "Validation Failed",
                                                 "errors": [{"message": "A pull request already exists"}]})
            pull = {"number": len(self.pulls) + 1, "state": "open", **payload,
                    "html_url": f"https://github.example/o/n/pull/{len(self.pulls) + 1}"}
            self.pulls.append(pull)
            return self._send(handler, 201, pull)
        if method == "PATCH" and parts[3] == "pulls" and len(parts) == 5:
            pull = next(p for p in self.pulls if p["number"] == int(parts[4]))
            pull.update(payload or {})
            return self._send(handler, 200, pull)
        return self._send(handler, 404, {"message": "Not Found"})

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


@pytest.fixture
def github() -> Iterator[tuple[FakeGitHub, str]]:
    fake = FakeGitHub()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fake.handle(self, "GET")

        def do_POST(self) -> None:
            fake.handle(self, "POST")

        def do_PATCH(self) -> None:
            fake.handle(self, "PATCH")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _run(api: str, *args: str, body: str = "# report\n", token: str | None = TOKEN, tmp: Path) -> Any:
    report = tmp / "report.md"
    report.write_text(body, encoding="utf-8")
    env = {"GITHUB_API_URL": api, "GITHUB_TOKEN": token or ""}
    return CliRunner().invoke(cli, ["ci", "pull-request", "--repo", "o/n", "--branch", "watch/3f2a9c1e",
                                    "--title", "stackforge watch: 1 new release", "--body-file", str(report), *args],
                              env=env)


# --------------------------------------------------------------------------------------- pull requests


def test_opens_one_pull_request_then_updates_it(github: tuple[FakeGitHub, str], tmp_path: Path) -> None:
    fake, api = github
    first = _run(api, body="first report\n", tmp=tmp_path)
    assert first.exit_code == 0, first.output
    assert first.stdout == "opened pull request #1: https://github.example/o/n/pull/1\n"
    assert fake.pulls[0]["base"] == "trunk"            # the default branch, asked of the API
    assert fake.pulls[0]["head"] == "watch/3f2a9c1e"
    second = _run(api, body="second report\n", tmp=tmp_path)
    assert second.exit_code == 0, second.output
    assert second.stdout == "updated pull request #1: https://github.example/o/n/pull/1\n"
    assert len(fake.pulls) == 1 and fake.pulls[0]["body"] == "second report\n"
    methods = [(method, urlsplit(path).path) for method, path, _, _ in fake.log]
    assert methods == [("GET", "/repos/o/n/pulls"), ("GET", "/repos/o/n"), ("POST", "/repos/o/n/pulls"),
                       ("GET", "/repos/o/n/pulls"), ("PATCH", "/repos/o/n/pulls/1")]
    assert parse_qs(urlsplit(fake.log[0][1]).query) == {"head": ["o:watch/3f2a9c1e"], "state": ["open"]}
    assert all(auth == f"Bearer {TOKEN}" for *_, auth in fake.log)
    assert TOKEN not in first.output + second.output


def test_a_closed_pull_request_of_the_branch_is_not_updated(github: tuple[FakeGitHub, str], tmp_path: Path) -> None:
    fake, api = github
    fake.pulls.append({"number": 1, "state": "closed", "head": "watch/3f2a9c1e", "base": "trunk"})
    result = _run(api, "--base", "main", tmp=tmp_path)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("opened pull request #2")
    assert fake.pulls[1]["base"] == "main"
    assert ("GET", "/repos/o/n") not in [(m, urlsplit(p).path) for m, p, _, _ in fake.log]


def test_refusal_is_one_line_exit_3_without_the_token(github: tuple[FakeGitHub, str], tmp_path: Path) -> None:
    fake, api = github
    fake.fail_with = 403
    result = _run(api, tmp=tmp_path)
    assert result.exit_code == 3
    assert "HTTP 403" in result.output and "pull-requests: write" in result.output
    assert TOKEN not in result.output            # the server echoed it; it is redacted
    assert "***" in result.output
    assert result.output.count("\n") == 1 and result.output.startswith("stackforge: error: ")


def test_no_token_is_bad_input(github: tuple[FakeGitHub, str], tmp_path: Path) -> None:
    fake, api = github
    result = _run(api, token=None, tmp=tmp_path)
    assert result.exit_code == 2 and "GITHUB_TOKEN" in result.output
    assert fake.log == []


def test_unreachable_api_is_exit_3(tmp_path: Path) -> None:
    result = _run("http://127.0.0.1:9", tmp=tmp_path)
    assert result.exit_code == 3 and "could not be sent" in result.output and TOKEN not in result.output


@pytest.mark.parametrize("field, value", [("repo", "o/n/x"), ("repo", "-o/n"), ("branch", "watch/../x"),
                                          ("branch", "-f"), ("branch", "a b"), ("title", "two\nlines"),
                                          ("title", " ")])
def test_bad_spec_is_refused(field: str, value: str) -> None:
    values = {"repo": "o/n", "branch": "watch/1", "title": "t", "body": "b", field: value}
    with pytest.raises(SpecError):
        PullRequestSpec(**values)


def test_credentials_in_the_api_url_are_refused(tmp_path: Path) -> None:
    result = _run("https://user:pw@api.example", tmp=tmp_path)
    assert result.exit_code == 2 and "pw" not in result.output


def test_long_body_is_cut_to_githubs_limit_with_a_note() -> None:
    body = "```diff\n" + "+x\n" * 40_000 + "```\n"
    fitted = fit_body(body)
    assert len(fitted) <= MAX_BODY
    assert fitted.count("```") % 2 == 0 and "truncated" in fitted
    assert fit_body("short\n") == "short\n"


def test_open_or_update_library_call(github: tuple[FakeGitHub, str]) -> None:
    fake, api = github
    outcome = open_or_update(PullRequestSpec(repo="o/n", branch="watch/1", title="t", body="b", base="main"),
                             token=TOKEN, api=api)
    assert (outcome.action, outcome.number) == ("opened", 1)


# ------------------------------------------------------------------------------ conditional index requests


class _Index(BaseHTTPRequestHandler):
    """One PEP 691 page with an ETag and a Last-Modified; answers 304 when the client sends them back."""

    etag = '"v1"'
    modified = "Sat, 05 Dec 2026 10:00:00 GMT"
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        if self.headers.get("If-None-Match") == self.etag:
            self.send_response(304)
            self.send_header("ETag", self.etag)
            self.end_headers()
            return
        page = json.dumps({"meta": {"api-version": "1.1"}, "name": "demo", "files": [
            {"filename": "demo-1.0-py3-none-any.whl", "url": "demo-1.0-py3-none-any.whl",
             "hashes": {"sha256": "ab" * 32}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.send_header("ETag", self.etag)
        self.send_header("Last-Modified", self.modified)
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: Any) -> None:
        pass


def test_index_pages_are_asked_conditionally_and_304_keeps_the_cache(tmp_path: Path) -> None:
    _Index.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        source = IndexSource(f"http://127.0.0.1:{server.server_address[1]}/simple", index=True)
        session = requests.Session()
        first = project_files(source, "demo", session=session, cache=tmp_path, ttl_s=0)
        second = project_files(source, "demo", session=session, cache=tmp_path, ttl_s=0)
    finally:
        server.shutdown()
        server.server_close()
    assert first == second and first is not None and first[0].filename == "demo-1.0-py3-none-any.whl"
    assert "If-None-Match" not in _Index.seen[0]
    assert _Index.seen[1]["If-None-Match"] == '"v1"'
    assert _Index.seen[1]["If-Modified-Since"] == "Sat, 05 Dec 2026 10:00:00 GMT"
    stored = json.loads(next(tmp_path.iterdir()).read_text())
    assert stored["etag"] == '"v1"' and stored["last_modified"] == _Index.modified


# ------------------------------------------------------------------------------------ ci github anywhere


def test_ci_github_default_matrix_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["ci", "github", "--out", "x.yml"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((tmp_path / "x.yml").read_text())["env"]["STACKFORGE_MATRIX"] == "matrices/default.yaml"
    missing = CliRunner().invoke(cli, ["ci", "github", "--matrix", "matrices/nope.yaml", "--out", "y.yml"])
    assert missing.exit_code == 2 and not (tmp_path / "y.yml").exists()


# ------------------------------------------------------------------------------------------ the workflow


def test_workflow_polls_often_and_only_the_pr_job_may_write() -> None:
    data = workflow(WorkflowConfig(gpu_labels=("sm_120",)))
    crons = [entry["cron"] for entry in data["on"]["schedule"]]
    assert crons[1].split()[0] in ("*/10", "*/15")
    writers = {name: job["permissions"] for name, job in data["jobs"].items()
               if "write" in (job.get("permissions") or {}).values()}
    assert writers["propose"] == {"contents": "write", "pull-requests": "write"}
    assert data["permissions"] == {"contents": "read"}
    propose = "\n".join(step.get("run", "") for step in data["jobs"]["propose"]["steps"])
    assert "stackforge ci pull-request" in propose and "stackforge-watch-state" in propose
    watch = data["jobs"]["watch"]
    assert all(step.get("uses", "").split("@")[0] != "actions/cache" or "index" in step["with"]["path"]
               for step in watch["steps"]), "the watch state must not live only in the Actions cache"


def test_nightly_fan_out_since_the_previous_plan_names_only_the_changed_stacks(tmp_path: Path) -> None:
    runner = CliRunner()
    repo = Path(__file__).resolve().parents[1]
    planned = runner.invoke(cli, ["plan", "--matrix", str(repo / "matrices" / "default.yaml"), "--json"])
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.stdout)
    kept = sorted({c["stack_id"] for c in plan["cells"] if c["status"] == "kept"})
    assert len(kept) >= 3
    added, moved = kept[0], kept[1]
    previous = json.loads(planned.stdout)
    previous["cells"] = [c for c in previous["cells"] if c["stack_id"] != added]   # the lock diff adds it
    for cell in previous["cells"]:
        if cell["stack_id"] == moved:
            cell["derived"]["base_image"] = "nvidia/cuda:0.0-other"                # its inputs changed
    (tmp_path / "plan.json").write_text(planned.stdout, encoding="utf-8")
    (tmp_path / "previous.json").write_text(json.dumps(previous), encoding="utf-8")
    args = ["ci", "shards", "--plan", str(tmp_path / "plan.json"), "--shards", "2", "--gpu-label", "sm_120"]
    full = runner.invoke(cli, args)
    since = runner.invoke(cli, [*args, "--since", str(tmp_path / "previous.json")])
    assert full.exit_code == 0 and since.exit_code == 0, since.output

    def only(result: Any, key: str) -> set[str]:
        outputs = dict(line.split("=", 1) for line in result.stdout.splitlines())
        return {i for e in json.loads(outputs[key])["include"] for i in e["only"].split()}

    assert "incremental=false" in full.stdout and only(full, "cpu") == set()   # "": every stack of the shard
    assert "incremental=true" in since.stdout
    assert only(since, "cpu") == {added, moved}
    assert only(since, "gpu") <= {added, moved}
    assert f"{len(kept) - 2} stack(s) unchanged" in since.stderr
    same = runner.invoke(cli, [*args, "--since", str(tmp_path / "plan.json")])
    assert "has-stacks=false" in same.stdout        # nothing changed: no build, no probe
