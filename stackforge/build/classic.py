"""Classic (non-BuildKit) builds through the Docker SDK, for engines without ``docker buildx``.

The same templates render with ``buildkit=false``: no ``RUN --mount``; the wheelhouse and the CA
bundle come from stackforge's asset server on 127.0.0.1 (see :mod:`stackforge.build.assets`).
Intermediate containers are always removed (``forcerm``), also when a step fails.

The SDK call streams JSON lines; a timeout or a Ctrl-C closes that stream, and the engine cancels a
classic build whose client went away (removing the step's container).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.utils
import requests.exceptions

from stackforge.build.buildkit import BuildAttempt
from stackforge.build.cancel import Cancel
from stackforge.edges import runner


class _StreamingAPIClient(docker.APIClient):
    """docker-py's APIClient that remembers the response of the streaming call it is reading.

    docker-py returns a generator and keeps the HTTP response to itself; closing that response is the
    only way to abandon a classic build (the Engine API has no cancel for it).
    """

    response: Any = None

    def _stream_helper(self, response: Any, decode: bool = False) -> Any:
        self.response = response
        return super()._stream_helper(response, decode=decode)

    def abandon(self) -> None:
        if self.response is not None:
            self.response.close()


def build(client: docker.DockerClient, context_dir: Path, *, labels: Sequence[tuple[str, str]],
          buildargs: Mapping[str, str], timeout: float, log_path: Path, cancel: Cancel,
          redact: Sequence[str] = (), no_cache: bool = False) -> BuildAttempt:
    """Build ``context_dir`` with the classic builder (host network); the image stays untagged."""
    api = _StreamingAPIClient(**docker.utils.kwargs_from_env(), version=client.api.api_version,
                              timeout=int(timeout) + 60)
    started = time.monotonic()
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        api.abandon()

    watchdog = threading.Timer(timeout, stop)
    watchdog.daemon = True
    try:
        with runner.open_log(log_path) as log, cancel.on_cancel(stop):
            capture = runner.OutputCapture(tail_chars=8000, redact=redact, log=log)
            runner.write_log(log, f"$ (docker SDK classic build, host network) {context_dir}\n")
            watchdog.start()
            image_id, error = _stream(api, context_dir, labels, buildargs, capture, no_cache)
            capture.finish()
            duration = time.monotonic() - started
            timed_out = stopped.is_set() and not cancel.requested
            ending = _ending(error, timed_out, duration, cancelled=cancel.requested)
            runner.write_log(log, f"[stackforge] classic build {ending} ({duration:.1f} s)\n")
    finally:
        watchdog.cancel()
        api.close()
    ok = error is None and image_id is not None
    return BuildAttempt(ok=ok, image_id=image_id if ok else None, tail=capture.tail(), duration_s=duration,
                        timed_out=timed_out, ending=ending)


def _stream(api: _StreamingAPIClient, context_dir: Path, labels: Sequence[tuple[str, str]],
            buildargs: Mapping[str, str], capture: runner.OutputCapture,
            no_cache: bool) -> tuple[str | None, str | None]:
    """Feed the build's JSON stream into the capture; return (image id, error message or None)."""
    image_id: str | None = None
    try:
        stream = api.build(path=str(context_dir), rm=True, forcerm=True, pull=False,
                           network_mode="host", labels=dict(labels), buildargs=dict(buildargs), decode=True,
                           nocache=no_cache)
        for chunk in stream:
            if "stream" in chunk:
                capture.feed(str(chunk["stream"]).encode())
            elif "status" in chunk:
                capture.feed(f"{chunk['status']} {chunk.get('progress', '')}\n".encode())
            if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
                image_id = str(chunk["aux"]["ID"])
            if "error" in chunk:
                message = str(chunk.get("errorDetail", {}).get("message") or chunk["error"])
                capture.feed(f"ERROR: {message}\n".encode())
                return None, message
    except (requests.exceptions.RequestException, docker.errors.DockerException, OSError, ValueError,
            AttributeError) as exc:
        # A closed stream (timeout, Ctrl-C) surfaces as one of these, depending on where the read was.
        capture.feed(f"ERROR: build stream ended: {type(exc).__name__}: {exc}\n".encode())
        return None, f"build stream ended: {type(exc).__name__}"
    if image_id is None:
        return None, "the engine reported no image id"
    return image_id, None


def _ending(error: str | None, timed_out: bool, duration: float, *, cancelled: bool) -> str:
    if cancelled:
        return "was interrupted"
    if timed_out:
        return f"timed out after {duration:.1f} s and was stopped"
    return "succeeded" if error is None else f"failed: {error}"
