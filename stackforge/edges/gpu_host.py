"""The host check before a runtime run (and ``stackforge doctor --gpu``): is this host fit to speak for a target?

A wedged GPU, a stopped Fabric Manager on an NVSwitch box, uncorrected ECC errors or the ``nvidia_uvm``
setting that keeps P2P from hanging on RTX PRO 6000 boxes would otherwise be filed under the stack as
``timeout``, ``error`` or ``fail``. :func:`read_gpu_host_facts` is the edge (``nvidia-smi``, ``dmesg`` and
``lspci`` through :mod:`stackforge.edges.runner`; ``/sys`` read directly); :func:`judge_gpu_host` is pure and
turns a :class:`HostGpuFacts` into one :class:`GpuHostVerdict` per target: findings of status ``ok``,
``warn`` (recorded, decides nothing), ``fail`` (a fault: records on those GPUs are ``undecided (host: ...)``)
or ``not readable`` (a fact, never a fault). The driver against a stack's floor is decided per stack by the
job runner (a skip naming both).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from stackforge.core.model import Interconnect, Target
from stackforge.edges import runner
from stackforge.edges.gpus import HostGpus, same_model

TOOL_TIMEOUT_S = 60.0

#: Xid codes that say the GPU or its memory is at fault, not the program that ran on it (NVIDIA, "Xid
#: Errors", https://docs.nvidia.com/deploy/xid-errors/): 48 double-bit ECC, 61/62 internal micro-controller
#: breakpoint / halt, 64 ECC page retirement or row-remap failure, 74 NVLink error, 79 fallen off the bus,
#: 92 high single-bit ECC rate, 94/95 contained / uncontained ECC error, 119/120 GSP RPC timeout / GSP error,
#: 140 unrecovered ECC error. Xid 13, 31, 43 and 45 follow from what a program did and are no host fault.
HOST_FAULT_XIDS = frozenset({48, 61, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140})

#: GPU models whose P2P on PCIe needs ``nvidia_uvm``'s HMM off, and the value. The RTX PRO 6000 community
#: documents ``options nvidia_uvm uvm_disable_hmm=1``: "Without this, NCCL P2P operations lock up. This is
#: required on virtually all RTX PRO 6000 multi-GPU setups." (local-inference-lab/rtx6kpro,
#: hardware/pcie-bandwidth.md and README.md).
UVM_HMM_SETTING = {"NVIDIA RTX PRO 6000 Blackwell": "1"}
UVM_HMM_PARAMETER = "sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
UVM_HMM_SOURCE = "local-inference-lab/rtx6kpro hardware/pcie-bandwidth.md: options nvidia_uvm uvm_disable_hmm=1"


class FindingStatus(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    NOT_READABLE = "not readable"


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's own health facts (None: nvidia-smi did not report it)."""

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    persistence_mode: str | None = None       # Enabled | Disabled
    ecc_uncorrected: int | None = None        # volatile uncorrected ECC errors since the driver loaded
    fabric_state: str | None = None           # nvidia-smi -q "Fabric" State (NVSwitch systems): Completed...
    fabric_status: str | None = None          # ... and Status: Success


@dataclass(frozen=True, slots=True)
class HostGpuFacts:
    """What the host check reads, gathered at the edge. A fact that could not be read is None, and
    ``unreadable`` says why (``dmesg``: operation not permitted): not readable is a fact, not a fault."""

    driver: str | None
    gpus: tuple[GpuHealth, ...] = ()
    xid_lines: tuple[str, ...] | None = None  # the kernel log's NVRM Xid lines since boot
    iommu_groups: int | None = None           # entries of /sys/kernel/iommu_groups (0: IOMMU off)
    acs_redirect: tuple[str, ...] | None = None   # PCI bridges whose ACSCtl has ReqRedir+ or CmpltRedir+
    uvm_disable_hmm: str | None = None        # /sys/module/nvidia_uvm/parameters/uvm_disable_hmm
    unreadable: tuple[tuple[str, str], ...] = ()

    def why_unreadable(self, fact: str) -> str:
        return next((why for name, why in self.unreadable if name == fact), "not read")

    def to_json(self) -> dict[str, Any]:
        return {"driver": self.driver,
                "gpus": [{"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
                          "persistence_mode": g.persistence_mode, "ecc_uncorrected": g.ecc_uncorrected,
                          "fabric_state": g.fabric_state, "fabric_status": g.fabric_status} for g in self.gpus],
                "xid_lines": None if self.xid_lines is None else list(self.xid_lines[-20:]),
                "iommu_groups": self.iommu_groups,
                "acs_redirect": None if self.acs_redirect is None else list(self.acs_redirect),
                "uvm_disable_hmm": self.uvm_disable_hmm, "unreadable": dict(self.unreadable)}


@dataclass(frozen=True, slots=True)
class HostFinding:
    """One thing the host check found. ``gpus``: the indices it concerns (None: every GPU);
    ``multi_gpu_only``: it matters only to jobs on more than one GPU (P2P)."""

    check: str
    status: FindingStatus
    text: str
    gpus: tuple[int, ...] | None = None
    multi_gpu_only: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status.value, "text": self.text,
                "gpus": None if self.gpus is None else list(self.gpus), "multi_gpu_only": self.multi_gpu_only}


@dataclass(frozen=True, slots=True)
class GpuHostVerdict:
    """The host check's word for one target: its findings, worst first in :attr:`status`."""

    target: str
    findings: tuple[HostFinding, ...]

    @property
    def status(self) -> FindingStatus:
        for status in (FindingStatus.FAIL, FindingStatus.WARN):
            if any(f.status is status for f in self.findings):
                return status
        return FindingStatus.OK

    def fault_for(self, devices: tuple[int, ...] | None) -> HostFinding | None:
        """The first failing finding that concerns a job on ``devices`` (None: every GPU), else None."""
        multi = devices is None or len(devices) > 1
        for finding in self.findings:
            if finding.status is not FindingStatus.FAIL or (finding.multi_gpu_only and not multi):
                continue
            if finding.gpus is None or devices is None or set(finding.gpus) & set(devices):
                return finding
        return None

    def to_json(self) -> dict[str, Any]:
        failing = sorted({g for f in self.findings if f.status is FindingStatus.FAIL for g in (f.gpus or ())})
        return {"target": self.target, "status": self.status.value,
                "failing_gpus": failing if all(f.gpus is not None for f in self.findings
                                               if f.status is FindingStatus.FAIL) else "all",
                "findings": [f.to_json() for f in self.findings]}


# ---------------------------------------------------------------------------------------------- judging (pure)


def judge_gpu_host(facts: HostGpuFacts, target: Target) -> GpuHostVerdict:
    """Every check for ``target`` on this host (pure)."""
    findings = [driver_finding(facts.driver, target), *persistence_findings(facts),
                *fabric_findings(facts, target), *error_findings(facts), iommu_finding(facts, target),
                uvm_hmm_finding(facts, target)]
    return GpuHostVerdict(target.name, tuple(f for f in findings if f is not None))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def driver_below(driver: str | None, floor: str | None) -> bool:
    """Whether ``driver`` (``590.48.01``) is below ``floor`` (``580``), compared part by part; unknown is not."""
    if not driver or not floor or not _version(driver) or not _version(floor):
        return False
    return _version(driver) < _version(floor)


def driver_finding(driver: str | None, target: Target) -> HostFinding:
    """The driver against the target hardware's own floor (a stack's floor is the job runner's: a skip)."""
    if driver is None:
        return HostFinding("driver", FindingStatus.NOT_READABLE, "driver version not reported by nvidia-smi")
    if driver_below(driver, target.min_driver):
        return HostFinding("driver", FindingStatus.WARN, f"driver {driver} is below {target.name}'s hardware floor "
                           f">= {target.min_driver}: its stacks' jobs skip")
    floor = f" (hardware floor >= {target.min_driver})" if target.min_driver else ""
    return HostFinding("driver", FindingStatus.OK, f"driver {driver}{floor}")


def persistence_findings(facts: HostGpuFacts) -> list[HostFinding]:
    off = tuple(g.index for g in facts.gpus if (g.persistence_mode or "").lower() == "disabled")
    if not facts.gpus or all(g.persistence_mode is None for g in facts.gpus):
        return [HostFinding("persistence", FindingStatus.NOT_READABLE, "persistence mode not reported")]
    if off:
        # Not a fault: without it the driver tears the GPU down between jobs, so each start is slower.
        return [HostFinding("persistence", FindingStatus.WARN, f"persistence mode off on GPU(s) "
                            f"{', '.join(map(str, off))}: each job pays the driver's start-up (nvidia-smi -pm 1)", off)]
    return [HostFinding("persistence", FindingStatus.OK, "persistence mode on")]


def fabric_findings(facts: HostGpuFacts, target: Target) -> list[HostFinding]:
    """NVSwitch targets only: every GPU's fabric registration done (Fabric Manager up), else a fault."""
    if target.interconnect is not Interconnect.NVSWITCH:
        return []
    # nvidia-smi's "N/A" / "Not Supported" is no reading (a GPU without fabric registration): a fact, not a fault.
    reported = [g for g in facts.gpus if g.fabric_state is not None
                and g.fabric_state.strip().lower() not in ("n/a", "not supported")]
    if not reported:
        return [HostFinding("fabric manager", FindingStatus.NOT_READABLE,
                            "no Fabric state in nvidia-smi -q (driver before 530, N/A, or not read)")]
    bad = [g for g in reported
           if (g.fabric_state or "").lower() != "completed" or (g.fabric_status or "").lower() != "success"]
    if bad:
        listed = "; ".join(f"GPU {g.index}: state {g.fabric_state}, status {g.fabric_status}" for g in bad)
        return [HostFinding("fabric manager", FindingStatus.FAIL, f"NVSwitch fabric not ready ({listed}): is "
                            "nvidia-fabricmanager running?", tuple(g.index for g in bad))]
    return [HostFinding("fabric manager", FindingStatus.OK, "NVSwitch fabric registered on every GPU")]


def _bus(text: str) -> str:
    """``00000000:3B:00.0`` or ``0000:3b:00`` -> ``3b:00`` (bus and device: how Xid lines name a GPU)."""
    parts = text.lower().split(".")[0].split(":")
    return ":".join(parts[-2:]) if len(parts) >= 2 else text.lower()


def error_findings(facts: HostGpuFacts) -> list[HostFinding]:
    """Uncorrected ECC errors and host-fault Xids (per GPU: the Xid line's PCI address), as faults."""
    findings = []
    ecc = [g for g in facts.gpus if g.ecc_uncorrected]
    if ecc:
        findings.append(HostFinding("ecc", FindingStatus.FAIL, "uncorrected ECC errors: " + ", ".join(
            f"GPU {g.index}: {g.ecc_uncorrected}" for g in ecc), tuple(g.index for g in ecc)))
    elif facts.gpus and all(g.ecc_uncorrected is None for g in facts.gpus):
        findings.append(HostFinding("ecc", FindingStatus.NOT_READABLE, "ECC counters not reported (no ECC, or N/A)"))
    else:
        findings.append(HostFinding("ecc", FindingStatus.OK, "no uncorrected ECC error"))
    if facts.xid_lines is None:
        findings.append(HostFinding("xid", FindingStatus.NOT_READABLE,
                                    f"kernel log not readable: {facts.why_unreadable('dmesg')}"))
        return findings
    by_bus = {_bus(g.pci_bus_id): g.index for g in facts.gpus if g.pci_bus_id}
    faults: dict[int | None, list[str]] = {}
    for line in facts.xid_lines:
        match = re.search(r"Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)", line)
        if match and int(match.group(2)) in HOST_FAULT_XIDS:
            faults.setdefault(by_bus.get(_bus(match.group(1))), []).append(line.strip()[-160:])
    if not faults:
        findings.append(HostFinding("xid", FindingStatus.OK, f"no host-fault Xid in the kernel log "
                                    f"({len(facts.xid_lines)} Xid line(s) of programs)"))
    for index, lines in faults.items():
        which = f"GPU {index}" if index is not None else "a GPU nvidia-smi does not list"
        findings.append(HostFinding("xid", FindingStatus.FAIL, f"host-fault Xid on {which} since boot: {lines[-1]}",
                                    None if index is None else (index,)))
    return findings


def iommu_finding(facts: HostGpuFacts, target: Target) -> HostFinding | None:
    """IOMMU and ACS redirect on a multi-GPU PCIe target: P2P then goes through the root complex and has hung
    NCCL on RTX PRO 6000 (vllm-project/vllm#33041, NVIDIA/nccl#2079). Recorded, not a fault: the P2P
    probe decides whether P2P works."""
    if facts.iommu_groups is None and facts.acs_redirect is None:
        return HostFinding("iommu/acs", FindingStatus.NOT_READABLE,
                           f"IOMMU groups: {facts.why_unreadable('iommu')}; ACS: {facts.why_unreadable('lspci')}")
    iommu = "not read" if facts.iommu_groups is None else (
        f"IOMMU on ({facts.iommu_groups} groups)" if facts.iommu_groups else "IOMMU off")
    acs = ("ACS not read: " + facts.why_unreadable("lspci") if facts.acs_redirect is None else
           f"ACS redirect on {len(facts.acs_redirect)} bridge(s)" if facts.acs_redirect else "no ACS redirect")
    risky = bool(facts.acs_redirect) and target.interconnect is Interconnect.PCIE and target.gpu_count > 1
    return HostFinding("iommu/acs", FindingStatus.WARN if risky else FindingStatus.OK,
                       f"{iommu}; {acs}" + ("; P2P may hang (vllm#33041, nccl#2079)" if risky else ""),
                       multi_gpu_only=True)


def uvm_hmm_finding(facts: HostGpuFacts, target: Target) -> HostFinding | None:
    """Where the target's P2P needs ``nvidia_uvm uvm_disable_hmm=1`` (:data:`UVM_HMM_SETTING`), anything else
    is a fault for multi-GPU jobs; elsewhere no finding."""
    wanted = next((value for model, value in UVM_HMM_SETTING.items() if same_model(target.gpu, model)), None)
    if wanted is None or target.gpu_count < 2 or target.interconnect is not Interconnect.PCIE:
        return None
    if facts.uvm_disable_hmm is None:
        return HostFinding("uvm hmm", FindingStatus.NOT_READABLE,
                           f"/{UVM_HMM_PARAMETER} not readable ({facts.why_unreadable('uvm')}); "
                           f"{target.name} wants {wanted} ({UVM_HMM_SOURCE})", multi_gpu_only=True)
    if facts.uvm_disable_hmm.strip().upper() in (wanted, "Y" if wanted == "1" else "N"):
        return HostFinding("uvm hmm", FindingStatus.OK, f"uvm_disable_hmm={facts.uvm_disable_hmm}",
                           multi_gpu_only=True)
    return HostFinding("uvm hmm", FindingStatus.FAIL, f"nvidia_uvm uvm_disable_hmm={facts.uvm_disable_hmm}, "
                       f"{target.name}'s P2P needs {wanted}: NCCL P2P locks up without it ({UVM_HMM_SOURCE})",
                       multi_gpu_only=True)


# ---------------------------------------------------------------------------------------------- reading (the edge)


def parse_health_rows(text: str) -> dict[int, tuple[str | None, int | None]]:
    """``nvidia-smi --query-gpu=index,persistence_mode,ecc.errors.uncorrected.volatile.total
    --format=csv,noheader,nounits`` -> {index: (persistence mode, uncorrected errors)}."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0].isdigit():
            mode = cells[1] if cells[1] in ("Enabled", "Disabled") else None
            ecc = int(cells[2]) if len(cells) > 2 and cells[2].isdigit() else None
            rows[int(cells[0])] = (mode, ecc)
    return rows


def parse_fabric(text: str) -> list[tuple[str | None, str | None]]:
    """The ``Fabric`` section of each GPU in ``nvidia-smi -q`` (State, Status), in GPU order."""
    found = []
    blocks = re.split(r"\n(?=GPU [0-9A-Fa-f]{4,}:)", text)
    for block in (b for b in blocks if re.match(r"GPU [0-9A-Fa-f]{4,}:", b)):
        match = re.search(r"^\s*Fabric\s*\n((?:\s{8,}.*\n?)+)", block, re.M)
        if match is None:
            found.append((None, None))
            continue
        state = re.search(r"State\s*:\s*(.+)", match.group(1))
        status = re.search(r"Status\s*:\s*(.+)", match.group(1))
        found.append((state.group(1).strip() if state else None, status.group(1).strip() if status else None))
    return found


def parse_acs(text: str) -> tuple[str, ...]:
    """The PCI functions of ``lspci -vvv`` whose ``ACSCtl`` redirects requests or completions upstream."""
    device, redirected = "", []
    for line in text.splitlines():
        if line and not line[0].isspace():
            device = line.split(" ", 1)[0]
        elif "ACSCtl:" in line and ("ReqRedir+" in line or "CmpltRedir+" in line):
            redirected.append(device)
    return tuple(redirected)


def _tool(name: str, argv: list[str], unreadable: list[tuple[str, str]], fact: str) -> str | None:
    path = shutil.which(name)
    if path is None:
        unreadable.append((fact, f"{name} not found"))
        return None
    result = runner.run([path, *argv], timeout=TOOL_TIMEOUT_S, tail_chars=400_000)
    if not result.succeeded:
        unreadable.append((fact, f"{name} {result.describe()}: {result.output_tail.strip()[-160:]}"))
        return None
    return result.output_tail


def read_gpu_host_facts(host_gpus: HostGpus, *, root: Path = Path("/")) -> HostGpuFacts:
    """Read the host check's facts (``root``: where /sys is, for tests). Never raises for what it cannot read."""
    unreadable: list[tuple[str, str]] = []
    health = _tool("nvidia-smi", ["--query-gpu=index,persistence_mode,ecc.errors.uncorrected.volatile.total",
                                  "--format=csv,noheader,nounits"], unreadable, "nvidia-smi")
    rows = parse_health_rows(health or "")
    query = _tool("nvidia-smi", ["-q"], unreadable, "nvidia-smi -q")
    fabric = parse_fabric(query or "")
    gpus = tuple(GpuHealth(d.index, d.uuid, d.pci_bus_id, *rows.get(d.index, (None, None)),
                           *(fabric[i] if i < len(fabric) else (None, None)))
                 for i, d in enumerate(host_gpus.devices))
    dmesg = _tool("dmesg", [], unreadable, "dmesg")
    xids = None if dmesg is None else tuple(line for line in dmesg.splitlines() if "NVRM: Xid" in line)
    groups_dir = root / "sys/kernel/iommu_groups"
    try:
        iommu_groups: int | None = len(list(groups_dir.iterdir()))
    except OSError as exc:
        iommu_groups = None
        unreadable.append(("iommu", f"{groups_dir}: {exc.strerror or exc}"))
    lspci = _tool("lspci", ["-vvv"], unreadable, "lspci")
    if lspci is not None and "ACSCtl" not in lspci and "access denied" in lspci:
        unreadable.append(("lspci", "lspci -vvv: capabilities access denied (needs root)"))
        lspci = None
    try:
        hmm: str | None = (root / UVM_HMM_PARAMETER).read_text().strip()
    except OSError as exc:
        hmm = None
        unreadable.append(("uvm", exc.strerror or str(exc)))
    return HostGpuFacts(host_gpus.driver, gpus, xids, iommu_groups, None if lspci is None else parse_acs(lspci),
                        hmm, tuple(unreadable))
