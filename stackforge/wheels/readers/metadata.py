"""Readers of a wheel's package metadata (``*.dist-info/METADATA``): Requires-Python, the torch pin
and whether the release needs a CUDA 13 stack, and the kernel package SGLang requires.

The headers are read as written, with their line numbers; requirements under an extra count only for
the extra a CUDA install of that release uses (``srt`` for SGLang before its requirements became
unconditional), so an optional ``[cu13]`` extra does not decide a release's stack.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackforge.core.wheel_readings import CodeSite, ReadContext, ReaderSpec, Reading, ReadingStatus
from stackforge.wheels.readers._reader import gate_reading, reads, specs

#: The extra of a release whose requirements a CUDA install pulls in when they are not unconditional:
#: SGLang up to 0.5.x kept its runtime (torch, sgl-kernel, flashinfer) under ``sglang[srt]``.
RUNTIME_EXTRAS = ("srt",)
KERNEL_PACKAGES = ("sgl-kernel", "sglang-kernel")
EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
#: CUDA 12 releases of cuda-python a requirement must leave out to need CUDA 13.
CUDA12_PROBES = ("12.0", "12.8", "12.9", "12.9.9")


@dataclass(frozen=True, slots=True)
class Header:
    line: int
    name: str
    value: str
    text: str                 # the line as written, stripped


@dataclass(frozen=True, slots=True)
class Dependency:
    header: Header
    requirement: Requirement
    extra: str | None         # the extra it is under; None: unconditional


def metadata_file(root: Path) -> Path | None:
    found = sorted(root.glob("*.dist-info/METADATA"))
    return found[0] if found else None


def headers(path: Path) -> Iterator[Header]:
    """The header lines of a METADATA file, up to the empty line before the description (a line of
    spaces is a continuation: ``License:`` texts hold them)."""
    for number, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not raw:
            return
        name, sep, value = raw.partition(":")
        if sep and not raw[:1].isspace():
            yield Header(number, name.strip(), value.strip(), raw.strip())


def site(root: Path, path: Path, header: Header | None) -> CodeSite:
    relative = path.relative_to(root).as_posix()
    return CodeSite(relative, header.line, header.text) if header else CodeSite(relative, 0, "")


def extra_of(requirement: Requirement) -> str | None:
    """The extra a requirement's marker names (``extra == "srt"``), if any."""
    found = EXTRA_MARKER.search(str(requirement.marker or ""))
    return canonicalize_name(found.group(1)) if found else None


def dependencies(path: Path) -> list[Dependency]:
    found = []
    for header in headers(path):
        if header.name.lower() != "requires-dist":
            continue
        try:
            requirement = Requirement(header.value)
        except InvalidRequirement:
            continue
        found.append(Dependency(header, requirement, extra_of(requirement)))
    return found


def runtime_dependencies(path: Path) -> list[Dependency]:
    """What a CUDA install of the release pulls in: the unconditional requirements and those of
    :data:`RUNTIME_EXTRAS` (markers other than an extra, e.g. a platform, are kept as written)."""
    return [d for d in dependencies(path) if d.extra is None or d.extra in RUNTIME_EXTRAS]


def named(deps: list[Dependency], *names: str) -> Dependency | None:
    wanted = {canonicalize_name(n) for n in names}
    return next((d for d in deps if canonicalize_name(d.requirement.name) in wanted), None)


def described(root: Path, path: Path, dep: Dependency) -> str:
    """``x.dist-info/METADATA:LINE torch==2.9.1`` (and the extra it is under)."""
    requirement = dep.requirement
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    under = f" (extra {dep.extra})" if dep.extra else ""
    where = f"{path.relative_to(root).as_posix()}:{dep.header.line}"
    return f"{where} {requirement.name}{extras}{requirement.specifier}{under}"


def no_metadata(fact: str) -> Reading:
    return Reading(fact, ReadingStatus.UNDECIDED, "the wheel has no *.dist-info/METADATA")


# --------------------------------------------------------------------------------------------
# metadata:requires-python
# --------------------------------------------------------------------------------------------

@reads("metadata:requires-python", "Requires-Python in *.dist-info/METADATA")
def read_requires_python(root: Path, ctx: ReadContext) -> Reading:
    """Is the context's Python admitted by the release's Requires-Python?"""
    fact = "metadata:requires-python"
    path = metadata_file(root)
    if path is None:
        return no_metadata(fact)
    header = next((h for h in headers(path) if h.name.lower() == "requires-python"), None)
    where = site(root, path, header)
    if header is None:
        return Reading(fact, ReadingStatus.AVAILABLE, f"{where.path}: no Requires-Python: any Python admitted",
                       (where,), ("python",))
    if ctx.python is None:
        return Reading(fact, ReadingStatus.UNDECIDED,
                       f"{where.path}:{where.line} Requires-Python: {header.value}; the context names no Python",
                       (where,), ("python",))
    try:
        admitted = SpecifierSet(header.value).contains(ctx.python, prereleases=True)
    except (InvalidSpecifier, InvalidVersion) as exc:
        return Reading(fact, ReadingStatus.UNDECIDED, f"{where.path}:{where.line} unreadable: {exc}", (where,),
                       ("python",))
    return gate_reading(fact, admitted,
                        f"{where.path}:{where.line} Requires-Python: {header.value}: Python {ctx.python} "
                        f"{'admitted' if admitted else 'not admitted'}", (where,), ("python",))


# --------------------------------------------------------------------------------------------
# metadata:torch-pin
# --------------------------------------------------------------------------------------------

def needs_cuda13(dep: Dependency) -> bool:
    """A requirement that only a CUDA 13 stack satisfies: ``cuda-python`` with no 12.x admitted,
    a ``[cu13]`` extra (``flashinfer_python[cu13]``), or a ``*-cu13`` distribution."""
    requirement = dep.requirement
    name = canonicalize_name(requirement.name)
    if "cu13" in {canonicalize_name(e) for e in requirement.extras} or name.endswith("-cu13"):
        return True
    if name == "cuda-python" and requirement.specifier:
        spec = requirement.specifier
        return not any(spec.contains(v, prereleases=True) for v in CUDA12_PROBES) and spec.contains("13.0")
    return False


def cuda_major(version: str) -> int | None:
    try:
        return Version(version).major
    except InvalidVersion:
        return None


@reads("metadata:torch-pin",
       "Requires-Dist torch and the requirements only a CUDA 13 stack satisfies (cuda-python>=13, [cu13])")
def read_torch_pin(root: Path, ctx: ReadContext) -> Reading:
    """The release's torch requirement and whether it needs a CUDA 13 stack, for the context's torch
    CUDA: UNAVAILABLE when it does and ``ctx.torch_cuda`` is below 13."""
    fact = "metadata:torch-pin"
    path = metadata_file(root)
    if path is None:
        return no_metadata(fact)
    deps = runtime_dependencies(path)
    torch = named(deps, "torch")
    if torch is None:
        return Reading(fact, ReadingStatus.ABSENT, f"{site(root, path, None).path}: no Requires-Dist torch",
                       (site(root, path, None),), ("torch_cuda",))
    cuda13 = next((d for d in deps if needs_cuda13(d)), None)
    sites = (site(root, path, torch.header), *((site(root, path, cuda13.header),) if cuda13 else ()))
    pin = described(root, path, torch)
    if cuda13 is None:
        return Reading(fact, ReadingStatus.AVAILABLE,
                       f"{pin}; no requirement needs CUDA 13 (cuda-python, [cu13], *-cu13)", sites, ("torch_cuda",))
    stack = f"{pin}; {described(root, path, cuda13)} needs a CUDA 13 stack"
    major = cuda_major(ctx.torch_cuda) if ctx.torch_cuda else None
    if major is None:
        return Reading(fact, ReadingStatus.UNDECIDED, f"{stack}; the context names no torch CUDA", sites,
                       ("torch_cuda",))
    return gate_reading(fact, major >= 13,
                        f"{stack}: torch CUDA {ctx.torch_cuda} {'is' if major >= 13 else 'is not'} one",
                        sites, ("torch_cuda",))


# --------------------------------------------------------------------------------------------
# metadata:kernel-package
# --------------------------------------------------------------------------------------------

@reads("metadata:kernel-package", "Requires-Dist sgl-kernel / sglang-kernel in *.dist-info/METADATA")
def read_kernel_package(root: Path, ctx: ReadContext) -> Reading:
    """Which kernel distribution the release requires (``sgl-kernel``, renamed ``sglang-kernel``):
    UNAVAILABLE when the context's kernel package is the other name."""
    fact = "metadata:kernel-package"
    path = metadata_file(root)
    if path is None:
        return no_metadata(fact)
    kernel = named(runtime_dependencies(path), *KERNEL_PACKAGES)
    if kernel is None:
        return Reading(fact, ReadingStatus.ABSENT,
                       f"{site(root, path, None).path}: requires neither {' nor '.join(KERNEL_PACKAGES)}",
                       (site(root, path, None),), ("kernel_package",))
    where = site(root, path, kernel.header)
    required = canonicalize_name(kernel.requirement.name)
    said = described(root, path, kernel)
    if ctx.kernel_package is None:
        return Reading(fact, ReadingStatus.UNDECIDED, f"{said}; the context names no kernel package", (where,),
                       ("kernel_package",))
    same = canonicalize_name(ctx.kernel_package) == required
    return gate_reading(fact, same,
                        f"{said}: {ctx.kernel_package} {'is' if same else 'is not'} the package it requires",
                        (where,), ("kernel_package",))


READERS: tuple[ReaderSpec, ...] = (
    *specs("sglang", read_requires_python, read_torch_pin, read_kernel_package),
    *specs("flashinfer-python", read_requires_python, read_torch_pin),
)
