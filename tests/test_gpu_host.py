"""The host check before a runtime run and ``doctor --gpu``: pure judgements of made-up facts, the facts read
from a stand-in ``nvidia-smi`` and a made-up ``/sys``, and what a run does with them: a driver below the
stack's floor is a skip naming both, a record on a GPU the check failed is ``undecided (host: ...)``, and
``host.json`` carries the check from the run's start (an interrupted run too)."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
from click.testing import CliRunner
from test_gpu_assignment import MISBEHAVE, _stack
from test_gpu_locks import UUIDS, runtime_spec, smi_on_path

from stackforge.core.model import Interconnect, Target
from stackforge.core.records import Status
from stackforge.edges.gpu_host import (
    FindingStatus,
    GpuHealth,
    HostGpuFacts,
    judge_gpu_host,
    parse_acs,
    parse_fabric,
    read_gpu_host_facts,
)
from stackforge.edges.gpus import detect_host_gpus
from stackforge.jobs.job_runner import HostGate, check_host

RTX2 = Target("rtx-pro-6000-x2-pcie", "NVIDIA RTX PRO 6000 Blackwell", "12.0", 2, Interconnect.PCIE,
              min_driver="570.26")
H100 = Target("h100-x2-nvswitch", "NVIDIA H100 80GB HBM3", "9.0", 2, Interconnect.NVSWITCH, multicast=True)
GPUS = (GpuHealth(0, UUIDS[0], "00000000:11:00.0", "Enabled", 0), GpuHealth(1, UUIDS[1], "00000000:12:00.0",
                                                                             "Enabled", 0))


def facts(**changes) -> HostGpuFacts:
    return dataclasses.replace(HostGpuFacts("590.48.01", GPUS, (), 0, (), "1"), **changes)


def by_check(verdict) -> dict[str, tuple[str, str]]:
    return {f.check: (f.status.value, f.text) for f in verdict.findings}


def test_a_healthy_rtx_host_is_ok():
    verdict = judge_gpu_host(facts(), RTX2)
    assert verdict.status is FindingStatus.OK, verdict.findings
    assert verdict.fault_for((0, 1)) is None


def test_the_uvm_hmm_setting_the_rtx_pro_6000_community_documents_fails_multi_gpu_jobs_only():
    verdict = judge_gpu_host(facts(uvm_disable_hmm="0"), RTX2)
    status, text = by_check(verdict)["uvm hmm"]
    assert status == "fail" and "uvm_disable_hmm=0" in text and "rtx6kpro" in text
    assert verdict.fault_for((0, 1)).check == "uvm hmm"
    assert verdict.fault_for((0,)) is None                 # one GPU: no P2P
    assert by_check(judge_gpu_host(facts(uvm_disable_hmm=None), RTX2))["uvm hmm"][0] == "not readable"
    assert "uvm hmm" not in by_check(judge_gpu_host(facts(uvm_disable_hmm="0"), H100))   # not its setting


def test_fabric_manager_matters_on_nvswitch_targets_only():
    waiting = tuple(dataclasses.replace(g, fabric_state="In Progress", fabric_status="N/A") for g in GPUS)
    verdict = judge_gpu_host(facts(gpus=waiting), H100)
    status, text = by_check(verdict)["fabric manager"]
    assert status == "fail" and "nvidia-fabricmanager" in text and verdict.fault_for((1,)) is not None
    done = tuple(dataclasses.replace(g, fabric_state="Completed", fabric_status="Success") for g in GPUS)
    assert by_check(judge_gpu_host(facts(gpus=done), H100))["fabric manager"][0] == "ok"
    assert "fabric manager" not in by_check(judge_gpu_host(facts(gpus=waiting), RTX2))


def test_host_fault_xids_and_ecc_fail_their_gpu_and_an_unreadable_log_is_a_fact():
    lines = ("NVRM: Xid (PCI:0000:12:00): 79, pid=1234, GPU has fallen off the bus.",
             "NVRM: Xid (PCI:0000:11:00): 13, pid=99, Graphics Exception")   # a program's own error
    verdict = judge_gpu_host(facts(xid_lines=lines), RTX2)
    assert verdict.fault_for((1,)).check == "xid" and verdict.fault_for((0,)) is None
    ecc = judge_gpu_host(facts(gpus=(GPUS[0], dataclasses.replace(GPUS[1], ecc_uncorrected=3))), RTX2)
    assert ecc.fault_for((1,)).text == "uncorrected ECC errors: GPU 1: 3" and ecc.fault_for((0,)) is None
    unread = judge_gpu_host(facts(xid_lines=None, unreadable=(("dmesg", "dmesg exit 1: Operation not permitted"),)),
                            RTX2)
    assert by_check(unread)["xid"] == ("not readable", "kernel log not readable: dmesg exit 1: Operation not "
                                                       "permitted")
    assert unread.fault_for(None) is None


def test_acs_redirect_on_a_pcie_box_is_recorded_not_a_fault():
    verdict = judge_gpu_host(facts(iommu_groups=40, acs_redirect=("00:01.1",)), RTX2)
    status, text = by_check(verdict)["iommu/acs"]
    assert status == "warn" and "IOMMU on (40 groups)" in text and "vllm#33041" in text
    assert verdict.fault_for((0, 1)) is None


def test_parsers_read_nvidia_smi_q_and_lspci():
    query = ("GPU 00000000:11:00.0\n    Product Name  : NVIDIA H100\n    Fabric\n        State      : Completed\n"
             "        Status     : Success\n    Persistence Mode : Enabled\n"
             "GPU 00000000:12:00.0\n    Fabric\n        State      : In Progress\n        Status     : N/A\n")
    assert parse_fabric(query) == [("Completed", "Success"), ("In Progress", "N/A")]
    lspci = ("00:01.1 PCI bridge: AMD\n\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+\n"
             "00:01.2 PCI bridge: AMD\n\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd-\n")
    assert parse_acs(lspci) == ("00:01.1",)


def test_the_edge_reads_nvidia_smi_and_sys(tmp_path, monkeypatch):
    smi_on_path(tmp_path, monkeypatch, health="4, Disabled, 0\n5, Enabled, [N/A]")
    root = tmp_path / "root"
    (root / "sys/kernel/iommu_groups/0").mkdir(parents=True)
    (root / "sys/module/nvidia_uvm/parameters").mkdir(parents=True)
    (root / "sys/module/nvidia_uvm/parameters/uvm_disable_hmm").write_text("N\n")
    read = read_gpu_host_facts(detect_host_gpus(None), root=root)
    assert [(g.index, g.uuid, g.persistence_mode, g.ecc_uncorrected) for g in read.gpus] == [
        (4, UUIDS[0], "Disabled", 0), (5, UUIDS[1], "Enabled", None)]
    assert read.iommu_groups == 1 and read.uvm_disable_hmm == "N" and read.driver == "590.48.01"
    verdict = judge_gpu_host(read, RTX2)
    assert by_check(verdict)["persistence"][0] == "warn"
    assert by_check(verdict)["uvm hmm"][0] == "fail"           # N: HMM on


# ------------------------------------------------------------------------------------------------ in a run


def run_one(tmp_path, monkeypatch, gate: HostGate, spec=None):
    from stackforge.jobs.campaign import CellJob
    from stackforge.probes.campaign import run_probe_jobs

    monkeypatch.setenv("STACKFORGE_RUN_DIR", str(tmp_path / "locks"))
    host = detect_host_gpus(None)
    target = dataclasses.replace(RTX2, name="rtx-pro-6000-x8-pcie")
    return run_probe_jobs([CellJob(_stack(), target, spec or runtime_spec())], run_id="t", host_gpus=host,
                          write=lambda record: None, local_python=sys.executable, scripts_dir=MISBEHAVE,
                          host_check=gate)


def test_a_driver_below_the_stacks_floor_is_a_skip_naming_both(tmp_path, monkeypatch):
    smi_on_path(tmp_path, monkeypatch)
    gate = HostGate(floors={(_stack().id, "rtx-pro-6000-x8-pcie"): "595"}, driver="590.48.01")
    [record] = run_one(tmp_path, monkeypatch, gate)
    assert record.outcome.status is Status.SKIP
    assert record.outcome.reason.startswith("host: driver 590.48.01 is below the stack's driver floor >= 595")


def test_a_record_on_a_gpu_the_host_check_failed_is_undecided_never_the_stacks(tmp_path, monkeypatch):
    """The job runs (its evidence is kept) but its pass is the host's to explain: undecided (host: ...)."""
    smi_on_path(tmp_path, monkeypatch)
    target = dataclasses.replace(RTX2, name="rtx-pro-6000-x8-pcie")
    gate = HostGate({target.name: judge_gpu_host(facts(uvm_disable_hmm="0"), target)}, driver="590.48.01")
    [record] = run_one(tmp_path, monkeypatch, gate)
    assert record.outcome.status is Status.UNDECIDED
    assert record.outcome.reason.startswith("host: uvm hmm: nvidia_uvm uvm_disable_hmm=0")
    assert record.outcome.reason.endswith("(the job ended pass: )") or "the job ended pass" in record.outcome.reason
    assert record.outcome.metrics["host_fault"] == {"why": record.outcome.metrics["host_fault"]["why"],
                                                    "gpus": [4, 5], "ended": "pass"}
    assert record.outcome.evidence == "4,5"


def test_check_host_reads_the_facts_only_for_targets_this_host_runs(tmp_path, monkeypatch):
    smi_on_path(tmp_path, monkeypatch)
    host = detect_host_gpus(None)
    from stackforge.jobs.campaign import CellJob
    target = dataclasses.replace(RTX2, name="rtx-pro-6000-x8-pcie")
    calls = []
    gate = check_host(host, [CellJob(_stack(), target, runtime_spec()), CellJob(_stack(), H100, runtime_spec())],
                      {}, read=lambda gpus: calls.append(gpus) or facts())
    assert len(calls) == 1 and list(gate.verdicts) == [target.name]
    written = gate.to_json()["host_check"]
    assert written["targets"][target.name]["status"] == "ok" and written["facts"]["uvm_disable_hmm"] == "1"


@pytest.mark.parametrize("kind", ["probe", "bench"])
def test_host_json_carries_the_check_from_the_start_of_a_run_even_when_interrupted(tmp_path, monkeypatch, kind):
    from stackforge.bench.campaign import BenchRequest, run_bench_campaign
    from stackforge.plan.selection import StackSelection
    from stackforge.probes.campaign import ProbeRequest, run_probe_campaign
    from stackforge.results.store import HOST_FILE, ResultsFolder

    smi_on_path(tmp_path / "smi", monkeypatch)
    monkeypatch.setenv("STACKFORGE_RUN_DIR", str(tmp_path / "locks"))
    target = ("rtx-pro-6000-x2-pcie",)
    only = ("cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12",)

    def interrupt(started):
        raise KeyboardInterrupt

    store = ResultsFolder(tmp_path / "results")
    with pytest.raises(KeyboardInterrupt):
        if kind == "probe":
            run_probe_campaign(ProbeRequest(StackSelection(targets=target), tier="runtime",
                                            local_python=sys.executable),
                               store=store, connect=lambda: None, on_start=interrupt)
        else:
            run_bench_campaign(BenchRequest(StackSelection(only=only, targets=target), ids=("bench.gemm",),
                                            local_python=sys.executable),
                               store=store, connect=lambda: None, on_start=interrupt)
    [host_file] = (tmp_path / "results").glob(f"*/{HOST_FILE}")
    written = json.loads(host_file.read_text())
    check = written["host_check"]
    assert check["driver"] == "590.48.01" and list(check["targets"]) == ["rtx-pro-6000-x2-pcie"]
    assert {f["check"] for f in check["targets"]["rtx-pro-6000-x2-pcie"]["findings"]} >= {"driver", "xid", "uvm hmm"}
    assert [g["uuid"] for g in written["gpus"]] == list(UUIDS)
    assert written["check"]["status"] in ("pass", "warn")       # this host's /sys and dmesg: no fault expected


def test_the_runs_one_word_is_what_the_reports_read():
    """``host.json``'s ``check`` in the shape :func:`host_check_faults` reads: a P2P-only finding (the HMM
    setting) blames the collectives on the cards; an Xid on one GPU is left to the job runner."""
    from stackforge.report.compat_matrix import host_check_faults

    target = RTX2
    hmm = HostGate({target.name: judge_gpu_host(facts(uvm_disable_hmm="0"), target)}).to_json()["check"]
    assert hmm["status"] == "fail" and hmm["p2p"] is True and "gpus" not in hmm
    xid = HostGate({target.name: judge_gpu_host(facts(xid_lines=(
        "NVRM: Xid (PCI:0000:12:00): 79, pid=1, GPU has fallen off the bus.",)), target)}).to_json()["check"]
    assert xid == {"status": "fail", "p2p": False, "gpus": [1], "reason": xid["reason"]}
    assert xid["reason"].startswith("xid: host-fault Xid on GPU 1 since boot")
    faults = host_check_faults({"run-a": {"check": xid}, "run-b": {"check": hmm}})
    # An Xid on listed GPUs: the job runner judged each job against its own cards when it ran (host indices are
    # not a job's CUDA indices), so the report adds nothing for that run; the P2P-only finding blames every pair.
    assert "run-a" not in faults
    assert faults["run-b"].p2p and faults["run-b"].pairs is None
    assert HostGate().to_json()["check"]["status"] == "not run"
    assert HostGate({target.name: judge_gpu_host(facts(), target)}).to_json()["check"]["status"] == "pass"


def test_doctor_gpu_runs_the_host_check_for_each_runnable_target(tmp_path, monkeypatch):
    from stackforge.cli import cli

    smi_on_path(tmp_path, monkeypatch, health="4, Disabled, 0\n5, Disabled, 0")
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")     # no engine: the doctor still answers
    result = CliRunner().invoke(cli, ["doctor", "--gpu", "--json", "--index-url", "file:///nonexistent"])
    report = json.loads(result.stdout)
    lines = {c["name"]: c for c in report["checks"] if c["name"].startswith("gpu host")}
    assert lines["gpu host (rtx-pro-6000-x2-pcie) persistence"]["status"] == "warn"
    assert "gpu host (rtx-pro-6000-x2-pcie) uvm hmm" in lines
    assert not any("h100" in name for name in lines)             # a target this host cannot run is not checked
