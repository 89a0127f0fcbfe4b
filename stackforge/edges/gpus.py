"""The GPUs of this host, as ``nvidia-smi`` lists them, and which of them a target's jobs get.

:func:`detect_host_gpus` is the edge (it runs ``nvidia-smi`` through :mod:`stackforge.edges.runner`
and asks the engine for its NVIDIA runtime); :func:`assign_gpus` is pure.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

from stackforge.core.model import Target
from stackforge.edges import runner


@dataclass(frozen=True, slots=True)
class HostGpu:
    """One GPU as nvidia-smi lists it: its index, name and compute capability (``"12.0"``; None
    when the driver's nvidia-smi is too old to report ``compute_cap``)."""

    index: int
    name: str
    arch: str | None = None

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
    """The GPUs of this host whose compute capability is the target's (pure).

    Args:
        host_gpus: from :func:`detect_host_gpus`.
        target: the target the run speaks for; its ``arch`` is ``"major.minor"``.
    """
    if not host_gpus.available:
        return GpuAssignment((), f"no GPU on this host: {host_gpus.evidence}")
    if not host_gpus.devices or any(d.arch is None for d in host_gpus.devices):
        return GpuAssignment(None)
    matching = tuple(d.index for d in host_gpus.devices if d.arch == target.arch)
    if not matching:
        listed = "; ".join(d.describe() for d in host_gpus.devices)
        return GpuAssignment((), f"no GPU of compute capability {target.arch} ({target.name}) on this host: {listed}")
    return GpuAssignment(matching)


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
    devices = tuple(parse_smi_row(row) for row in rows)
    names = tuple(d.name for d in devices)
    driver = rows[0][2].strip()
    if client is not None:
        runtimes = sorted((client.info().get("Runtimes") or {}).keys())
        if "nvidia" not in runtimes:
            return HostGpus(False, f"GPUs {', '.join(names)} present but the engine has no nvidia runtime "
                                   f"(runtimes: {', '.join(runtimes)})", names, driver, devices)
    listed = "; ".join(d.describe() for d in devices)
    return HostGpus(True, f"{len(devices)} GPU(s): {listed}; driver {driver}", names, driver, devices)


#: nvidia-smi columns: index, name, driver_version[, compute_cap].
SMI_FIELDS = "index,name,driver_version,compute_cap"
SMI_FIELDS_OLD = "index,name,driver_version"


def parse_smi_row(row: list[str]) -> HostGpu:
    """One ``nvidia-smi --query-gpu=SMI_FIELDS`` CSV row (already split on commas)."""
    arch = row[3].strip() if len(row) > 3 and row[3].strip() not in ("", "[N/A]") else None
    return HostGpu(index=int(row[0]), name=row[1].strip(), arch=arch)
