"""Review fixes of the host check: a mix of a P2P-only finding and a fault on listed GPUs is not read as "every
GPU failed" by the reports, and nvidia-smi's "N/A" Fabric state is no reading (never a fabric fault)."""

from __future__ import annotations

import dataclasses

from test_gpu_host import GPUS, H100, RTX2, by_check, facts

from stackforge.edges.gpu_host import judge_gpu_host
from stackforge.jobs.job_runner import HostGate
from stackforge.report.compat_matrix import host_check_faults


def test_a_p2p_only_finding_beside_an_xid_on_one_gpu_does_not_blame_every_gpu():
    mixed = facts(uvm_disable_hmm="0",
                  xid_lines=("NVRM: Xid (PCI:0000:12:00): 79, pid=1, GPU has fallen off the bus.",))
    verdict = judge_gpu_host(mixed, RTX2)
    assert verdict.fault_for((0,)) is None                 # what the job runner decided for a job on GPU 0 alone
    check = HostGate({RTX2.name: verdict}).to_json()["check"]
    assert check["status"] == "fail" and check["p2p"] is False and check["gpus"] == [1]
    # The report must not turn that job's own failure into the host's: the run's word names GPU 1 only.
    assert "run-mixed" not in host_check_faults({"run-mixed": {"check": check}})


def test_a_fabric_state_of_n_a_is_not_read_never_a_fault():
    unread = tuple(dataclasses.replace(g, fabric_state="N/A", fabric_status="N/A") for g in GPUS)
    verdict = judge_gpu_host(facts(gpus=unread), H100)
    assert by_check(verdict)["fabric manager"][0] == "not readable"
    assert verdict.fault_for((0, 1)) is None
    waiting = tuple(dataclasses.replace(g, fabric_state="In Progress", fabric_status="N/A") for g in GPUS)
    assert by_check(judge_gpu_host(facts(gpus=waiting), H100))["fabric manager"][0] == "fail"
