"""An SGLang release's own pins, read from its core metadata (``Requires-Dist``, ``Requires-Python``).

SGLang pins the torch, FlashInfer and kernel package it was built and tested with. A stack that
follows SGLang (``derive: {from: sglang}`` in a matrix) takes these pins, and the pin rules
(:func:`stackforge.plan.planner.pin_rules`) prune a stack that breaks them. Older releases put the
serving dependencies under the ``srt`` extra, newer ones in the base requirements: both count.
Pure: the metadata text comes from the index (:func:`stackforge.edges.index.wheel_metadata`).
"""

from __future__ import annotations

import email.parser
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

#: The environment pins are read for: the Linux x86_64 serving install (``pip install sglang[srt]``).
_MARKER_ENV = {"extra": "srt", "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
               "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
KERNEL_PACKAGES = ("sgl-kernel", "sglang-kernel")


@dataclass(frozen=True, slots=True)
class ReleasePins:
    """What one SGLang release pins: each value as the table row ``compat/tables.yaml sglang_pins`` holds it
    (an exact pin as the bare version, anything else as its specifier)."""

    sglang: str
    pins: tuple[tuple[str, str], ...]     # (key, value): torch, flashinfer, flashinfer_extra, kernel...

    def as_row(self) -> dict[str, str]:
        return dict(self.pins)


def pins_from_metadata(sglang: str, metadata: str, *, python: str = "3.12") -> ReleasePins:
    """The pins of SGLang ``sglang`` from its METADATA text (``python``: the interpreter markers are read for)."""
    message = email.parser.Parser().parsestr(metadata, headersonly=True)
    env = {**_MARKER_ENV, "python_version": python, "python_full_version": f"{python}.0"}
    by_name: dict[str, Requirement] = {}
    for line in message.get_all("Requires-Dist") or ():
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(env):
            continue
        by_name.setdefault(str(canonicalize_name(requirement.name)), requirement)
    pins: dict[str, str] = {}
    _put(pins, "torch", by_name.get("torch"))
    flashinfer = by_name.get("flashinfer-python")
    _put(pins, "flashinfer", flashinfer)
    if flashinfer is not None and flashinfer.extras:
        pins["flashinfer_extra"] = sorted(flashinfer.extras)[0]
    _put(pins, "flashinfer_cubin", by_name.get("flashinfer-cubin"))
    kernel = next((by_name[name] for name in KERNEL_PACKAGES if name in by_name), None)
    if kernel is not None:
        pins["kernel_package"] = str(canonicalize_name(kernel.name))
        _put(pins, "kernel", kernel)
    if message.get("Requires-Python"):
        pins["python"] = str(message.get("Requires-Python")).strip()
    cuda_python = by_name.get("cuda-python")
    if cuda_python is not None and str(cuda_python.specifier):
        pins["cuda_python"] = str(cuda_python.specifier)
    return ReleasePins(sglang, tuple(pins.items()))


def _put(pins: dict[str, str], key: str, requirement: Requirement | None) -> None:
    """``key``: the bare version for ``==X`` (how the table writes exact pins), else the specifier."""
    if requirement is None or not str(requirement.specifier):
        return
    specs = list(requirement.specifier)
    exact = len(specs) == 1 and specs[0].operator == "=="
    pins[key] = specs[0].version if exact else str(requirement.specifier)
