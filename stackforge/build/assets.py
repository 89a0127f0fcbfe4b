"""A tiny HTTP server on 127.0.0.1 that hands build steps the wheelhouse and the CA bundle.

The classic builder has no ``RUN --mount``: anything COPY'd into a build stays in a layer. Builds run
on the host network, so a RUN step can fetch from 127.0.0.1 instead. The templates download the CA
bundle to /tmp, point pip at it, and delete it in the same RUN; a layer is the filesystem difference
at the end of a RUN, so the bundle never lands in one (tests/test_build_integration.py proves it by
scanning ``docker save`` output for a marker). Wheels are read by pip straight from
``/wheelhouse/`` (a find-links page), so they never land in a layer either.

Only GET of ``/ca.pem`` and of the wheelhouse's own files is served; everything else is 404. The
server listens on loopback only and lives exactly as long as the build run.
"""

from __future__ import annotations

import html
import http.server
import shutil
import threading
import urllib.parse
from pathlib import Path
from types import TracebackType

from stackforge.compose.dockerfile import ASSET_PORT

WHEEL_SUFFIXES = (".whl", ".tar.gz", ".zip")


class AssetServer:
    """Serve ``ca_bundle`` at ``/ca.pem`` and ``wheelhouse`` at ``/wheelhouse/`` on 127.0.0.1.

    Use as a context manager. ``port`` is :data:`ASSET_PORT` when free (the URL is part of the RUN
    text, so a stable port keeps the classic builder's layer cache), else any free port.
    """

    def __init__(self, *, ca_bundle: Path | None, wheelhouse: Path | None, port: int = ASSET_PORT) -> None:
        self._ca = Path(ca_bundle).read_bytes() if ca_bundle else None
        self._wheelhouse = Path(wheelhouse).resolve() if wheelhouse else None
        self._server = _bind(port, self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, name="stackforge-assets", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> "AssetServer":
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                body, content_type = server._answer(urllib.parse.urlsplit(self.path).path)
                if body is None:
                    self.send_error(404)
                    return
                size = body.stat().st_size if isinstance(body, Path) else len(body)
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                if isinstance(body, Path):
                    with body.open("rb") as source:   # streamed: a torch wheel is hundreds of MB
                        shutil.copyfileobj(source, self.wfile)
                else:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # requests are not logged: nothing here is worth a line on the terminal

        return Handler

    def _answer(self, path: str) -> tuple[bytes | Path | None, str]:
        if path == "/ca.pem":
            return self._ca, "application/x-pem-file"
        if self._wheelhouse is None or not path.startswith("/wheelhouse/"):
            return None, ""
        name = urllib.parse.unquote(path.removeprefix("/wheelhouse/"))
        if name == "":
            return self._index(), "text/html; charset=utf-8"
        return self._wheel(name), "application/octet-stream"

    def _files(self) -> dict[str, Path]:
        assert self._wheelhouse is not None
        return {p.name: p for p in sorted(self._wheelhouse.iterdir())
                if p.is_file() and p.name.endswith(WHEEL_SUFFIXES)}

    def _index(self) -> bytes:
        """A find-links page: one link per distribution file."""
        links = "".join(f'<a href="{html.escape(urllib.parse.quote(name))}">{html.escape(name)}</a><br>\n'
                        for name in self._files())
        return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()

    def _wheel(self, name: str) -> Path | None:
        # Only names from the listing: no path tricks ("../", absolute paths) can reach other files.
        return self._files().get(name)


def _bind(port: int, handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    """Bind 127.0.0.1:port, or any free port when that one is taken."""
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        return http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
