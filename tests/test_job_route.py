"""How far a record travels: a probe job's record, from the campaign's call to the moment it is
stored, is handed back (returned) by at most two functions -- the one that makes it and the one
place that judges a job's ending. Measured on a real local run with a profiler on every thread."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from _build_helpers import small_cell

from stackforge.core.model import Interconnect, Target
from stackforge.core.records import ResultRecord, Status
from stackforge.edges.gpus import HostGpus
from stackforge.jobs.campaign import CellJob
from stackforge.probes.campaign import run_probe_jobs
from stackforge.probes.catalog import Preconditions, ProbeSpec

pytestmark = pytest.mark.fast

MISBEHAVE = Path(__file__).resolve().parent / "probes_misbehave"
TARGET = Target(name="rtx-pro-6000-x2-pcie", gpu="NVIDIA RTX PRO 6000 Blackwell", arch="12.0", gpu_count=2,
                interconnect=Interconnect.PCIE)


def test_a_probe_record_is_returned_at_most_twice_before_it_is_stored():
    returned: list[tuple[int, str]] = []      # (id of the record, the function that returned it)
    at_store: list[list[str]] = []

    def profile(frame, event, arg):
        if event == "return" and isinstance(arg, ResultRecord):
            returned.append((id(arg), frame.f_code.co_qualname))

    def write(record: ResultRecord) -> None:
        at_store.append([name for key, name in returned if key == id(record)])

    spec = ProbeSpec(id="t.ok", feature="p2p-access", tier="gate", script="ok.py", description="",
                     preconditions=Preconditions(), default_timeout_s=60)
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        records = run_probe_jobs([CellJob(small_cell()[0], TARGET, spec)], run_id="route", write=write,
                                 host_gpus=HostGpus(False, "no GPU on this test host"), local_python=sys.executable,
                                 scripts_dir=MISBEHAVE)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert [r.outcome.status for r in records] == [Status.PASS]
    assert at_store == [["make_record", "judge"]], at_store
