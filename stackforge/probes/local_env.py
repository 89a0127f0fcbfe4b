"""``probe --local``: the stack a Python environment of this machine IS, read from what it has installed.

Probes run with ``--local`` measure the environment they run in, not a matrix stack: its records are filed
under a stack identity derived from the versions read in that environment (:class:`LocalStack`), never
under a matrix stack's id (a CUDA 12.8 stack without nvcc must never get the host's "nvcc 13.0: pass").
The identity is ``local-<readable versions>-<hash>``: the same environment gives the same id on every run,
and no matrix stack id starts with ``local-``. ``--only STACK`` then asks that the environment BE that
stack: :func:`pin_differences` names what differs from the stack's pins, and the campaign refuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from stackforge.core.errors import SpecError
from stackforge.core.versions import compact
from stackforge.edges import runner
from stackforge.inimage import HOST_DIR as INIMAGE_HOST_DIR
from stackforge.jobs.job_runner import script_env

__all__ = ["LOCAL_PREFIX", "LocalStack", "pin_differences", "read_local_stack"]

LOCAL_PREFIX = "local-"
#: The line the reader prints last: ``STACKFORGE_ENV {json}``.
_MARKER = "STACKFORGE_ENV "
#: Read in the probed interpreter, with the in-image package on its path (standard library only). torch's
#: CUDA is read from ``torch/version.py`` without importing torch (seconds, and no CUDA initialisation).
_READER = r"""
import ast, importlib.util, json, os, platform
import _sfprobe, _sfshared
versions = _sfshared.installed_versions(_sfprobe.PROVENANCE_DISTRIBUTIONS)
facts = {"python": platform.python_version(), "versions": versions, "torch_cuda": None, "nvcc": None}
try:
    spec = importlib.util.find_spec("torch")
except (ImportError, ValueError):
    spec = None
if spec is not None and spec.submodule_search_locations:
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, ValueError):
        tree = None
    for node in getattr(tree, "body", ()):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(getattr(t, "id", None) == "cuda" for t in targets) and isinstance(node.value, ast.Constant):
            facts["torch_cuda"] = node.value.value if isinstance(node.value.value, str) else None
nvcc = _sfprobe.find_nvcc()
if nvcc:
    release, line = _sfprobe.nvcc_version(nvcc)
    facts["nvcc"] = release or None
    facts["nvcc_line"] = line[:300]
    facts["nvcc_path"] = nvcc
print("STACKFORGE_ENV " + json.dumps(facts, sort_keys=True))
"""
#: The distributions that make the identity, and the names of the stack's axes they answer for.
_AXES = (("torch", "torch"), ("flashinfer-python", "flashinfer"), ("sglang", "sglang"))
_KERNELS = ("sglang-kernel", "sgl-kernel")
_UNSAFE = re.compile(r"[^A-Za-z0-9.+]")


@dataclass(frozen=True, slots=True)
class LocalStack:
    """The software of one Python environment, as read there (installed, not requested).

    Stands where a :class:`~stackforge.core.model.Stack` stands in a job (``id``, ``to_json``): the records
    of a ``--local`` run carry this identity and, in their ``stack``, every version read as evidence.

    Attributes:
        python: the interpreter's full version (``3.12.3``).
        torch / flashinfer / sglang: the installed versions (None: not installed).
        torch_cuda: the CUDA torch was built for (None: a CPU build, or no torch).
        kernel: ``sgl-kernel==0.3.21`` or ``sglang-kernel==...`` (None: neither installed).
        nvcc: the release of the nvcc this environment finds (``13.0``; None: none).
        read: everything the reader reported (all installed provenance distributions, nvcc's line and path).
    """

    python: str
    torch: str | None
    torch_cuda: str | None
    flashinfer: str | None
    sglang: str | None
    kernel: str | None
    nvcc: str | None
    read: tuple[tuple[str, str], ...] = ()

    def identity(self) -> dict[str, str | None]:
        """What the id is a function of: the versions that decide what the probes can see."""
        return {"python": self.python, "torch": self.torch, "torch_cuda": self.torch_cuda,
                "flashinfer": self.flashinfer, "sglang": self.sglang, "kernel": self.kernel, "nvcc": self.nvcc}

    @property
    def id(self) -> str:
        """``local-py312-torch2.9.1+cu128-fi0.6.3-sgl0.5.9-nvcc13.0-1a2b3c4d5e``: readable, and a hash of every
        version read for the identity, so two environments that differ anywhere never share an id."""
        digest = hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:10]
        parts = [f"py{compact('.'.join(self.python.split('.')[:2]))}"]
        for label, value in (("torch", self.torch), ("fi", self.flashinfer), ("sgl", self.sglang),
                             ("nvcc", self.nvcc)):
            if value:
                parts.append(label + _UNSAFE.sub("_", value)[:40])
        return f"{LOCAL_PREFIX}{'-'.join(parts)}-{digest}"

    def to_json(self) -> dict[str, Any]:
        """The ``stack`` of its records: the axes a report shows (``cuda`` is torch's CUDA), the identity, and
        every version read as evidence."""
        return {"local": True, "python": ".".join(self.python.split(".")[:2]), "cuda": self.torch_cuda or "",
                "torch": self.torch or "", "flashinfer": self.flashinfer or "", "sglang": self.sglang or "",
                "kernel": self.kernel, "nvcc": self.nvcc, "flavour": "local", "read": dict(self.read)}

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> LocalStack:
        """From the reader's JSON (:data:`_READER`)."""
        versions = {str(k): str(v) for k, v in (facts.get("versions") or {}).items()}
        kernel = next((f"{name}=={versions[name]}" for name in _KERNELS if name in versions), None)
        read = {"python": str(facts.get("python") or ""), **versions,
                **{k: str(facts[k]) for k in ("nvcc_line", "nvcc_path") if facts.get(k)}}
        return cls(python=str(facts.get("python") or ""), torch=versions.get("torch"),
                   torch_cuda=_optional(facts.get("torch_cuda")), flashinfer=versions.get("flashinfer-python"),
                   sglang=versions.get("sglang"), kernel=kernel, nvcc=_optional(facts.get("nvcc")),
                   read=tuple(sorted(read.items())))


def read_local_stack(python: str, timeout_s: float = 120) -> LocalStack:
    """Read the environment of ``python`` (an edge: one short process through :func:`runner.run`).

    Raises:
        SpecError: the interpreter does not start or prints no reading (its words): a bad ``--python``.
    """
    env = script_env(INIMAGE_HOST_DIR, os.environ.get("PYTHONPATH"))
    result = runner.run([python, "-c", _READER], timeout=timeout_s, env=env, tail_chars=16000)
    lines = [line for line in result.output_tail.splitlines() if line.startswith(_MARKER)]
    if not result.succeeded or not lines:
        tail = " ".join(result.output_tail.split())[-300:]
        raise SpecError(f"cannot read the Python environment of {python}: it {result.describe()}"
                         f"{': ' + tail if tail else ''}", remedy="pass --python with an interpreter that runs")
    return LocalStack.from_facts(json.loads(lines[-1][len(_MARKER):]))


def pin_differences(env: LocalStack, stack: Any, derived: Any) -> tuple[str, ...]:
    """What differs between the environment and the pins of ``stack`` (a matrix stack, its ``derived``
    facts), one phrase each: ``torch 2.9.1 installed, stack pins 2.14.1``. Empty when it is that stack."""
    found: list[str] = []
    python = ".".join(env.python.split(".")[:2])
    if python != stack.python:
        found.append(f"python {python or 'unknown'} here, stack pins {stack.python}")
    for (distribution, axis), installed in zip(_AXES, (env.torch, env.flashinfer, env.sglang), strict=True):
        _compare(found, distribution, installed, getattr(stack, axis))
    if (env.torch_cuda or None) != (derived.torch_cuda or None):
        found.append(f"torch built for CUDA {env.torch_cuda or 'none (CPU)'}, stack's torch is for "
                     f"CUDA {derived.torch_cuda or 'none (CPU)'}")
    if derived.kernel_package and derived.kernel_version:
        have = next((k.split("==", 1)[1] for k in [env.kernel or ""] if k.startswith(derived.kernel_package + "==")),
                    None)
        _compare(found, derived.kernel_package, have, derived.kernel_version)
    if derived.has_nvcc and env.nvcc != stack.cuda:
        found.append(f"nvcc {env.nvcc or 'not found'} here, stack has nvcc {stack.cuda}")
    if not derived.has_nvcc and env.nvcc:
        found.append(f"nvcc {env.nvcc} found here, stack has no nvcc")
    return tuple(found)


def _compare(found: list[str], distribution: str, installed: str | None, pinned: str) -> None:
    """Append ``<dist> <installed> installed, stack pins <pinned>`` when they are not the same version."""
    from packaging.version import InvalidVersion, Version

    if installed is None:
        found.append(f"{distribution} not installed, stack pins {pinned}")
        return
    try:
        # torch's local label (+cu128) is the CUDA build, compared on its own above
        same = Version(Version(installed).public) == Version(Version(pinned).public)
    except InvalidVersion:
        same = installed == pinned
    if not same:
        found.append(f"{distribution} {installed} installed, stack pins {pinned}")


def _optional(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None
