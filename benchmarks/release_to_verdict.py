"""From a release on the index to its verdicts and a pull request: `stackforge watch` replaying real
releases as if new, an idle poll, and the upload-to-PR estimate.

Cases (each an --after/--until replay of one release of one distribution, read for the default matrix's
target and stack contexts, with every rule whose bound the release touches verified again):

* flashinfer-python 0.6.17 after 0.6.16.post4 (allreduce fusion admitted on sm_120);
* sglang 0.5.14 after 0.5.13.post1;
* sglang 0.5.23 after 0.5.22;
* torch 2.15.0 after 2.14.1 (a torch release);
* sglang-kernel 0.4.10 after 0.4.9 (a kernel release).

Cold: a fresh, empty wheel cache *per case* (an earlier case's wheels never help a later one); warm: the
same replay again on that case's cache. A release that no reader reads (``listed, not read (no
reader)``) is said so, and its core-metadata read (PEP 658 or HTTP ranges of the wheel) is timed instead.

Idle poll: a watch of every watched package on a fresh results folder records the baseline, then a second
watch is the poll of a quiet index: printed are its bytes (response headers and bodies) and how many
index pages answered 304 (unchanged: the cached page's ETag / Last-Modified were sent back) or 200.

Upload to pull request (estimate): the watch schedule's interval (worst case) + a runner's job start and
install (an assumption, named) + the slowest cold read measured here + the pull-request step, timed
against a local server speaking the GitHub API subset (the real API adds its round trips).

Targets (issue #33, this machine, 2 cores): under 60 s per release cold for every watched package, under
1 MB per idle poll, under 15 minutes from upload to pull request. Run:
``python benchmarks/release_to_verdict.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from stackforge.ci.github import DEFAULT_WATCH_CRON
from stackforge.ci.pull_request import PullRequestSpec, open_or_update
from stackforge.edges.index import configured_indexes, find_release, new_session, releases, wheel_metadata
from stackforge.watch.campaign import WatchRequest, run_watch
from stackforge.watch.report import headline, report_markdown

REPO = Path(__file__).resolve().parents[1]
CASES = (("flashinfer-python", "0.6.16.post4", "0.6.17"), ("sglang", "0.5.13.post1", "0.5.14"),
         ("sglang", "0.5.22", "0.5.23"), ("torch", "2.14.1", "2.15.0"), ("sglang-kernel", "0.4.9", "0.4.10"))
#: A GitHub-hosted runner's queue, start, checkout and `pip install` before `stackforge watch` runs:
#: an assumption (not measured here; a hosted runner typically takes 1-2 minutes).
JOB_START_S = 120.0
NO_READER = "listed, not read (no reader)"


class ByteCounter:
    """Sums what every HTTP response this process receives carried: status line and headers (as parsed)
    plus the body's Content-Length (none for HEAD); and counts the statuses."""

    def __init__(self) -> None:
        self.total = 0
        self.statuses: Counter[int] = Counter()
        self._send = requests.adapters.HTTPAdapter.send

    def __enter__(self) -> "ByteCounter":
        counter, original = self, self._send

        def send(adapter, request, **kwargs):  # type: ignore[no-untyped-def]
            response = original(adapter, request, **kwargs)
            head = 15 + sum(len(k) + len(v) + 4 for k, v in response.headers.items())
            # A HEAD answer's Content-Length is the size of the file it describes, not bytes sent.
            body = 0 if request.method == "HEAD" else int(response.headers.get("Content-Length") or 0)
            counter.total += head + body
            counter.statuses[response.status_code] += 1
            return response
        requests.adapters.HTTPAdapter.send = send
        return self

    def __exit__(self, *exc: object) -> None:
        requests.adapters.HTTPAdapter.send = self._send


def replay(dist: str, after: str, until: str, target: str, results: Path) -> tuple[float, int, Any]:
    with ByteCounter() as counted:
        started = time.monotonic()
        report = run_watch(WatchRequest(matrix_path=REPO / "matrices" / "default.yaml", results_root=results,
                                        packages=(dist,), after=after, until=until, targets=(target,)))
        seconds = time.monotonic() - started
    return seconds, counted.total, report


def metadata_read(dist: str, version: str) -> tuple[float, int, str]:
    """Seconds and bytes to list ``dist`` and read one wheel's core metadata of ``version`` (no reader)."""
    indexes = configured_indexes()
    with ByteCounter() as counted:
        started = time.monotonic()
        release = find_release(releases(dist, indexes=indexes, ttl_s=0), version)
        wheel = release.wheels[0] if release and release.wheels else None
        text = wheel_metadata(wheel, session=new_session(indexes)) if wheel else None  # type: ignore[arg-type]
        seconds = time.monotonic() - started
    return seconds, counted.total, f"METADATA of {wheel.filename if wheel else '(no wheel)'}: " + \
        (f"{len(text)} characters" if text else "not readable")


def idle_poll(scratch: Path) -> tuple[float, int, Counter[int], str]:
    """The second of two watches of every watched package, nothing uploaded between them."""
    results = scratch / "idle-results"
    run_watch(WatchRequest(matrix_path=REPO / "matrices" / "default.yaml", results_root=results))
    with ByteCounter() as counted:
        started = time.monotonic()
        report = run_watch(WatchRequest(matrix_path=REPO / "matrices" / "default.yaml", results_root=results))
        seconds = time.monotonic() - started
    return seconds, counted.total, counted.statuses, headline(report)


def pull_request_step(body: str) -> tuple[float, str]:
    """Open then update the pull request of one change set against a local GitHub API subset."""
    pulls: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, data: Any) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            if "/pulls" in self.path:
                self._answer(200, [p for p in pulls if p["state"] == "open"])
            else:
                self._answer(200, {"default_branch": "main"})

        def do_POST(self) -> None:
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            pulls.append({"number": len(pulls) + 1, "state": "open", **payload,
                          "html_url": f"http://localhost/o/n/pull/{len(pulls) + 1}"})
            self._answer(201, pulls[-1])

        def do_PATCH(self) -> None:
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            pulls[0].update(payload)
            self._answer(200, pulls[0])

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = PullRequestSpec(repo="o/n", branch="watch/bench", title="stackforge watch", body=body)
        started = time.monotonic()
        opened = open_or_update(spec, token="bench", api=f"http://127.0.0.1:{server.server_address[1]}")
        updated = open_or_update(spec, token="bench", api=f"http://127.0.0.1:{server.server_address[1]}")
        seconds = (time.monotonic() - started) / 2
    finally:
        server.shutdown()
        server.server_close()
    return seconds, f"{opened.action} #{opened.number}, then {updated.action} #{updated.number}"


def interval_s(cron: str) -> float:
    minute = cron.split()[0]
    return 60.0 * (int(minute[2:]) if minute.startswith("*/") else 60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="rtx-pro-6000-x8-pcie")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sf-release-to-verdict-"))
    slowest, first_news = 0.0, None
    try:
        totals = {"cold": 0.0, "warm": 0.0}
        for n, (dist, after, until) in enumerate(CASES):
            os.environ["STACKFORGE_WHEEL_CACHE"] = str(scratch / f"wheels-{n}")   # fresh per cold case
            for temperature in ("cold", "warm"):
                seconds, size, report = replay(dist, after, until, args.target, scratch / f"results-{n}")
                unread = next((r.unread for r in report.releases if r.unread), "")
                line = f"{dist} {until} after {after} [{temperature}]: {seconds:5.1f} s, {size / 1e6:7.1f} MB; "
                if unread == NO_READER:
                    meta_s, meta_bytes, what = metadata_read(dist, until)
                    seconds = meta_s
                    line += f"{unread}: metadata read instead {meta_s:.1f} s, {meta_bytes / 1e6:.2f} MB ({what})"
                else:
                    line += headline(report)
                totals[temperature] += seconds
                if temperature == "cold":
                    slowest = max(slowest, seconds)
                if first_news is None and report.releases:
                    first_news = report
                print(line, flush=True)
        print(f"all {len(CASES)} releases: {totals['cold']:.1f} s cold, {totals['warm']:.1f} s warm "
              f"(target: < 60 s per release cold)", flush=True)

        os.environ["STACKFORGE_WHEEL_CACHE"] = str(scratch / "wheels-idle")
        idle_s, idle_bytes, statuses, line = idle_poll(scratch)
        print(f"idle poll (every watched package, nothing new): {idle_s:.1f} s, {idle_bytes / 1e3:.1f} kB "
              f"(target < 1000 kB); answers {dict(sorted(statuses.items()))}; {line}", flush=True)

        pr_s, what = pull_request_step(report_markdown(first_news) if first_news else "# report\n")
        interval = interval_s(DEFAULT_WATCH_CRON)
        total = interval + JOB_START_S + slowest + pr_s
        print(f"pull-request step (local API subset): {pr_s * 1000:.0f} ms per call set ({what})")
        print(f"upload to pull request, worst case: {interval:.0f} s interval ({DEFAULT_WATCH_CRON}) + "
              f"{JOB_START_S:.0f} s job start and install (assumed) + {slowest:.1f} s slowest cold read + "
              f"{pr_s:.1f} s pull request = {total / 60:.1f} min (target < 15 min); on average "
              f"{(interval / 2 + JOB_START_S + slowest + pr_s) / 60:.1f} min")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
