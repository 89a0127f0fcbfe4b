"""Which stacks a wheel-tier record speaks for (pure; used by the tier and by the matrix).

A wheel-tier record reads one release of one distribution (``provenance.versions``) for a target,
and names in ``stack["depends_on"]`` the context fields its reading depended on, with their values
in ``stack``. It speaks for every stack that pins that release and has those values on that target.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import InvalidVersion, Version

from stackforge.core.records import ResultRecord

#: The key of :class:`stackforge.core.model.Stack` (``kernel``: also the derived kernel pin) that pins each
#: distribution.
STACK_KEYS = {"flashinfer-python": "flashinfer", "sglang": "sglang", "torch": "torch",
              "sgl-kernel": "kernel", "sglang-kernel": "kernel"}
#: Context fields the target decides; records are already per target.
TARGET_FIELDS = ("arch", "gpu_count", "interconnect", "multicast")


def stack_key(dist: str) -> str:
    """The stack dict key a distribution's version is recorded under (``flashinfer-python`` -> ``flashinfer``)."""
    return STACK_KEYS.get(dist, dist)


def stack_context(stack: Mapping[str, Any], derived: Mapping[str, Any] | None) -> dict[str, Any]:
    """The read-context values of a stack (a plan row's ``stack`` and ``derived`` dicts)."""
    derived = derived or {}
    values = {"cuda": stack.get("cuda"), "python": stack.get("python")}
    if derived:
        values |= {"nvcc": derived.get("has_nvcc"), "torch_cuda": derived.get("torch_cuda"),
                   "kernel_package": derived.get("kernel_package")}
    return values


def stack_pins(stack: Mapping[str, Any], derived: Mapping[str, Any] | None) -> dict[str, Any]:
    """The versions a stack pins by stack key, the kernel's from SGLang's own pin when not explicit."""
    pins = dict(stack)
    if not pins.get("kernel") and derived and derived.get("kernel_version"):
        pins["kernel"] = derived["kernel_version"]
    return pins


def record_matches(record: ResultRecord, pins: Mapping[str, Any], context: Mapping[str, Any]) -> bool:
    """Whether ``record`` speaks for a stack pinning ``pins`` with read-context values ``context``."""
    versions = record.provenance.versions
    if len(versions) != 1:
        return False
    (dist, version), = versions.items()
    pinned = pins.get(stack_key(dist))
    if pinned is None or not same_version(str(pinned), version):
        return False
    return all(context.get(name) == record.stack.get(name)
               for name in record.stack.get("depends_on", ()) if name not in TARGET_FIELDS)


def same_version(left: str, right: str) -> bool:
    """PEP 440 equality (``0.6.17 == 0.6.17.0``); plain text equality for what is no version."""
    try:
        return Version(left) == Version(right)
    except InvalidVersion:
        return left == right
