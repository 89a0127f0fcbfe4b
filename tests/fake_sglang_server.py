#!/usr/bin/env python3
"""A stand-in for ``python -m sglang.launch_server`` in the serving-harness tests (stdlib only).

It is a real HTTP server on 127.0.0.1: ``/health`` answers 503 until ``--health-delay`` seconds have
passed and 200 after; ``/get_model_info`` answers like SGLang's. It can exit early with a status
(``--exit-after``), ignore SIGTERM (``--ignore-sigterm``), and start a child process like SGLang's
scheduler (``--spawn-child``) or one in its own session that ignores SIGTERM (``--spawn-detached``),
and print a line of SGLang's log (``--say``); it writes its own pid and the children's to ``--pid-file``
so that a test can check that nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-path", default="/models/fake")
    parser.add_argument("--health-delay", type=float, default=0.0)
    parser.add_argument("--exit-after", type=float, default=None)
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--spawn-detached", action="store_true")
    parser.add_argument("--say", default="", help="a line to print, as SGLang logs one")
    parser.add_argument("--pid-file", default="")
    args = parser.parse_args()
    started = time.monotonic()
    print(f"fake sglang server: loading {args.model_path} (healthy in {args.health_delay:g} s)", flush=True)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = [os.getpid()]
    if args.spawn_child:  # like SGLang's scheduler process: same process group, outlives nothing
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        pids.append(child.pid)
    if args.spawn_detached:  # out of the server's process group, deaf to SIGTERM: only a kill by pid ends it
        detached = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 3600"], start_new_session=True)
        pids.append(detached.pid)
    if args.say:
        print(args.say, flush=True)
    if args.pid_file:
        with open(args.pid_file, "w") as handle:
            handle.write("\n".join(str(p) for p in pids))
    if args.exit_after is not None:
        def die() -> None:
            time.sleep(args.exit_after)
            print(f"fake sglang server: fatal error, exiting with {args.exit_code}", flush=True)
            os._exit(args.exit_code)
        threading.Thread(target=die, daemon=True).start()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path in ("/health", "/health_generate"):
                ready = time.monotonic() - started >= args.health_delay
                self._answer(200 if ready else 503, "" if ready else "loading")
            elif self.path == "/get_model_info":
                self._answer(200, json.dumps({"model_path": args.model_path, "is_generation": True}))
            else:
                self._answer(404, "not found")

        def _answer(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *values: object) -> None:
            print("fake sglang server: " + fmt % values, flush=True)

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
