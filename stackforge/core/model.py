"""The nouns of stackforge: Stack, Target and Matrix (frozen, typed, hashable).

A :class:`Stack` is one fully pinned cell of a matrix: CUDA toolkit, torch, FlashInfer, SGLang,
Python, base flavour and OS. Values derived from compatibility tables (torch wheel variant,
kernel package, expected arch list...) live in :class:`stackforge.plan.derive.Derived`, not here, so
a stack stays exactly what the user asked for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum

from stackforge.core.versions import compact


class Flavour(str, Enum):
    """How the CUDA toolkit gets into the image."""

    DEVEL = "devel"      # official nvidia/cuda:<ver>-devel-<os>: full toolkit with nvcc
    RUNTIME = "runtime"  # official nvidia/cuda:<ver>-runtime-<os>: no nvcc, JIT probes say so
    WHEELS = "wheels"    # slim Python base + toolkit from PyPI wheels (13.x ships nvcc, 12.x only ptxas)


class Interconnect(str, Enum):
    """How the GPUs of a target talk to each other."""

    PCIE = "pcie"
    NVLINK = "nvlink"
    NVSWITCH = "nvswitch"


DEFAULT_FLAVOUR = Flavour.DEVEL
DEFAULT_OS = "ubuntu24.04"
FLASHINFER_ADDONS = ("cubin", "jit-cache")


@dataclass(frozen=True, slots=True, order=True)
class Stack:
    """One fully pinned software stack (a row of the compatibility matrix).

    Attributes:
        cuda: CUDA toolkit version of the image, e.g. ``"13.1"``.
        torch, flashinfer, sglang: package versions (PEP 440).
        python: Python minor version in the image, e.g. ``"3.12"``.
        flavour: how the toolkit gets in (see :class:`Flavour`).
        os: base OS, e.g. ``"ubuntu24.04"`` or ``"debian12"``.
        flashinfer_addons: ``"cubin"`` / ``"jit-cache"`` pinned to the FlashInfer version.
        torch_variant: explicit torch wheel variant (``"cu130"``); ``None`` derives it from ``cuda``.
        kernel: explicit sgl-kernel / sglang-kernel version; ``None`` takes SGLang's own pin.
    """

    cuda: str
    torch: str
    flashinfer: str
    sglang: str
    python: str
    flavour: Flavour = DEFAULT_FLAVOUR
    os: str = DEFAULT_OS
    flashinfer_addons: tuple[str, ...] = ()
    torch_variant: str | None = None
    kernel: str | None = None

    @property
    def id(self) -> str:
        """Readable id, stable across runs and machines: ``cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py312``.

        Non-default flavour, OS, addons and explicit pins are appended so ids stay unique.
        """
        parts = [f"cu{compact(self.cuda)}", f"torch{self.torch}", f"fi{self.flashinfer}",
                 f"sgl{self.sglang}", f"py{compact(self.python)}"]
        if self.flavour is not DEFAULT_FLAVOUR:
            parts.append(self.flavour.value)
        if self.os != DEFAULT_OS:
            parts.append(self.os)
        parts.extend(self.flashinfer_addons)
        if self.torch_variant:
            parts.append(f"t{self.torch_variant}")
        if self.kernel:
            parts.append(f"k{self.kernel}")
        return "-".join(parts)

    def to_json(self) -> dict:
        """Plain JSON-able dict (enums as their values)."""
        data = asdict(self)
        data["flavour"] = self.flavour.value
        data["flashinfer_addons"] = list(self.flashinfer_addons)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Stack":
        """Inverse of :meth:`to_json` (values are re-validated by the matrix loader, not here)."""
        return cls(**{**data, "flavour": Flavour(data["flavour"]),
                      "flashinfer_addons": tuple(data.get("flashinfer_addons", ()))})


@dataclass(frozen=True, slots=True)
class Target:
    """The hardware a stack is judged for.

    Attributes:
        name: profile name, e.g. ``"rtx-pro-6000-x8-pcie"``.
        gpu: marketing name of the GPU model.
        arch: compute capability as ``"major.minor"``, e.g. ``"12.0"`` for sm_120.
        gpu_count: GPUs in the box.
        interconnect: pcie / nvlink / nvswitch.
        multicast: whether the GPUs support NVLS multicast (NVSwitch boxes; never plain PCIe).
        min_driver: lowest driver version the hardware itself needs, or ``None``.
        rdma: whether the box has an RDMA NIC (InfiniBand / RoCE) for GPU-direct traffic.
        nodes: how many machines the target spans (1: one box).
    """

    name: str
    gpu: str
    arch: str
    gpu_count: int
    interconnect: Interconnect
    multicast: bool = False
    min_driver: str | None = None
    description: str = ""
    rdma: bool = False
    nodes: int = 1

    @property
    def sm(self) -> str:
        """``"12.0"`` -> ``"sm_120"``."""
        return f"sm_{compact(self.arch)}"

    @property
    def hardware(self) -> frozenset[str]:
        """What the box has, in the words a feature's hardware needs use (``compat/knowledge.yaml``):
        ``nvlink`` (NVLink bridges or NVSwitch), ``multicast``, ``rdma``, ``multi-gpu``, ``multi-node``."""
        has = {"nvlink": self.interconnect is not Interconnect.PCIE, "multicast": self.multicast, "rdma": self.rdma,
               "multi-gpu": self.gpu_count > 1, "multi-node": self.nodes > 1}
        return frozenset(name for name, present in has.items() if present)

    def to_json(self) -> dict:
        data = asdict(self)
        data["interconnect"] = self.interconnect.value
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Target":
        """Inverse of :meth:`to_json`."""
        return cls(**{**data, "interconnect": Interconnect(data["interconnect"])})


@dataclass(frozen=True, slots=True)
class Matrix:
    """A matrix file, expanded: its stacks (in file order) and the target names they are judged for."""

    name: str
    source: str
    stacks: tuple[Stack, ...]
    targets: tuple[str, ...]
    excluded: int = 0
    description: str = ""
    # From the matrix's lock file (``derive: {from: sglang}``): each SGLang release's pins as read from
    # its metadata, and where the lock is ("" for a matrix that lists its versions).
    sglang_pins: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    lock: str = ""


def content_hash(payload: object, length: int = 12) -> str:
    """Short, stable hash of a JSON-able payload (Dockerfile text, a record...)."""
    text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]
