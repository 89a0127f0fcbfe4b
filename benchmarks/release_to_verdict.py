"""From a release on the index to its verdicts: `stackforge watch` replaying real releases as if new.

Cases (each an --after/--until replay of one release of one distribution, read for the default matrix's
target and stack contexts, with every rule whose bound the release touches verified again):

* flashinfer-python 0.6.17 after 0.6.16.post4 (allreduce fusion admitted on sm_120);
* sglang 0.5.14 after 0.5.13.post1;
* sglang 0.5.23 after 0.5.22.

Cold: a fresh, empty wheel cache (wheels downloaded from the configured index, pip's own configuration);
warm: the same replay again. Printed per case: the wall time from the watch starting to its report
(verdicts and proposed patches), and the bytes the HTTP responses carried (their Content-Length; a
``file://`` index moves no bytes over HTTP). Targets (issue #21, this machine, 2 cores): under 60 s per new
release cold; under 5 minutes for a day's releases of all watched packages (the sum of the cases is
printed as a stand-in for a busy day). Run: ``python benchmarks/release_to_verdict.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import requests

from stackforge.watch.campaign import WatchRequest, run_watch
from stackforge.watch.report import headline

REPO = Path(__file__).resolve().parents[1]
CASES = (("flashinfer-python", "0.6.16.post4", "0.6.17"), ("sglang", "0.5.13.post1", "0.5.14"),
         ("sglang", "0.5.22", "0.5.23"))


class ByteCounter:
    """Sums the Content-Length of every HTTP response this process receives (index pages, metadata, wheels)."""

    def __init__(self) -> None:
        self.total = 0
        self._send = requests.adapters.HTTPAdapter.send

    def __enter__(self) -> "ByteCounter":
        counter, original = self, self._send

        def send(adapter, request, **kwargs):  # type: ignore[no-untyped-def]
            response = original(adapter, request, **kwargs)
            counter.total += int(response.headers.get("Content-Length") or 0)
            return response
        requests.adapters.HTTPAdapter.send = send
        return self

    def __exit__(self, *exc: object) -> None:
        requests.adapters.HTTPAdapter.send = self._send


def replay(dist: str, after: str, until: str, target: str, results: Path) -> tuple[float, int, str]:
    with ByteCounter() as counted:
        started = time.monotonic()
        report = run_watch(WatchRequest(matrix_path=REPO / "matrices" / "default.yaml", results_root=results,
                                        packages=(dist,), after=after, until=until, targets=(target,)))
        seconds = time.monotonic() - started
    return seconds, counted.total, headline(report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="rtx-pro-6000-x8-pcie")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sf-release-to-verdict-"))
    try:
        os.environ["STACKFORGE_WHEEL_CACHE"] = str(scratch / "wheels")
        totals = {"cold": 0.0, "warm": 0.0}
        for dist, after, until in CASES:
            for temperature in ("cold", "warm"):
                seconds, size, line = replay(dist, after, until, args.target, scratch / "results")
                totals[temperature] += seconds
                print(f"{dist} {until} after {after} [{temperature}]: {seconds:5.1f} s, "
                      f"{size / 1e6:7.1f} MB over HTTP; {line}")
        print(f"all {len(CASES)} releases: {totals['cold']:.1f} s cold, {totals['warm']:.1f} s warm "
              f"(targets: < 60 s per release cold, < 300 s for a day's releases)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
