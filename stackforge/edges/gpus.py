"""The GPUs of this host, as ``nvidia-smi`` lists them, and which of them a target's jobs get.

:func:`detect_host_gpus` is the edge (it runs ``nvidia-smi`` through :mod:`stackforge.edges.runner`
and asks the engine for its NVIDIA runtime); :func:`assign_gpus` is pure.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

from stackforge.core.model import Interconnect, Target
from stackforge.edges import runner


@dataclass(frozen=True, slots=True)
class HostGpu:
    """One GPU as nvidia-smi lists it: its index, name and compute capability (``"12.0"``; None
    when the driver's nvidia-smi is too old to report ``compute_cap``), its UUID (``GPU-...``: the key of
    its host-wide lock, :mod:`stackforge.edges.gpu_locks`) and PCI bus id, None when not reported."""

    index: int
    name: str
    arch: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None

    def describe(self) -> str:
        return f"{self.index}: {self.name} ({self.arch or 'arch unknown'})"


@dataclass(frozen=True, slots=True)
class HostGpus:
    """What the host offers for GPU jobs, and the evidence for it."""

    available: bool
    evidence: str
    names: tuple[str, ...] = ()
    driver: str | None = None
    devices: tuple[HostGpu, ...] = ()
    #: how each pair of GPUs connects, from ``nvidia-smi topo -m`` (``NV18``, ``PIX``, ``SYS``...):
    #: ((i, j, link), ...) with i < j; None when nvidia-smi could not say
    links: tuple[tuple[int, int, str], ...] | None = None
    topology: str = ""          # the ``nvidia-smi topo -m`` text itself, the evidence of ``links``

    def link(self, a: int, b: int) -> str | None:
        """How GPUs ``a`` and ``b`` connect (``NV18``, ``PIX``...), None when unknown."""
        if self.links is None:
            return None
        low, high = sorted((a, b))
        return next((kind for i, j, kind in self.links if (i, j) == (low, high)), None)


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    """The host GPUs one run for one target gets.

    On a mixed host (say four H100 and two RTX PRO 6000) a run for an sm_120 target must see only
    the sm_120 cards: a rank on the wrong card would measure the wrong GPU. ``devices`` None means
    every GPU (nvidia-smi did not report compute capabilities; the scripts then check the arch of
    what they see themselves); an empty tuple means none.
    """

    devices: tuple[int, ...] | None
    skip_reason: str | None = None

    def docker_gpus(self) -> str | None:
        """The ``docker run --gpus`` value: ``all``, ``device=4,5``, or None for no GPU."""
        if self.devices is None:
            return "all"
        return f"device={','.join(map(str, self.devices))}" if self.devices else None

    def environment(self) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` for a process on this host (``--local``); empty when all are given.

        The indices are nvidia-smi's, which orders GPUs by PCI bus id; CUDA's own default order is
        fastest first, so on a mixed host ``CUDA_VISIBLE_DEVICES=4,5`` alone may name other cards.
        ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number them as nvidia-smi does.
        """
        if self.devices is None:
            return {}
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.devices))}


NO_GPUS = GpuAssignment(devices=())


def assign_gpus(host_gpus: HostGpus, target: Target) -> GpuAssignment:
    """The GPUs of this host that are the target's: its compute capability and GPU model, as many as it has,
    connected the way it is (NVLink or PCIe). Anything else would file results of other hardware under the
    target, so a mismatch is a skip naming what the host has (pure).

    Args:
        host_gpus: from :func:`detect_host_gpus`.
        target: the target the run speaks for; its ``arch`` is ``"major.minor"``.
    """
    if not host_gpus.available:
        return GpuAssignment((), f"no GPU on this host: {host_gpus.evidence}")
    if not host_gpus.devices or any(d.arch is None for d in host_gpus.devices):
        return GpuAssignment(None)
    listed = "; ".join(d.describe() for d in host_gpus.devices)
    of_arch = tuple(d for d in host_gpus.devices if d.arch == target.arch)
    if not of_arch:
        return GpuAssignment((), f"no GPU of compute capability {target.arch} ({target.name}) on this host: {listed}")
    matching = tuple(d.index for d in of_arch if same_model(d.name, target.gpu))
    if not matching:
        return GpuAssignment((), f"not the target's GPU model: {target.name} is {target.gpu}; this host's compute "
                                 f"capability {target.arch} GPUs are {', '.join(sorted({d.name for d in of_arch}))}")
    if len(matching) < target.gpu_count:
        return GpuAssignment((), f"too few GPUs: {target.name} has {target.gpu_count} {target.gpu}; this host has "
                                 f"{len(matching)} ({listed})")
    chosen = matching[:target.gpu_count]
    mismatch = interconnect_mismatch(host_gpus, chosen, target)
    return GpuAssignment((), mismatch) if mismatch else GpuAssignment(chosen)


def lock_keys(host_gpus: HostGpus, assignment: GpuAssignment) -> tuple[str, ...]:
    """The host-wide lock keys of the GPUs an assignment gives: each card's UUID (``index-N`` when nvidia-smi
    gave none); every card of the host for ``devices`` None; nothing for no GPU (pure)."""
    if assignment.devices is None:
        chosen = host_gpus.devices
        if not chosen:
            return ("all",)
    else:
        chosen = tuple(d for d in host_gpus.devices if d.index in assignment.devices)
        known = {d.index for d in chosen}
        chosen += tuple(HostGpu(i, "") for i in assignment.devices if i not in known)
    return tuple(sorted(d.uuid or f"index-{d.index}" for d in chosen))


def host_facts(host_gpus: HostGpus) -> dict[str, Any]:
    """What a run records about the host its GPU jobs ran on (``host.json``): GPUs, driver, the topology
    matrix and the links read from it. PCIe ACS settings are not read (they need root and lspci)."""
    return {"available": host_gpus.available, "evidence": host_gpus.evidence, "driver": host_gpus.driver,
            "gpus": [{"index": d.index, "name": d.name, "arch": d.arch, "uuid": d.uuid, "pci_bus_id": d.pci_bus_id}
                     for d in host_gpus.devices],
            "topology": host_gpus.topology,
            "links": None if host_gpus.links is None else [list(link) for link in host_gpus.links],
            "acs": "not read"}


def same_model(host_name: str, target_gpu: str) -> bool:
    """Whether nvidia-smi's name is the target's GPU: the target's name (without "NVIDIA") begins it, so
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition" is an "NVIDIA RTX PRO 6000 Blackwell" and a
    "NVIDIA GeForce RTX 5090" or an "NVIDIA H100 PCIe" is not an "NVIDIA H100 80GB HBM3". A target without
    a GPU name matches any."""
    def words(name: str) -> list[str]:
        return [w for w in name.lower().replace("-", " ").split() if w != "nvidia"]

    wanted = words(target_gpu)
    return not wanted or words(host_name)[:len(wanted)] == wanted


def interconnect_mismatch(host_gpus: HostGpus, devices: tuple[int, ...], target: Target) -> str | None:
    """Why these GPUs do not connect as the target's (NVLink/NVSwitch vs PCIe), or None when they do, when one
    GPU is all the target has, or when nvidia-smi could not say (the evidence records that)."""
    pairs = [(a, b) for i, a in enumerate(devices) for b in devices[i + 1:]]
    links = {(a, b): host_gpus.link(a, b) for a, b in pairs}
    if not pairs or any(kind is None for kind in links.values()):
        return None
    nvlink = [pair for pair, kind in links.items() if str(kind).startswith("NV")]
    if target.interconnect is Interconnect.PCIE and nvlink:
        a, b = nvlink[0]
        return (f"not the target's interconnect: {target.name} is PCIe only; this host's GPUs {a} and {b} connect "
                f"over NVLink ({links[(a, b)]}, nvidia-smi topo -m)")
    if target.interconnect is not Interconnect.PCIE and len(nvlink) < len(pairs):
        a, b = next(pair for pair in pairs if pair not in nvlink)
        return (f"not the target's interconnect: {target.name} is {target.interconnect.value}; this host's GPUs "
                f"{a} and {b} connect over {links[(a, b)]} (PCIe, nvidia-smi topo -m)")
    return None


def detect_host_gpus(client: Any | None) -> HostGpus:
    """Whether this host can give containers (or local processes) a GPU, with the evidence."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return HostGpus(False, "nvidia-smi not found on the host")
    result = runner.run([smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"], timeout=30)
    if not result.succeeded and "compute_cap" in result.output_tail:  # drivers before 510 lack the field
        result = runner.run([smi, f"--query-gpu={SMI_FIELDS_OLD}", "--format=csv,noheader"], timeout=30)
    rows = [r.split(",") for r in result.output_tail.strip().splitlines() if "," in r]
    if not result.succeeded or not rows:
        return HostGpus(False, f"nvidia-smi failed: {result.describe()}: {result.output_tail.strip()[-300:]}")
    devices = with_ids(tuple(parse_smi_row(row) for row in rows), runner.run(
        [smi, f"--query-gpu={SMI_ID_FIELDS}", "--format=csv,noheader"], timeout=30))
    names = tuple(d.name for d in devices)
    driver = rows[0][2].strip()
    if client is not None:
        runtimes = sorted((client.info().get("Runtimes") or {}).keys())
        if "nvidia" not in runtimes:
            return HostGpus(False, f"GPUs {', '.join(names)} present but the engine has no nvidia runtime "
                                   f"(runtimes: {', '.join(runtimes)})", names, driver, devices)
    listed = "; ".join(d.describe() for d in devices)
    topology = runner.run([smi, "topo", "-m"], timeout=30)
    links = parse_topology(topology.output_tail) if topology.succeeded else None
    how = "links from nvidia-smi topo -m" if links is not None else "links unknown (nvidia-smi topo -m failed)"
    return HostGpus(True, f"{len(devices)} GPU(s): {listed}; driver {driver}; {how}", names, driver, devices,
                    links, topology.output_tail.strip() if topology.succeeded else "")


#: nvidia-smi columns: index, name, driver_version[, compute_cap].
SMI_FIELDS = "index,name,driver_version,compute_cap"
SMI_FIELDS_OLD = "index,name,driver_version"
#: asked apart, so that a driver that lacks one of the main fields still gives the ids.
SMI_ID_FIELDS = "index,uuid,pci.bus_id"


def with_ids(devices: tuple[HostGpu, ...], ids: runner.CommandResult) -> tuple[HostGpu, ...]:
    """``devices`` with the UUID and PCI bus id of ``nvidia-smi --query-gpu=SMI_ID_FIELDS`` (rows whose
    second cell is no ``GPU-`` UUID are left out: unknown stays None)."""
    found: dict[int, tuple[str, str | None]] = {}
    for line in ids.output_tail.splitlines() if ids.succeeded else ():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0].isdigit() and cells[1].startswith("GPU-"):
            found[int(cells[0])] = (cells[1], cells[2] if len(cells) > 2 and cells[2] else None)
    return tuple(HostGpu(d.index, d.name, d.arch, *found[d.index]) if d.index in found else d for d in devices)


def parse_topology(text: str) -> tuple[tuple[int, int, str], ...] | None:
    """The GPU x GPU part of ``nvidia-smi topo -m``: ((i, j, link), ...) for i < j (``NV18``, ``PIX``, ``PXB``,
    ``PHB``, ``NODE``, ``SYS``); None when the text has no such matrix."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    def gpu(cell: str) -> bool:
        return cell.startswith("GPU") and cell[3:].isdigit()

    # The header row names the GPU columns (its first cells are GPU0 GPU1 ...); each data row starts with its GPU.
    header = next((cells for cells in lines if len(cells) > 1 and gpu(cells[0]) and gpu(cells[1])), None)
    if header is None:
        return None
    columns = [c for c in header if gpu(c)]
    links = []
    for cells in lines:
        if cells is header or not gpu(cells[0]) or len(cells) < len(columns) + 1:
            continue
        row = int(cells[0][3:])
        for column, kind in zip(columns, cells[1:len(columns) + 1]):
            col = int(column[3:])
            if row < col:
                links.append((row, col, kind))
    return tuple(links) if links else None


def parse_smi_row(row: list[str]) -> HostGpu:
    """One ``nvidia-smi --query-gpu=SMI_FIELDS`` CSV row (already split on commas)."""
    arch = row[3].strip() if len(row) > 3 and row[3].strip() not in ("", "[N/A]") else None
    return HostGpu(index=int(row[0]), name=row[1].strip(), arch=arch)
