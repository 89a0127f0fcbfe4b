"""``stackforge doctor``: the pure judgement with made-up facts, and the real command against the real
engine, an unreachable engine, and a stand-in nvidia-smi."""

from __future__ import annotations

import functools
import http.server
import json
import threading
import time
from pathlib import Path

from click.testing import CliRunner
from test_gpu_assignment import MIXED_SMI, fake_smi

from stackforge.cli import cli
from stackforge.core.model import Interconnect, Target
from stackforge.doctor.checks import (
    BuildxFacts,
    CaFacts,
    CheckStatus,
    DiskFacts,
    EngineFacts,
    HostFacts,
    IndexFacts,
    RegistryFacts,
    build_report,
    runnable_targets,
)
from stackforge.doctor.facts import pip_ca, pip_indexes
from stackforge.edges.gpus import HostGpu, HostGpus
from stackforge.edges.pip_config import PipConfig, PipSetting, parse_pip_config_list

GIB = 1024 ** 3
RTX8 = Target("rtx-pro-6000-x8-pcie", "RTX PRO 6000", "12.0", 8, Interconnect.PCIE)
RTX2 = Target("rtx-pro-6000-x2-pcie", "RTX PRO 6000", "12.0", 2, Interconnect.PCIE)
B200 = Target("b200-x8", "B200", "10.0", 8, Interconnect.NVSWITCH, multicast=True)
TARGETS = {t.name: t for t in (RTX8, RTX2, B200)}
TWO_RTX = HostGpus(True, "2 GPU(s)", ("RTX", "RTX"), "590.48.01",
                   (HostGpu(0, "NVIDIA RTX PRO 6000", "12.0"), HostGpu(1, "NVIDIA RTX PRO 6000", "12.0")))
NO_GPU = HostGpus(False, "nvidia-smi not found on the host")


def healthy(**changes) -> HostFacts:
    facts = {
        "engine": EngineFacts("unix:///var/run/docker.sock", False, True, server_version="27.3.1",
                              api_version="1.47", platform="linux/amd64", data_root="/var/lib/docker",
                              runtimes=("nvidia", "runc")),
        "buildx": BuildxFacts(True, "github.com/docker/buildx v0.17.1"),
        "disks": (DiskFacts("engine data root", "/var/lib/docker", 100 * GIB, 200 * GIB),
                  DiskFacts("working directory", "/work", 50 * GIB, 200 * GIB)),
        "gpus": TWO_RTX, "machine": "x86_64",
        "indexes": (IndexFacts("https://pypi.org/simple", "pip's default", reachable=True),),
        "ca": CaFacts("/etc/ssl/certs/ca-certificates.crt", "PIP_CERT", True)}
    return HostFacts(**{**facts, **changes})


def statuses(report) -> dict[str, str]:
    return {c.name: c.status.value for c in report.checks}


def test_a_healthy_host_is_all_ok_and_exits_0():
    report = build_report(healthy(), TARGETS)
    assert set(statuses(report).values()) == {"ok"} and report.exit_code == 0
    assert "every required check is ok" in report.render()


def test_no_engine_is_missing_with_the_setup_hint_and_exits_1():
    report = build_report(healthy(engine=EngineFacts("unix:///nonexistent", True, False,
                                                     error="socket /nonexistent does not exist"),
                                  disks=(DiskFacts("engine data root", "", error="no engine"),)), TARGETS)
    engine = report.checks[0]
    assert (engine.name, engine.status, engine.required) == ("engine", CheckStatus.MISSING, True)
    assert "scripts/setup-engine.sh" in engine.hint and engine.facts["docker_host"] == "unix:///nonexistent"
    assert report.exit_code == 1 and "required check(s) not ok: engine (exit 1)" in report.render()
    assert statuses(report)["disk (engine)"] == "warn"


def test_optional_pieces_never_fail_the_exit_code():
    report = build_report(healthy(
        buildx=BuildxFacts(False), gpus=NO_GPU,
        indexes=(IndexFacts("https://mirror/simple", "PIP_INDEX_URL", reachable=False, detail="ConnectionError"),),
        registry=RegistryFacts("127.0.0.1:5999/sf", "127.0.0.1:5999", False, "Connection refused"),
        ca=CaFacts("/nope.pem", "pip config global.cert", False)), TARGETS)
    assert statuses(report) == {
        "engine": "ok", "buildx": "missing", "disk (engine)": "ok", "disk (cwd)": "ok", "gpus": "missing",
        "targets": "missing", "index": "fail", "registry": "fail", "ca bundle": "fail"}
    assert report.exit_code == 0
    gpus = next(c for c in report.checks if c.name == "gpus")
    assert gpus.summary.startswith("no GPU (gate tier only)")


def test_low_disk_warns():
    report = build_report(healthy(disks=(DiskFacts("engine data root", "/var/lib/docker", 12 * GIB, 200 * GIB),)),
                          TARGETS)
    assert statuses(report)["disk (engine)"] == "warn" and report.exit_code == 0


def test_gpus_without_an_nvidia_runtime_warn():
    present = HostGpus(False, "GPUs X present but the engine has no nvidia runtime", ("X",), "590.48.01",
                       (HostGpu(0, "X", "12.0"),))
    check = next(c for c in build_report(healthy(gpus=present), TARGETS).checks if c.name == "gpus")
    assert check.status is CheckStatus.WARN and "nvidia-container-toolkit" in check.hint


def test_runnable_targets_match_arch_and_count():
    verdicts = runnable_targets(TWO_RTX, TARGETS, "x86_64")
    assert verdicts["rtx-pro-6000-x2-pcie"] == "runnable on GPUs 0,1"
    # 2 of the target's 8 cards would file 2-GPU results under the 8-GPU box: not runnable, and it says why.
    assert verdicts["rtx-pro-6000-x8-pcie"].startswith("not runnable: too few GPUs: rtx-pro-6000-x8-pcie has 8 "
                                                       "RTX PRO 6000; this host has 2")
    assert verdicts["b200-x8"].startswith("not runnable: no GPU of compute capability 10.0 (b200-x8) on this host")
    assert set(runnable_targets(TWO_RTX, TARGETS, "aarch64").values()) == {
        "not runnable: images are linux/amd64, this host is aarch64"}
    unknown_arch = HostGpus(True, "1 GPU", ("X",), "470", (HostGpu(0, "X", None),))
    assert runnable_targets(unknown_arch, TARGETS, "x86_64")["b200-x8"].startswith("unsure")


def test_pip_settings_follow_pips_precedence():
    config = parse_pip_config_list("global.index-url='https://global/simple'\n"
                                   "install.index-url='https://install/simple'\n"
                                   "global.extra-index-url='file:///a https://b/simple'\n:env:.cert='/x.pem'\n"
                                   "global.cert='/etc/ssl/certs/ca-certificates.crt'\n")
    assert config.setting("index-url", {}) == PipSetting("https://install/simple", "pip config install.index-url")
    assert config.setting("index-url", {"PIP_INDEX_URL": "https://env/simple"}) == PipSetting(
        "https://env/simple", "PIP_INDEX_URL")
    indexes = pip_indexes(None, config, {})
    assert [(i.url, i.role) for i in indexes] == [("https://install/simple", "index"), ("file:///a", "extra index"),
                                                  ("https://b/simple", "extra index")]
    assert pip_indexes("https://cli/simple", config, {})[0].source == "--index-url"
    assert pip_indexes(None, PipConfig(), {})[0].url == "https://pypi.org/simple"
    assert pip_ca(None, config, {}).path == "/x.pem"                     # PIP_CERT (:env:) before the files
    files_only = parse_pip_config_list("global.cert='/etc/ssl/certs/ca-certificates.crt'\n")
    assert pip_ca(None, files_only, {}).path == "/etc/ssl/certs/ca-certificates.crt"
    assert pip_ca(None, PipConfig(), {"REQUESTS_CA_BUNDLE": "/r.pem"}).source == "REQUESTS_CA_BUNDLE"
    assert pip_ca(None, PipConfig(), {}).path == ""


def test_doctor_reads_the_indexes_as_plan_and_probe_do():
    """One reading of pip's configuration (wheels.index.index_config): no-index leaves no main index,
    an extra index set twice is asked once, and each keeps where it was set."""
    config = parse_pip_config_list("global.no-index='true'\nglobal.extra-index-url='https://b/simple https://b/simple'\n")
    assert [(i.url, i.role, i.source) for i in pip_indexes(None, config, {})] == [
        ("https://b/simple", "extra index", "pip config global.extra-index-url")]
    assert [(i.url, i.source) for i in pip_indexes("https://cli/simple", config, {"PIP_EXTRA_INDEX_URL": "https://e/s"})] \
        == [("https://cli/simple", "--index-url"), ("https://e/s", "PIP_EXTRA_INDEX_URL")]


# --------------------------------------------------------------------------- the real command

def run_doctor(*args: str):
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["doctor", "--json", *args])
    return result, time.monotonic() - started


def test_doctor_against_the_real_engine(docker_client):
    result, _ = run_doctor()
    report = json.loads(result.stdout)
    engine = report["checks"][0]
    assert engine["status"] == "ok", result.output
    assert engine["facts"]["server_version"] == docker_client.version()["Version"]
    assert engine["facts"]["data_root"] == docker_client.info()["DockerRootDir"]
    disk = next(c for c in report["checks"] if c["name"] == "disk (engine)")
    assert disk["facts"]["free_bytes"] > 0
    assert result.exit_code == 0 and report["exit_code"] == 0


def test_doctor_with_the_engine_unreachable(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    result, took = run_doctor()
    report = json.loads(result.stdout)
    engine = report["checks"][0]
    assert engine["status"] == "missing" and "/nonexistent" in engine["summary"]
    assert "scripts/setup-engine.sh" in engine["hint"]
    assert result.exit_code == 1 and report["exit_code"] == 1
    assert took < 60


def test_doctor_text_without_engine_names_the_hint(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith("missing  engine")
    assert "hint: start one: sudo scripts/setup-engine.sh" in result.output


def test_doctor_reads_the_gpus_from_nvidia_smi(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, MIXED_SMI)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")   # local GPUs: --local probes could use them
    report = json.loads(run_doctor()[0].stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["gpus"]["status"] == "ok"
    assert checks["gpus"]["facts"]["driver"] == "590.48.01"
    assert checks["gpus"]["facts"]["devices"][4] == {"index": 4, "name": "NVIDIA RTX PRO 6000 Blackwell Workstation "
                                                     "Edition", "compute_cap": "12.0"}
    targets = checks["targets"]["facts"]["targets"]
    assert targets["rtx-pro-6000-x2-pcie"] == "runnable on GPUs 4,5"
    assert targets["b200-x8"].startswith("not runnable")


def test_doctor_without_nvidia_smi_says_gate_tier_only(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no nvidia-smi (and no docker CLI)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    report = json.loads(run_doctor()[0].stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["gpus"]["status"] == "missing"
    assert checks["gpus"]["summary"].startswith("no GPU (gate tier only)")
    assert checks["buildx"]["status"] == "missing"


def test_doctor_checks_a_registry_that_does_not_answer():
    report = json.loads(run_doctor("--registry", "127.0.0.1:1/stackforge")[0].stdout)
    registry = next(c for c in report["checks"] if c["name"] == "registry")
    assert registry["status"] == "fail" and registry["facts"]["host"] == "127.0.0.1:1"


def test_doctor_checks_the_index_it_is_given(tmp_path):
    missing = tmp_path / "no-such-index"
    report = json.loads(run_doctor("--index-url", missing.as_uri())[0].stdout)
    index = next(c for c in report["checks"] if c["name"] == "index")
    assert index["status"] == "fail" and index["facts"]["source"] == "--index-url"
    (tmp_path / "simple").mkdir()
    report = json.loads(run_doctor("--index-url", (tmp_path / "simple").as_uri())[0].stdout)
    assert next(c for c in report["checks"] if c["name"] == "index")["status"] == "ok"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:   # keep the CLI's captured stderr clean
        pass


def serve_index(folder: Path, page: str):
    """A real HTTP index on loopback whose /simple/pip/ page is ``page``."""
    (folder / "simple" / "pip").mkdir(parents=True)
    (folder / "simple" / "pip" / "index.html").write_text(page)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=folder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/simple"


def test_doctor_asks_a_real_index_over_http(tmp_path):
    json_server, json_url = serve_index(tmp_path / "json", '{"meta": {"api-version": "1.1"}, "files": []}')
    html_server, html_url = serve_index(tmp_path / "html", "<a href='pip-1.0.tar.gz'>pip-1.0.tar.gz</a>")
    try:
        for url, status in ((json_url, "ok"), (html_url, "ok")):   # preflight reads PEP 691 JSON and PEP 503 HTML
            result = CliRunner().invoke(cli, ["doctor", "--json", "--index-url", url])
            index = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "index")
            assert (index["status"], index["facts"]["url"]) == (status, url), index
    finally:
        json_server.shutdown()
        html_server.shutdown()


def test_doctor_never_shows_index_credentials(tmp_path, monkeypatch):
    # A refusing loopback port for the index; an index that answers 401 for the extra one.
    server, url = serve_index(tmp_path / "idx", "{}")
    server.RequestHandlerClass = _Unauthorized
    monkeypatch.setenv("PIP_INDEX_URL", "https://alice:S3CRETTOKEN@127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", url.replace("http://", "http://bob:OTHERTOKEN@"))
    try:
        result, _ = run_doctor()
        shown = CliRunner().invoke(cli, ["doctor"])
    finally:
        server.shutdown()
    indexes = [c for c in json.loads(result.stdout)["checks"] if c["name"] in ("index", "extra index")]
    assert [c["status"] for c in indexes] == ["fail", "fail"], indexes
    assert indexes[0]["facts"]["url"] == "https://127.0.0.1:9/simple"
    for text in (result.output, shown.output):
        assert "S3CRETTOKEN" not in text and "OTHERTOKEN" not in text, text


class _Unauthorized(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.send_response(401)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass
