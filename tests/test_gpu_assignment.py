"""Which host GPUs a probe or bench gets: per-target arch on mixed hosts, none for gate probes.

A host with four H100 (sm_90) and two RTX PRO 6000 (sm_120) must run an sm_120 target's runtime
probes on cards 4 and 5 only, skip a target whose arch it lacks (naming what it has), and keep GPUs
away from gate probes, whose arch comes from ``--target``. ``nvidia-smi`` is the real edge here, so
the tests put a stand-in ``nvidia-smi`` on PATH (the parsing and assignment logic is what is tested);
the local runs are real subprocesses.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from _probe_runs import ProbeContext, run_locally

from stackforge.bench.catalog import catalog as bench_catalog
from stackforge.bench.run import BenchOptions, unmet_precondition
from stackforge.core.model import Interconnect, Stack, Target
from stackforge.core.records import Status
from stackforge.edges.gpus import GpuAssignment, HostGpu, HostGpus, assign_gpus, detect_host_gpus, host_facts
from stackforge.jobs.job_runner import gpus_for
from stackforge.probes.catalog import Preconditions, ProbeSpec

MISBEHAVE = Path(__file__).resolve().parent / "probes_misbehave"
RTX = Target(name="rtx-pro-6000-x8-pcie", gpu="NVIDIA RTX PRO 6000 Blackwell", arch="12.0", gpu_count=2,
             interconnect=Interconnect.PCIE)
H100 = Target(name="h100-x4", gpu="NVIDIA H100 80GB HBM3", arch="9.0", gpu_count=4, interconnect=Interconnect.NVSWITCH)
B200 = Target(name="b200-x8", gpu="NVIDIA B200", arch="10.0", gpu_count=8, interconnect=Interconnect.NVSWITCH)
MIXED_SMI = ["0, NVIDIA H100 80GB HBM3, 590.48.01, 9.0", "1, NVIDIA H100 80GB HBM3, 590.48.01, 9.0",
             "2, NVIDIA H100 80GB HBM3, 590.48.01, 9.0", "3, NVIDIA H100 80GB HBM3, 590.48.01, 9.0",
             "4, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 590.48.01, 12.0",
             "5, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 590.48.01, 12.0"]


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: list[str], *, knows_compute_cap: bool = True,
             topology: str | None = None) -> None:
    """An ``nvidia-smi`` on PATH that answers ``--query-gpu`` like a real one (an old one rejects compute_cap),
    and ``topo -m`` with ``topology`` (without one, ``topo`` fails: links unknown)."""
    lines = "\n".join(r if knows_compute_cap else r.rsplit(",", 1)[0] for r in rows)
    old = "" if knows_compute_cap else (
        'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; esac\n')
    topo = (f"if [ \"$1\" = topo ]; then cat <<'TOPO'\n{topology}\nTOPO\nexit 0; fi\n" if topology is not None
            else 'if [ "$1" = topo ]; then echo "topo: not supported"; exit 3; fi\n')
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\n{topo}{old}cat <<'ROWS'\n{lines}\nROWS\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")


def test_nvidia_smi_rows_become_devices_with_their_arch(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, MIXED_SMI)
    host = detect_host_gpus(None)
    assert host.available and host.driver == "590.48.01"
    assert host.devices[0] == HostGpu(0, "NVIDIA H100 80GB HBM3", "9.0")
    assert host.devices[5] == HostGpu(5, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0")
    assert "5: NVIDIA RTX PRO 6000 Blackwell Workstation Edition (12.0)" in host.evidence


def test_an_old_nvidia_smi_without_compute_cap_gives_every_gpu(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, MIXED_SMI, knows_compute_cap=False)
    host = detect_host_gpus(None)
    assert host.available and [d.arch for d in host.devices] == [None] * 6
    assert assign_gpus(host, RTX) == GpuAssignment(None)
    assert assign_gpus(host, RTX).docker_gpus() == "all" and assign_gpus(host, RTX).environment() == {}


def test_a_mixed_host_gives_each_target_its_own_cards(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, MIXED_SMI)
    host = detect_host_gpus(None)
    rtx, h100, b200 = (assign_gpus(host, t) for t in (RTX, H100, B200))
    assert rtx.devices == (4, 5) and rtx.docker_gpus() == "device=4,5"
    # nvidia-smi's indices are in PCI bus order; CUDA's default order (fastest first) is not
    assert rtx.environment() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "4,5"}
    assert h100.devices == (0, 1, 2, 3) and h100.skip_reason is None
    assert b200.devices == () and b200.docker_gpus() is None
    assert b200.skip_reason.startswith("no GPU of compute capability 10.0 (b200-x8) on this host: 0: NVIDIA H100")


def test_no_gpu_host_skips_with_its_evidence():
    host = HostGpus(False, "nvidia-smi not found on the host")
    assert assign_gpus(host, RTX).skip_reason == "no GPU on this host: nvidia-smi not found on the host"


def _spec(tier: str) -> ProbeSpec:
    return ProbeSpec(id=f"t.{tier}.visible", feature="p2p-access", tier=tier, script="visible_gpus.py",
                     description="reports CUDA_VISIBLE_DEVICES", preconditions=Preconditions(), default_timeout_s=30)


def _stack() -> Stack:
    from _build_helpers import small_cell
    return small_cell()[0]


def test_local_runtime_probe_sees_only_the_targets_cards_and_gate_probe_none(tmp_path, monkeypatch):
    """Real subprocesses: the runtime probe gets CUDA_VISIBLE_DEVICES=4,5, the gate probe an empty one,
    and a target the host cannot serve is skipped before anything runs."""
    fake_smi(tmp_path, monkeypatch, MIXED_SMI)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    host = detect_host_gpus(None)
    stack = _stack()
    runtime = run_locally(stack, _spec("runtime"), ProbeContext("t", RTX, host, scripts_dir=MISBEHAVE))
    gate = run_locally(stack, _spec("gate"), ProbeContext("t", RTX, host, scripts_dir=MISBEHAVE))
    absent = run_locally(stack, _spec("runtime"), ProbeContext("t", B200, host, scripts_dir=MISBEHAVE))
    assert (runtime.outcome.status, runtime.outcome.evidence) == (Status.PASS, "4,5")
    assert runtime.outcome.metrics["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (gate.outcome.status, gate.outcome.evidence) == (Status.PASS, "")
    assert absent.outcome.status is Status.SKIP and "no GPU of compute capability 10.0" in absent.outcome.reason


def test_gpu_benches_follow_the_same_assignment(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, MIXED_SMI)
    host = detect_host_gpus(None)
    benches = {spec.id: spec for spec in bench_catalog()}
    gemm, gloo = benches["bench.gemm"], benches["bench.allreduce.gloo"]
    options = BenchOptions()
    assert gpus_for(gemm, RTX, host).docker_gpus() == "device=4,5"
    assert gpus_for(gemm, RTX, host).environment() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                                       "CUDA_VISIBLE_DEVICES": "4,5"}   # --local
    assert gpus_for(gloo, RTX, host).docker_gpus() is None, "the CPU harness self-test gets no GPU"
    reason, evidence = unmet_precondition(gemm, B200, host, options)
    assert reason.startswith("no GPU of compute capability 10.0") and "590.48.01" in evidence


def test_probe_preconditions_are_consulted_where_jobs_are_scheduled(tmp_path, monkeypatch):
    """A runtime probe needing two GPUs, for a one-GPU target, is a skip with the reason before any
    process starts (the interpreter below does not exist); one the target meets is scheduled to run."""
    from stackforge.jobs.campaign import CellJob
    from stackforge.probes.campaign import run_probe_jobs
    from stackforge.probes.execute import plan_probe_job

    fake_smi(tmp_path, monkeypatch, MIXED_SMI)
    host = detect_host_gpus(None)
    single = Target(name="rtx-x1", gpu="NVIDIA RTX PRO 6000 Blackwell", arch="12.0", gpu_count=1,
                    interconnect=Interconnect.PCIE)
    pair = ProbeSpec(id="t.runtime.pair", feature="p2p-access", tier="runtime", script="visible_gpus.py",
                     description="needs two GPUs", preconditions=Preconditions(min_gpus=2, needs_gpu_arch=True))
    assert plan_probe_job(_stack(), pair, RTX, host).skip_reason is None
    planned = plan_probe_job(_stack(), pair, single, host)
    assert planned.skip_reason == "target rtx-x1 has 1 GPU(s); t.runtime.pair needs 2"
    written = []
    records = run_probe_jobs([CellJob(_stack(), single, pair)], run_id="t", host_gpus=host, write=written.append,
                             local_python="/nonexistent/python", scripts_dir=MISBEHAVE)
    assert [(r.outcome.status, r.outcome.reason, r.outcome.evidence) for r in records] == [
        (Status.SKIP, "target rtx-x1 has 1 GPU(s); t.runtime.pair needs 2", "rtx-x1: gpu_count=1")]
    assert written == records


def test_jobs_that_get_gpus_never_share_a_card_and_gate_jobs_stay_parallel(tmp_path, monkeypatch):
    """Four jobs, four workers: the two runtime jobs for the same target get the same cards (4,5) and
    must run one after the other; the two gate jobs (no GPU) run beside them. A runtime job on the
    H100 cards (0-3) shares no card with them and may overlap."""
    from stackforge.jobs.campaign import CellJob
    from stackforge.probes.campaign import run_probe_jobs

    fake_smi(tmp_path, monkeypatch, MIXED_SMI)
    host = detect_host_gpus(None)

    def spec(name: str, tier: str) -> ProbeSpec:
        needs = Preconditions(needs_gpu_arch=True) if tier == "runtime" else Preconditions()
        return ProbeSpec(id=f"t.{name}", feature="p2p-access", tier=tier, script="gpu_window.py",
                         description=name, preconditions=needs, default_timeout_s=60)

    jobs = [CellJob(_stack(), RTX, spec("run-a", "runtime")), CellJob(_stack(), RTX, spec("run-b", "runtime")),
            CellJob(_stack(), RTX, spec("gate-a", "gate")), CellJob(_stack(), RTX, spec("gate-b", "gate")),
            CellJob(_stack(), H100, spec("run-h100", "runtime"))]
    records = run_probe_jobs(jobs, run_id="t", host_gpus=host, write=lambda r: None, parallel=5,
                             local_python=sys.executable, scripts_dir=MISBEHAVE)
    windows = {r.probe: (r.outcome.metrics["started"], r.outcome.metrics["ended"], r.outcome.evidence)
               for r in records}
    assert all(r.outcome.status is Status.PASS for r in records), [r.outcome.reason for r in records]

    def overlap(a: str, b: str) -> bool:
        return windows[a][0] < windows[b][1] and windows[b][0] < windows[a][1]

    assert windows["t.run-a"][2] == windows["t.run-b"][2] == "4,5"
    assert not overlap("t.run-a", "t.run-b"), windows            # the same cards: one after the other
    assert windows["t.gate-a"][2] == ""                           # gate jobs get no GPU ...
    assert overlap("t.gate-a", "t.gate-b")                        # ... and run side by side
    assert windows["t.run-h100"][2] == "0,1,2,3"
    assert overlap("t.run-h100", "t.run-a") or overlap("t.run-h100", "t.run-b")   # disjoint cards may overlap



def topo_matrix(links: dict[tuple[int, int], str], count: int) -> str:
    """An ``nvidia-smi topo -m`` text for ``count`` GPUs with the given pair links."""
    header = "\t" + "\t".join(f"GPU{i}" for i in range(count)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = []
    for i in range(count):
        cells = [" X " if i == j else links[tuple(sorted((i, j)))] for j in range(count)]
        rows.append(f"GPU{i}\t" + "\t".join(cells) + "\t0-55\t0\t\tN/A")
    return "\n".join([header, *rows, "", "Legend:", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks"])


def test_only_the_targets_model_count_and_interconnect_are_its_hardware(tmp_path, monkeypatch):
    """An RTX 5090 is no RTX PRO 6000, an H100 PCIe no H100 SXM, 4 cards are not the 8 of the target, and
    NVLink-bridged cards are not a PCIe-only box: each is a skip naming what the host has, before anything runs."""
    from stackforge.plan.rules import load_targets

    targets = load_targets()
    rtx8, h100 = targets["rtx-pro-6000-x8-pcie"], targets["h100-x8-nvswitch"]
    rtx2 = targets["rtx-pro-6000-x2-pcie"]

    def host(rows, topology=None, sub="a"):
        folder = tmp_path / sub
        folder.mkdir()
        fake_smi(folder, monkeypatch, rows, topology=topology)
        return detect_host_gpus(None)

    geforce = host([f"{i}, NVIDIA GeForce RTX 5090, 590.48.01, 12.0" for i in range(8)], sub="5090")
    assert assign_gpus(geforce, rtx8).skip_reason == (
        "not the target's GPU model: rtx-pro-6000-x8-pcie is NVIDIA RTX PRO 6000 Blackwell; this host's compute "
        "capability 12.0 GPUs are NVIDIA GeForce RTX 5090")
    pcie_h100 = host([f"{i}, NVIDIA H100 PCIe, 590.48.01, 9.0" for i in range(8)], sub="h100pcie")
    assert assign_gpus(pcie_h100, h100).skip_reason.startswith("not the target's GPU model: h100-x8-nvswitch is "
                                                               "NVIDIA H100 80GB HBM3")
    workstation = [f"{i}, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 590.48.01, 12.0" for i in range(4)]
    half = host(workstation, sub="half")
    assert assign_gpus(half, rtx8).skip_reason.startswith(
        "too few GPUs: rtx-pro-6000-x8-pcie has 8 NVIDIA RTX PRO 6000 Blackwell; this host has 4 (0: NVIDIA RTX")
    bridged = host(workstation, topology=topo_matrix({(0, 1): "NV4", (0, 2): "SYS", (0, 3): "SYS", (1, 2): "SYS",
                                                      (1, 3): "SYS", (2, 3): "NV4"}, 4), sub="bridged")
    assert assign_gpus(bridged, rtx2).skip_reason == (
        "not the target's interconnect: rtx-pro-6000-x2-pcie is PCIe only; this host's GPUs 0 and 1 connect over "
        "NVLink (NV4, nvidia-smi topo -m)")
    plain = host(workstation, topology=topo_matrix({pair: "PIX" for pair in [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3),
                                                                             (2, 3)]}, 4), sub="plain")
    assert assign_gpus(plain, rtx2) == GpuAssignment((0, 1))               # the target's two cards, no more
    assert plain.link(1, 0) == "PIX" and "links from nvidia-smi topo -m" in plain.evidence
    sxm = [f"{i}, NVIDIA H100 80GB HBM3, 590.48.01, 9.0" for i in range(8)]
    over_pcie = host(sxm, topology=topo_matrix({(i, j): "SYS" for i in range(8) for j in range(i + 1, 8)}, 8),
                     sub="sxm-pcie")
    assert assign_gpus(over_pcie, h100).skip_reason == (
        "not the target's interconnect: h100-x8-nvswitch is nvswitch; this host's GPUs 0 and 1 connect over SYS "
        "(PCIe, nvidia-smi topo -m)")
    switched = host(sxm, topology=topo_matrix({(i, j): "NV18" for i in range(8) for j in range(i + 1, 8)}, 8),
                    sub="sxm")
    assert assign_gpus(switched, h100) == GpuAssignment(tuple(range(8)))


def test_a_run_records_the_host_it_ran_on_beside_its_records(tmp_path, monkeypatch):
    """host.json: GPUs, driver and nvidia-smi topo -m of the run's host (what a P2P fault is judged against);
    it sits beside run.json and is never read as a record."""
    from stackforge.results.store import HOST_FILE, ResultsFolder, load_results

    topology = topo_matrix({(0, 1): "PIX"}, 2)
    fake_smi(tmp_path, monkeypatch, MIXED_SMI[4:], topology=topology)
    host = detect_host_gpus(None)
    store = ResultsFolder(tmp_path / "results", command=("stackforge", "probe"))
    run_dir = store.start(matrix_source="m.yaml", shard=None)
    store.note_host(run_dir, host_facts(host))
    written = json.loads((run_dir / HOST_FILE).read_text())
    assert written["schema"] == "stackforge.host" and written["driver"] == "590.48.01"
    assert written["links"] == [[0, 1, "PIX"]] and written["topology"].startswith("GPU0\tGPU1")
    assert [g["arch"] for g in written["gpus"]] == ["12.0", "12.0"] and written["acs"] == "not read"
    assert load_results(tmp_path / "results").problems == ()

