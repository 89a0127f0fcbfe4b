"""GPUs exclusive across stackforge processes (one ``flock`` per GPU UUID in the host's lock folder), and a job
that starts only on idle cards: another process on them is a ``skip`` saying ``busy: pid ...``, never a result
of the stack. ``nvidia-smi`` is a stand-in on PATH that answers each query like a real one."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_gpu_assignment import MISBEHAVE, RTX, _stack

from stackforge.core.records import Status
from stackforge.edges.gpu_locks import (
    GpuFileLocks,
    GpuUsage,
    busy_reason,
    lock_dir,
    lock_name,
    parse_compute_apps,
    parse_memory_used,
)
from stackforge.edges.gpus import detect_host_gpus, lock_keys
from stackforge.probes.catalog import Preconditions, ProbeSpec

UUIDS = ("GPU-11111111-aaaa-bbbb-cccc-000000000004", "GPU-11111111-aaaa-bbbb-cccc-000000000005")
ROWS = ["4, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 590.48.01, 12.0",
        "5, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 590.48.01, 12.0"]


def smi_on_path(folder: Path, monkeypatch: pytest.MonkeyPatch, *, apps: str = "", memory: str | None = None,
                rows: list[str] = ROWS, query: str = "", health: str | None = None) -> None:
    """An ``nvidia-smi`` answering each query stackforge asks: the GPU list, their UUIDs and bus ids, the
    compute processes (``apps``), memory per GPU, health (persistence, ECC) and ``-q`` (``query``)."""
    memory = memory if memory is not None else "\n".join(f"{u}, 3" for u in UUIDS)
    health = health if health is not None else "4, Enabled, 0\n5, Enabled, 0"
    ids = "\n".join(f"{row.split(',')[0]}, {uuid}, 00000000:{17 + i:02X}:00.0" for i, (row, uuid)
                    in enumerate(zip(rows, UUIDS)))
    answers = {"*compute-apps*": apps, "*uuid,memory.used*": memory, "*index,uuid,pci.bus_id*": ids,
               "*persistence_mode*": health, "-q": query, "*index,name,driver_version*": "\n".join(rows)}
    cases = "".join(f"  {pattern}) cat <<'EOF'\n{text}\nEOF\n  ;;\n" for pattern, text in answers.items())
    script = folder / "bin" / "nvidia-smi"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f'#!/bin/sh\ncase "$*" in\n  topo*) echo "topo: not supported"; exit 3;;\n{cases}esac\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")


def runtime_spec(name: str = "visible", script: str = "visible_gpus.py") -> ProbeSpec:
    return ProbeSpec(id=f"t.runtime.{name}", feature="p2p-access", tier="runtime", script=script,
                     description=name, preconditions=Preconditions(needs_gpu_arch=True), default_timeout_s=30)


HOLDER = """
import sys, time
from pathlib import Path
from stackforge.edges.gpu_locks import GpuFileLocks
with GpuFileLocks(Path(sys.argv[1])).holding([sys.argv[2]]) as wait:
    print("held" if wait.held else "not held", flush=True)
    time.sleep(120)
"""


def test_two_processes_contend_for_one_gpu_lock_and_a_crash_frees_it(tmp_path):
    """Another process holds GPU-x: this one waits (its pid is named), gives up when its run is cancelled,
    and takes the card as soon as the holder dies by SIGKILL (the kernel drops an flock with its holder)."""
    folder, key = tmp_path / "locks", UUIDS[0]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), key], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert holder.stdout.readline().strip() == "held"
        locks = GpuFileLocks(folder)
        assert locks.held_by_other(key) == holder.pid
        assert (folder / lock_name(key)).read_text().strip() == str(holder.pid)
        cancel = threading.Event()
        threading.Timer(0.6, cancel.set).start()
        started = time.monotonic()
        with locks.holding([key], cancel) as wait:
            assert (wait.held, wait.cancelled) == (False, True)
        assert time.monotonic() - started >= 0.5          # it waited for the other process, then gave up
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        with locks.holding([key], threading.Event()) as wait:
            assert wait.held and locks.held_by_other(key) is not None   # held by this process's open file now
        assert locks.held_by_other(key) is None
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1777   # every user of the host shares the folder


def test_the_lock_folder_is_one_per_host_unless_configured(monkeypatch):
    assert lock_dir({}) == Path("/tmp/stackforge-gpu-locks")
    assert lock_dir({"STACKFORGE_RUN_DIR": "/run/sf"}) == Path("/run/sf")
    assert lock_name("GPU-ab/../x") == "gpu-GPU-ab____x.lock"


def test_lock_keys_are_the_uuids_of_the_assigned_cards(tmp_path, monkeypatch):
    smi_on_path(tmp_path, monkeypatch)
    host = detect_host_gpus(None)
    assert [d.uuid for d in host.devices] == list(UUIDS)
    assert host.devices[0].pci_bus_id == "00000000:11:00.0"
    from stackforge.edges.gpus import GpuAssignment
    assert lock_keys(host, GpuAssignment((5,))) == (UUIDS[1],)
    assert lock_keys(host, GpuAssignment(None)) == UUIDS                 # every card
    assert lock_keys(host, GpuAssignment(())) == ()


def test_busy_reason_names_other_processes_and_heavy_memory():
    apps = parse_compute_apps(f"{UUIDS[0]}, 4242, 3000\nNo running processes found\n")
    assert apps == ((UUIDS[0], 4242, 3000),)
    usage = GpuUsage(apps, parse_memory_used(f"{UUIDS[0]}, 3010\n{UUIDS[1]}, 5000"))
    assert busy_reason(usage, [UUIDS[0]], threshold_mib=1024) == f"busy: pid 4242 on {UUIDS[0]} (3000 MiB)"
    # our own process is no other user; its 3000 MiB still count against the threshold
    assert busy_reason(usage, [UUIDS[0]], threshold_mib=1024, own_pids=frozenset({4242})).startswith(
        f"busy: {UUIDS[0]} uses 3010 MiB")
    assert busy_reason(GpuUsage((), usage.memory_used), [UUIDS[1]], threshold_mib=1024) == (
        f"busy: {UUIDS[1]} uses 5000 MiB (over 1024 MiB, no compute process listed)")
    assert busy_reason(GpuUsage((), ((UUIDS[1], 12),)), [UUIDS[1]], threshold_mib=1024) is None
    assert busy_reason(GpuUsage(error="nvidia-smi timed out"), [UUIDS[1]], threshold_mib=1024).startswith(
        "busy: cannot tell whether GPUs")


def test_a_job_on_a_busy_gpu_is_a_skip_naming_the_pid_and_nothing_runs(tmp_path, monkeypatch):
    """Another user's process holds 3000 MiB on card 4: the runtime job for cards 4,5 is skipped before it
    starts, with the pid (the interpreter does not exist: had it started, the record would be an error)."""
    from stackforge.jobs.campaign import CellJob
    from stackforge.probes.campaign import run_probe_jobs

    monkeypatch.setenv("STACKFORGE_RUN_DIR", str(tmp_path / "locks"))
    smi_on_path(tmp_path, monkeypatch, apps=f"{UUIDS[0]}, 4242, 3000")
    host = detect_host_gpus(None)
    records = run_probe_jobs([CellJob(_stack(), RTX, runtime_spec())], run_id="t", host_gpus=host,
                             write=lambda record: None, local_python="/nonexistent/python", scripts_dir=MISBEHAVE)
    assert [(r.outcome.status, r.outcome.reason) for r in records] == [
        (Status.SKIP, f"busy: pid 4242 on {UUIDS[0]} (3000 MiB)")]


def test_a_job_on_idle_gpus_runs_and_holds_their_host_wide_locks(tmp_path, monkeypatch):
    from stackforge.jobs.campaign import CellJob
    from stackforge.probes.campaign import run_probe_jobs

    folder = tmp_path / "locks"
    monkeypatch.setenv("STACKFORGE_RUN_DIR", str(folder))
    smi_on_path(tmp_path, monkeypatch)
    host = detect_host_gpus(None)
    records = run_probe_jobs([CellJob(_stack(), RTX, runtime_spec())], run_id="t", host_gpus=host,
                             write=lambda record: None, local_python=sys.executable, scripts_dir=MISBEHAVE)
    assert [(r.outcome.status, r.outcome.evidence) for r in records] == [(Status.PASS, "4,5")]
    assert sorted(p.name for p in folder.iterdir()) == sorted(lock_name(u) for u in UUIDS)


def test_a_failure_while_another_process_came_onto_the_gpus_is_undecided_not_the_stacks(tmp_path, monkeypatch):
    """Idle when the job starts, another process on card 4 when it has crashed: the crash is the busy host's
    to explain (``undecided``), never the stack's ``crash``."""
    from stackforge.jobs.campaign import CellJob
    from stackforge.probes.campaign import run_probe_jobs

    monkeypatch.setenv("STACKFORGE_RUN_DIR", str(tmp_path / "locks"))
    smi_on_path(tmp_path, monkeypatch)
    seen = tmp_path / "asked-once"
    script = tmp_path / "bin" / "nvidia-smi"
    # The first question about compute processes finds none; every later one finds pid 777.
    script.write_text(script.read_text().replace(
        '  *compute-apps*) cat',
        f'  *compute-apps*) if [ -e {seen} ]; then echo "{UUIDS[0]}, 777, 9000"; exit 0; fi; touch {seen}; cat', 1))
    host = detect_host_gpus(None)
    records = run_probe_jobs([CellJob(_stack(), RTX, runtime_spec("segv", "segv.py"))], run_id="t", host_gpus=host,
                             write=lambda record: None, local_python=sys.executable, scripts_dir=MISBEHAVE)
    [record] = records
    assert record.outcome.status is Status.UNDECIDED, record.outcome
    assert record.outcome.reason.startswith(f"host: busy: pid 777 on {UUIDS[0]} (9000 MiB) after the job "
                                            "(the job ended crash:")
    assert record.outcome.metrics["host_fault"]["ended"] == "crash"


def test_a_lock_folder_that_cannot_be_made_is_one_clear_error(tmp_path):
    from stackforge.core.errors import HostError

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(HostError, match="cannot take the host-wide GPU lock") as raised:
        with GpuFileLocks(blocker / "locks").holding([UUIDS[0]]):
            pass
    assert "STACKFORGE_RUN_DIR" in raised.value.one_line()


def test_cards_known_only_by_index_are_checked_against_every_gpu():
    """nvidia-smi gave no UUIDs: the lock keys are ``index-N``, which match no usage row; the idle check must
    not pass for that reason alone."""
    from stackforge.edges.gpu_locks import GpuUsage, busy_reason

    usage = GpuUsage(processes=(("GPU-aaaa", 4242, 3000),))
    assert busy_reason(usage, ["index-0"], threshold_mib=1024) == "busy: pid 4242 on GPU-aaaa (3000 MiB)"
    assert busy_reason(GpuUsage(memory_used=(("GPU-aaaa", 5000),)), ["all"], threshold_mib=1024).startswith("busy:")
    assert busy_reason(GpuUsage(memory_used=(("GPU-aaaa", 10),)), ["index-0"], threshold_mib=1024) is None
