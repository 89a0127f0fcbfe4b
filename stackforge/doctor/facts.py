"""Gathering the facts ``stackforge doctor`` judges: the edges (engine, tools, disk, network).

Each gatherer is bounded by a timeout and never raises for what it finds missing: a missing engine,
tool or GPU is a fact. They run in parallel so a host with a dead engine and an unreachable index
still answers within a few seconds. :mod:`stackforge.doctor.checks` judges the result.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import requests

from stackforge.core.errors import StackforgeError
from stackforge.doctor import disk_budget
from stackforge.doctor.checks import (
    BuildxFacts,
    CaFacts,
    DiskFacts,
    EngineFacts,
    HostFacts,
    IndexFacts,
    RegistryFacts,
)
from stackforge.edges import docker_engine, runner
from stackforge.edges.gpu_host import HostGpuFacts, read_gpu_host_facts
from stackforge.edges.gpus import HostGpus, detect_host_gpus
from stackforge.edges.index import index_config
from stackforge.edges.pip_config import PipConfig, read_pip_config, trusted_ca_bundles

ENGINE_TIMEOUT_S = 5.0
TOOL_TIMEOUT_S = 15.0
REGISTRY_TIMEOUT = (5, 10)
DOCKER_HUB_API = "registry-1.docker.io"   # where docker.io's registry API lives


def gather(*, index_url: str | None = None, registry: str | None = None, ca_bundle: str | None = None,
           cwd: Path | None = None, environ: Mapping[str, str] | None = None, gpu: bool = False) -> HostFacts:
    """Every fact, gathered in parallel (each bounded by its own timeout; Ctrl-C and SIGTERM get through
    while the main thread waits, see :func:`stackforge.edges.runner.result_of`). ``gpu``: also the runtime
    runs' host check (:func:`stackforge.edges.gpu_host.read_gpu_host_facts`), when the host has GPUs."""
    environ = os.environ if environ is None else environ
    with ThreadPoolExecutor(max_workers=4) as pool:
        engine_and_gpus = pool.submit(_engine_and_gpus)
        buildx = pool.submit(buildx_facts)
        pip = pool.submit(read_pip_config, timeout=TOOL_TIMEOUT_S)
        registry_future = pool.submit(registry_facts, registry) if registry else None
        budget = pool.submit(disk_budget.gather, cwd or Path.cwd(), environ)
        config = runner.result_of(pip)
        ca = pip_ca(ca_bundle, config, environ)
        indexes = pool.submit(index_facts, pip_indexes(index_url, config, environ), ca)
        engine, gpus = runner.result_of(engine_and_gpus)
        disks = (engine_disk(engine), disk_facts("working directory", cwd or Path.cwd()))
        registry_found = runner.result_of(registry_future) if registry_future else None
        gpu_host = None if not gpu else read_gpu_host_facts(gpus) if gpus.devices else HostGpuFacts(
            gpus.driver, unreadable=(("gpus", gpus.evidence),))
        return HostFacts(engine=engine, buildx=runner.result_of(buildx), disks=disks, gpus=gpus,
                         machine=platform.machine(), indexes=runner.result_of(indexes), registry=registry_found, ca=ca,
                         budget=runner.result_of(budget), gpu_host=gpu_host)


# --------------------------------------------------------------------------- engine, buildx, GPUs, disk

def _engine_and_gpus() -> tuple[EngineFacts, HostGpus]:
    engine, client = engine_facts()
    try:
        return engine, detect_host_gpus(client)
    finally:
        if client is not None:
            client.close()


def engine_facts() -> tuple[EngineFacts, Any]:
    """The engine's version, data root and runtimes (and the client, for the GPU runtime check)."""
    url = docker_engine.engine_url()
    base = {"url": url, "docker_host_set": bool(os.environ.get("DOCKER_HOST")),
            "local": docker_engine.engine_shares_host_files(url)}
    try:
        client = docker_engine.connect(timeout=ENGINE_TIMEOUT_S, api_timeout=ENGINE_TIMEOUT_S * 2)
    except StackforgeError as exc:
        return EngineFacts(reachable=False, error=exc.message.split(": ", 1)[-1], **base), None
    try:
        version, info = client.version(), client.info()
    except (docker.errors.DockerException, requests.RequestException) as exc:   # answered the ping, then not
        client.close()
        return EngineFacts(reachable=False, error=f"{type(exc).__name__}: {exc}"[:200], **base), None
    return EngineFacts(reachable=True, server_version=str(version.get("Version", "?")),
                       api_version=str(version.get("ApiVersion", "?")),
                       platform=f"{version.get('Os', '?')}/{version.get('Arch', '?')}",
                       data_root=str(info.get("DockerRootDir", "")),
                       runtimes=tuple(sorted((info.get("Runtimes") or {}).keys())), **base), client


def buildx_facts() -> BuildxFacts:
    """``docker buildx version`` through the runner."""
    if runner.which("docker") is None:
        return BuildxFacts(docker_cli=False)
    result = runner.run(["docker", "buildx", "version"], timeout=TOOL_TIMEOUT_S)
    if not result.succeeded:
        return BuildxFacts(docker_cli=True, error=f"{result.describe()}: {result.output_tail.strip()[-200:]}")
    return BuildxFacts(docker_cli=True, version=result.output_tail.strip().splitlines()[-1].strip())


def engine_disk(engine: EngineFacts) -> DiskFacts:
    """Free space of the engine's data root, when the engine keeps it on this machine."""
    if not engine.reachable:
        return DiskFacts("engine data root", "", error="no engine")
    if not engine.local:
        return DiskFacts("engine data root", engine.data_root, error="the engine is on another machine")
    return disk_facts("engine data root", Path(engine.data_root))


def disk_facts(label: str, path: Path) -> DiskFacts:
    try:
        usage = shutil.disk_usage(path)
    except OSError as exc:
        return DiskFacts(label, str(path), error=exc.strerror or str(exc))
    return DiskFacts(label, str(path), free_bytes=usage.free, total_bytes=usage.total)


# --------------------------------------------------------------------------- pip's index and CA bundle

def pip_indexes(index_url: str | None, config: PipConfig, environ: Mapping[str, str]) -> tuple[IndexFacts, ...]:
    """The index and extra indexes pip would ask, each with where it was set (pure; read as
    :func:`stackforge.edges.index.index_config` reads them for plan, probe and bisect)."""
    indexes = index_config(index_url=index_url, pip_config=config, env=environ)
    main = (IndexFacts(indexes.index_url, indexes.origin(indexes.index_url)),) if indexes.index_url else ()
    return (*main, *(IndexFacts(url, indexes.origin(url), role="extra index") for url in indexes.extra_index_urls))


def pip_ca(ca_bundle: str | None, config: PipConfig, environ: Mapping[str, str]) -> CaFacts:
    """The CA bundle pip uses: ``--ca-bundle``, else pip's ``cert`` setting, else REQUESTS_CA_BUNDLE
    (pip's HTTP client honours it), else none (pip's default store). Only the path is kept."""
    if ca_bundle:
        return CaFacts(path=ca_bundle, source="--ca-bundle", exists=Path(ca_bundle).is_file())
    trusted = trusted_ca_bundles(config.setting("cert", environ), environ)
    if not trusted:
        return CaFacts()
    return CaFacts(path=trusted[0].value, source=trusted[0].origin, exists=Path(trusted[0].value).is_file())


def index_facts(indexes: tuple[IndexFacts, ...], ca: CaFacts) -> tuple[IndexFacts, ...]:
    """Ask each index for a project page through preflight's client (PEP 691 JSON or PEP 503 HTML)."""
    from stackforge.plan.preflight import Availability, Wanted, check_package

    session = requests.Session()
    if ca.path and ca.exists:
        session.verify = ca.path
    answered = []
    with tempfile.TemporaryDirectory(prefix="stackforge-doctor-") as cache:   # never a cached answer
        for index in indexes:
            if index.url.startswith("file://"):
                folder = Path(urllib.parse.urlsplit(index.url).path)
                answered.append(_with(index, folder.is_dir(), "a local folder" if folder.is_dir()
                                      else f"folder {folder} does not exist"))
                continue
            status, detail = check_package(Wanted("pip", "0", index.url), "3.12", session=session, cache=Path(cache))
            reachable = status is not Availability.UNREACHABLE
            answered.append(_with(index, reachable, "simple API answered" if reachable else detail))
    return tuple(answered)


def _with(index: IndexFacts, reachable: bool, detail: str) -> IndexFacts:
    return IndexFacts(index.url, index.source, index.role, reachable, detail)


# --------------------------------------------------------------------------- registry

def registry_facts(ref: str) -> RegistryFacts:
    """GET the registry's ``/v2/`` (HTTP 200 or 401 both mean a registry answers)."""
    from stackforge.edges.registry import DOCKER_HUB, Repository

    repository = Repository.parse(ref)
    scheme = "http" if repository.loopback else "https"
    host = DOCKER_HUB_API if repository.host == DOCKER_HUB else repository.host
    url = f"{scheme}://{host}/v2/"
    try:
        response = requests.get(url, timeout=REGISTRY_TIMEOUT)
    except requests.RequestException as exc:
        return RegistryFacts(ref, repository.host, False, f"{type(exc).__name__}: {docker_engine._short_reason(exc)}")
    answered = response.status_code in (200, 401)
    return RegistryFacts(ref, repository.host, answered, f"GET {url}: HTTP {response.status_code}")
