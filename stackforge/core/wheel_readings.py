"""The wheel tier's vocabulary: a release file, the context it is read for, and what a reader found.

A *reading* is a measurement (the software's own code decided it), so it never carries a rule's
verdict; :mod:`stackforge.wheels.verify` compares the two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ReleaseFile:
    """One wheel (or sdist) of one release, as the index lists it."""

    dist: str                 # normalised distribution name, e.g. "flashinfer-python"
    version: str              # the release's version string as published
    filename: str
    url: str                  # without credentials
    sha256: str               # from the index; a download that does not match is refused
    requires_python: str = ""
    yanked: bool = False
    kind: str = "wheel"       # wheel | sdist
    index: str = ""           # the location (without credentials) the file was taken from
    upload_time: str = ""     # ISO 8601 upload time (PEP 700 JSON indexes); "" where the index gives none
    core_metadata: bool = False   # the index serves the wheel's METADATA beside it (PEP 658)


@dataclass(frozen=True, slots=True)
class ReadContext:
    """What a reading is decided for: the target's hardware and the stack parts that can matter.

    ``cuda`` / ``nvcc`` / ``torch_cuda`` are ``None`` when the reading must not depend on them; a
    reader that does depend on one names it in :attr:`Reading.depends_on`.
    """

    arch: str                 # compute capability "12.0"
    gpu_count: int
    interconnect: str         # pcie | nvlink | nvswitch
    multicast: bool = False
    cuda: str | None = None
    nvcc: bool | None = None
    torch_cuda: str | None = None
    python: str | None = None          # interpreter "3.10", for Requires-Python facts
    kernel_package: str | None = None  # "sgl-kernel" | "sglang-kernel", for SGLang's kernel dependency


class ReadingStatus(str, Enum):
    """What the code in the wheel says about a feature for the context."""

    AVAILABLE = "available"       # the code admits the feature for this context
    UNAVAILABLE = "unavailable"   # the code refuses it (raises, disables, gate excludes the arch)
    ABSENT = "absent"             # the code path does not exist in this release (feature not there yet)
    UNDECIDED = "undecided"       # the reader could not decide from the code (say why)


@dataclass(frozen=True, slots=True)
class CodeSite:
    """A line of the wheel's code (or metadata) a reading was decided on."""

    path: str                 # inside the wheel, e.g. "flashinfer/jit/comm.py" or "x.dist-info/METADATA"
    line: int                 # 1-based; 0 when the fact is the file's absence
    code: str                 # the line(s) as written, stripped


@dataclass(frozen=True, slots=True)
class Reading:
    """What one reader found in one unpacked wheel for one context."""

    fact: str
    status: ReadingStatus
    summary: str                          # one line, e.g. "supported_major_versions=[9, 10]: 12 not admitted"
    sites: tuple[CodeSite, ...] = ()
    depends_on: tuple[str, ...] = ()      # ReadContext fields that decided it, e.g. ("arch", "cuda")
    # How the code admits or refuses it, in a word or two that stays the same across releases
    # ("raises KeyError", "disabled"): for a status that can come about in several ways. A change of
    # manner with the same status is a change of verdict to bisect and verify.
    manner: str = ""


# A reader: the unpacked wheel's root (the directory holding the top-level packages and *.dist-info)
# and the context -> a reading. Readers are pure: they read files under root, nothing else.
Reader = Callable[[Path, ReadContext], Reading]


#: Facts whose name is not the feature they speak for. The PCIe IPC all-reduce takes two halves, each
#: read from its own release: FlashInfer's module (``comm/pcie_ipc_ar.py``) and SGLang's switch
#: (``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE``). Both readings land in the ``pcie-allreduce`` cell, where the
#: worst one decides: the path works only when both releases have it.
_FACT_FEATURES = {"flashinfer-pcie-ipc-ar": "pcie-allreduce", "sglang-pcie-ipc-ar": "pcie-allreduce"}


def feature_of_fact(fact: str) -> str:
    """The feature a wheel reading's fact speaks for (a record's ``feature``): the fact itself, but for
    the facts of :data:`_FACT_FEATURES`; a narrower fact (``torch-symm-mem:flag``) stays as it is."""
    return _FACT_FEATURES.get(fact, fact)


@dataclass(frozen=True, slots=True)
class ReaderSpec:
    """Which distribution's wheel a fact is read from, and by what.

    ``fact`` is a rule feature name (``torch-symm-mem``) when the reading decides that feature, or
    ``feature:aspect`` for a narrower fact (``flashinfer-ar-fusion:autoenable``,
    ``torch-symm-mem:flag``), or ``metadata:<name>`` (``metadata:requires-python``). A fact may be
    read from more than one distribution; (fact, dist) is the key.
    """

    fact: str
    dist: str                 # "flashinfer-python" | "sglang" | ...
    reader: Reader
    what: str                 # one line: what the reader looks at
    # Compiled code is not unpacked into the wheel cache (a torch wheel is gigabytes): a reader of it
    # names how the wheel is read by HTTP range requests (stackforge.wheels.readers.binaries); it is then
    # given what that returned instead of a tree.
    scan: Any = None
