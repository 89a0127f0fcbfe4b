"""Small real wheels and a loopback package index (PEP 691 JSON or PEP 503 HTML) serving them."""

from __future__ import annotations

import ast
import hashlib
import http.server
import json
import threading
import io
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from stackforge.core.wheel_readings import CodeSite, ReadContext, ReaderSpec, Reading, ReadingStatus


def make_wheel(folder: Path, dist: str, version: str, files: dict[str, str], *, tag: str = "py3-none-any",
               metadata: str = "") -> Path:
    """A real (zip) wheel of ``dist`` ``version`` holding ``files`` and a METADATA (``metadata``: more
    header lines, e.g. ``Requires-Dist: torch==2.14.1``)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = dist.replace("-", "_")
    path = folder / f"{stem}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{stem}-{version}.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n{metadata}")
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_sdist(folder: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    """A real sdist (``.tar.gz``) of ``dist`` ``version``: ``files`` under its top folder, plus a PKG-INFO."""
    folder.mkdir(parents=True, exist_ok=True)
    top = f"{dist.replace('-', '_')}-{version}"
    path = folder / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in {**files, "PKG-INFO": f"Metadata-Version: 2.1\nName: {dist}\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(name if name.startswith("../") else f"{top}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def comm_py(majors: list[int] | None) -> str:
    """A FlashInfer-like ``flashinfer/jit/comm.py``: the arch gate, or no gate at all (``None``)."""
    gate = "" if majors is None else f"    supported_major_versions = {majors!r}\n"
    return f"def gen_trtllm_comm_module():\n{gate}    return build('trtllm_comm')\n"


def read_comm_gate(root: Path, ctx: ReadContext) -> Reading:
    """A tiny reader for tests: the ``supported_major_versions`` list of gen_trtllm_comm_module in
    flashinfer/jit/comm.py (on one line, as in FlashInfer's releases of 2026)."""
    path = root / "flashinfer" / "jit" / "comm.py"
    if not path.is_file():
        return Reading("flashinfer-ar-fusion", ReadingStatus.ABSENT, "flashinfer/jit/comm.py not in the wheel",
                       (CodeSite("flashinfer/jit/comm.py", 0, ""),), ("arch",))
    lines = path.read_text().splitlines()
    start = next((n for n, line in enumerate(lines) if "def gen_trtllm_comm_module" in line), 0)
    for number, line in enumerate(lines[start:], start + 1):
        if "supported_major_versions" in line:
            majors = ast.literal_eval(line.split("=", 1)[1].strip().rstrip(","))
            major = int(ctx.arch.split(".")[0])
            status = ReadingStatus.AVAILABLE if major in majors else ReadingStatus.UNAVAILABLE
            verdict = "admitted" if major in majors else "not admitted"
            return Reading("flashinfer-ar-fusion", status,
                           f"flashinfer/jit/comm.py:{number} supported_major_versions={majors}: {major} {verdict}",
                           (CodeSite("flashinfer/jit/comm.py", number, line.strip()),), ("arch",))
    return Reading("flashinfer-ar-fusion", ReadingStatus.UNDECIDED, "no supported_major_versions in comm.py")


COMM_SPEC = ReaderSpec("flashinfer-ar-fusion", "flashinfer-python", read_comm_gate,
                       "flashinfer/jit/comm.py supported_major_versions")


@dataclass
class LoopbackIndex:
    """What the loopback index serves: project -> [(file path, sha256 override, yanked, requires-python)]."""

    projects: dict[str, list[dict]] = field(default_factory=dict)
    html: bool = False
    hits: list[str] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)
    no_cache_hits: list[str] = field(default_factory=list)   # pages asked for with Cache-Control: no-cache
    core_metadata: bool = False                                # serve each wheel's METADATA beside it (PEP 658)

    def add(self, project: str, path: Path, *, sha256: str | None = None, yanked: bool = False,
            requires_python: str = "", upload_time: str = "") -> None:
        self.files[path.name] = path
        self.projects.setdefault(project, []).append(
            {"filename": path.name, "sha256": sha256 if sha256 is not None else sha256_of(path),
             "yanked": yanked, "requires_python": requires_python, "upload_time": upload_time})


def serve(index: LoopbackIndex):
    """Start a loopback HTTP server for ``index``; returns (simple URL, server). Call server.shutdown()."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            index.hits.append(self.path)
            if self.headers.get("Cache-Control") == "no-cache":
                index.no_cache_hits.append(self.path)
            parts = [p for p in self.path.split("/") if p]
            if len(parts) == 2 and parts[0] == "files" and parts[1] in index.files:
                return self._send(index.files[parts[1]].read_bytes(), "application/octet-stream")
            wheel = parts[1].removesuffix(".metadata") if len(parts) == 2 else ""
            if parts[:1] == ["files"] and parts[1].endswith(".whl.metadata") and wheel in index.files:
                with zipfile.ZipFile(index.files[wheel]) as archive:   # PEP 658: the wheel's METADATA
                    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
                    return self._send(archive.read(name), "text/plain")
            if len(parts) == 2 and parts[0] == "simple" and parts[1] in index.projects:
                return self._page(index.projects[parts[1]])
            self.send_response(404)
            self.end_headers()

        def _page(self, entries: list[dict]) -> None:
            if index.html:
                anchors = "".join(
                    f'<a href="../../files/{e["filename"]}#sha256={e["sha256"]}"'
                    + (f' data-requires-python="{e["requires_python"].replace(">", "&gt;")}"'
                       if e["requires_python"] else "")
                    + (' data-yanked=""' if e["yanked"] else "") + f'>{e["filename"]}</a>' for e in entries)
                return self._send(f"<html><body>{anchors}</body></html>".encode(), "text/html")
            body = {"meta": {"api-version": "1.0"},
                    "files": [{"filename": e["filename"], "url": f"../../files/{e['filename']}",
                               "hashes": {"sha256": e["sha256"]}, "requires-python": e["requires_python"] or None,
                               "yanked": e["yanked"], "core-metadata": index.core_metadata and e["filename"].endswith(".whl"),
                               **({"upload-time": e["upload_time"]} if e.get("upload_time") else {})}
                              for e in entries]}
            return self._send(json.dumps(body).encode(), "application/vnd.pypi.simple.v1+json")

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/simple", server


@contextmanager
def watched_comm_index(tmp_path: Path, monkeypatch) -> Iterator[LoopbackIndex]:
    """A served loopback index for `stackforge watch`, with the watch narrowed to the FlashInfer comm reader
    (COMM_SPEC) and the one rule it witnesses (``flashinfer-ar-fusion-sm12-gate``); ``url`` is set on the
    index. The caller adds its releases (before or after the watch runs)."""
    from stackforge.plan.planner import load_knowledge
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("stackforge.watch.campaign.load_readers", lambda: (COMM_SPEC,))
    monkeypatch.setattr("stackforge.wheels.readers.reader_for", lambda fact, dist: COMM_SPEC)
    knowledge = load_knowledge()
    narrowed = type(knowledge)(rules=tuple(r for r in knowledge.rules if r.id == "flashinfer-ar-fusion-sm12-gate"),
                               tables=knowledge.tables, targets=knowledge.targets)
    monkeypatch.setattr("stackforge.watch.campaign.load_knowledge", lambda user=None: narrowed)
    served = LoopbackIndex()
    url, server = serve(served)
    served.url = url
    try:
        yield served
    finally:
        server.shutdown()
