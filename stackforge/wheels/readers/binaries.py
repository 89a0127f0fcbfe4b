"""Readers of compiled code: which GPU archs the prebuilt kernels of torch, sgl-kernel / sglang-kernel,
flashinfer-cubin and flashinfer-jit-cache carry, read from their wheels by HTTP range requests.

These wheels are mostly device code (torch's is ~0.5-1 GB): they are never downloaded whole or
unpacked. A *scan* (:func:`scan_torch`, :func:`scan_kernels`, :func:`scan_names`) reads what it needs
of a :class:`~stackforge.edges.ranges.RemoteZip`: the central directory, then the wanted members
inflated front to back only while their compressed bytes stay within the per-library limit
(``STACKFORGE_ABI_MAX_LIBRARY_MB``, as the ABI reading), their fatbin containers parsed on the way
(:mod:`stackforge.inimage._sffatbin`, the parser of the gate probe ``kernel_cubins.py``). A scan is
context-free and cached by the wheel's sha256; the *readers* then decide it for a target (pure).

What was not read is never "missing": a member whose bytes past the limit were left unread, and
that showed no code for the target in what was read, is ``undecided``, the limit named.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stackforge.core.wheel_readings import CodeSite, ReadContext, ReaderSpec, Reading, ReadingStatus
from stackforge.edges.ranges import MemberBytes, RemoteZip
from stackforge.inimage._sffatbin import Arch, covers, entry_code, fatbin_entries, split_codes

#: Bump when what a stored scan holds changes.
SCAN_FORMAT = "stackforge-binaries-3"
#: torch's CUDA kernels: libtorch_cuda.so (split into _cu / _cpp in torch 1.x wheels).
TORCH_CUDA_LIBRARY = re.compile(r"^torch/lib/libtorch_cuda[^/]*\.so$")
#: An arch named in a file or folder name (flashinfer-cubin's ``Sm100a``, ``sm_90a``, ``sm100f``).
NAMED_ARCH = re.compile(r"[Ss]m_?(\d{2,3})([af]?)(?![0-9a-z])")
#: The CUDA runtime a torch wheel pins: ``nvidia-cuda-runtime-cu12==12.8.90`` (torch <= 2.9), or
#: ``cuda-toolkit[cublas,cudart,...]==13.0.3`` (the CUDA 13 builds).
CUDA_RUNTIME_PIN = re.compile(r"^Requires-Dist:\s*(?:nvidia-cuda-runtime(?:-cu\d+)?|cuda-toolkit\[[^]]*cudart[^]]*\])"
                              r"\s*\(?\s*==\s*(\d+)\.(\d+)", re.I)
NCCL_PIN = re.compile(r"^Requires-Dist:\s*(nvidia-nccl-cu\d+)\s*(?:\[[^]]*\])?\s*\(?\s*==\s*([^\s;,)]+)", re.I)
_DEVICE_SUFFIXES = (".so", ".cubin", ".fatbin")


class _OverBudget(Exception):
    """The member's compressed bytes read so far reached the per-library limit."""


@dataclass(frozen=True, slots=True)
class MemberCode:
    """The device code found in one wheel member.

    ``complete`` is False when the member was read only part of the way (``note`` says how far and
    why): code it lacks in what was read may sit in the rest.
    """

    member: str
    sass: tuple[str, ...] = ()
    ptx: tuple[str, ...] = ()
    complete: bool = True
    note: str = ""

    @property
    def codes(self) -> tuple[str, ...]:
        return self.sass + self.ptx

    def to_json(self) -> dict[str, Any]:
        return {"member": self.member, "sass": list(self.sass), "ptx": list(self.ptx), "complete": self.complete,
                "note": self.note}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemberCode:
        return cls(data["member"], tuple(data["sass"]), tuple(data["ptx"]), bool(data["complete"]), data["note"])


@dataclass(frozen=True, slots=True)
class BinaryScan:
    """What one wheel's compiled code carries, read by ranges (context-free; cached by sha256)."""

    members: tuple[MemberCode, ...] = ()
    metadata: tuple[tuple[int, str], ...] = ()   # (line, text) of the METADATA lines a reader cites
    how: str = ""                                # what was read: "central directory only", ...
    fetched: int = 0
    wheel_size: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": SCAN_FORMAT, "members": [m.to_json() for m in self.members],
                "metadata": [list(m) for m in self.metadata], "how": self.how, "fetched": self.fetched,
                "wheel_size": self.wheel_size, "seconds": round(self.seconds, 2), "extra": self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BinaryScan:
        if data.get("format") != SCAN_FORMAT:
            raise ValueError(f"scan format {data.get('format')!r}")
        return cls(tuple(MemberCode.from_json(m) for m in data["members"]),
                   tuple((int(line), text) for line, text in data["metadata"]), data["how"], int(data["fetched"]),
                   int(data["wheel_size"]), float(data["seconds"]), {**data.get("extra", {}), "cached": True})

    def cost(self) -> str:
        """How it was read: ``read by HTTP ranges: <how>; 1.4 of 373.0 MB in 2.1 s`` (earlier, when cached)."""
        when = " (cached: read earlier)" if self.extra.get("cached") else ""
        return (f"read by HTTP ranges: {self.how}; {self.fetched / 1e6:.1f} of {self.wheel_size / 1e6:.1f} MB "
                f"in {self.seconds:.1f} s{when}")


# --- scans (read a RemoteZip; no decision) -------------------------------------------------------------

def member_code(data: MemberBytes, remote: RemoteZip, limit: int) -> MemberCode:
    """The fatbin codes of one member, inflated front to back until its end or ``limit`` compressed bytes.

    The containers are found by their magic and checked (version, header size, entry kinds, archs):
    the whole object is scanned, not only its ``.nv_fatbin`` section, whose place the section headers
    at the object's end would give only after inflating all of it.
    """
    start, size = remote.fetched, data.size

    def read_at(offset: int, length: int) -> bytes:
        length = min(length, size - offset)
        if length <= 0:
            return b""
        if remote.fetched - start > limit:
            raise _OverBudget
        return data.at(offset, length)

    codes: list[str] = []
    try:
        for entry in fatbin_entries(read_at, 0, size, strict=True):
            codes.append(entry_code(*entry))
    except _OverBudget:
        sass, ptx = split_codes(codes)
        return MemberCode(data.member.name, sass, ptx, complete=False,
                          note=f"read {data.decompressed / 1e6:.0f} of {size / 1e6:.0f} MB "
                               f"({data.member.compressed_size / 1e6:.0f} MB compressed, over the "
                               f"{limit >> 20} MiB read per library; STACKFORGE_ABI_MAX_LIBRARY_MB raises it)")
    except (ValueError, EOFError, zlib.error) as exc:   # a member this parser cannot walk: said, not fatal
        sass, ptx = split_codes(codes)
        return MemberCode(data.member.name, sass, ptx, complete=False,
                          note=f"not read to the end: {type(exc).__name__}: {exc}")
    sass, ptx = split_codes(codes)
    return MemberCode(data.member.name, sass, ptx)


def metadata_lines(text: str, wanted: re.Pattern[str]) -> tuple[tuple[int, str], ...]:
    """(line number, text) of the METADATA header lines ``wanted`` matches."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line:
            break
        if wanted.match(line):
            found.append((number, line.strip()))
    return tuple(found)


def _is_metadata(name: str) -> bool:
    return name.count("/") == 1 and name.endswith(".dist-info/METADATA")


def scan_torch(remote: RemoteZip, limit: int) -> BinaryScan:
    """torch: the fatbins of libtorch_cuda.so (as far as ``limit``) and the NCCL pin of its METADATA."""
    def read(data: MemberBytes) -> MemberCode | str:
        if _is_metadata(data.member.name):
            return data.prefix(min(data.size, 1 << 20)).decode("utf-8", errors="replace")
        return member_code(data, remote, limit)

    found = remote.read_members(lambda name: bool(TORCH_CUDA_LIBRARY.match(name)) or _is_metadata(name), read)
    metadata_name, metadata = next(((k, v) for k, v in found.items() if isinstance(v, str)), ("", ""))
    members = tuple(sorted((v for v in found.values() if isinstance(v, MemberCode)), key=lambda m: m.member))
    wanted = re.compile(f"{NCCL_PIN.pattern}|{CUDA_RUNTIME_PIN.pattern}", re.I)
    return BinaryScan(members, metadata_lines(metadata, wanted),
                      how="central directory, METADATA, torch/lib/libtorch_cuda*.so front to back",
                      extra={"metadata": metadata_name})


def scan_kernels(remote: RemoteZip, limit: int) -> BinaryScan:
    """A kernel package (sgl-kernel / sglang-kernel): the fatbins of every shared object (each to ``limit``)."""
    found = remote.read_members(lambda name: name.endswith(".so") or ".so." in name.rpartition("/")[2],
                                lambda data: member_code(data, remote, limit))
    return BinaryScan(tuple(sorted(found.values(), key=lambda m: m.member)),
                      how="central directory, then every shared object front to back")


def scan_names(remote: RemoteZip, limit: int) -> BinaryScan:
    """flashinfer-cubin / flashinfer-jit-cache: the arch each device-code member's path names (the
    central directory only: their cubins and modules are named per arch)."""
    if remote.ranged:
        names = [m.name for m in remote.members()]
    else:   # a server that ignores Range: its local headers walked, no member inflated
        names = list(remote.read_members(lambda name: name.endswith(_DEVICE_SUFFIXES), lambda data: None))
    members = []
    for name in names:
        if not name.endswith(_DEVICE_SUFFIXES):
            continue
        named = [f"sm_{number}{suffix}" for number, suffix in NAMED_ARCH.findall(name)]
        # the arch nearest the file name is the one the code is built for
        members.append(MemberCode(name, (named[-1],) if named else (), (), complete=bool(named),
                                  note="" if named else "no arch in its name"))
    return BinaryScan(tuple(members), how="central directory only (member names)")


# --- decisions (pure) ----------------------------------------------------------------------------------

def _target(fact: str, ctx: ReadContext) -> Arch | Reading:
    match = re.fullmatch(r"(\d{1,2})\.(\d)", ctx.arch.strip())
    if match is None:
        return Reading(fact, ReadingStatus.UNDECIDED, f"target arch {ctx.arch!r} is no compute capability such as "
                       "12.0", depends_on=("arch",))
    return Arch(int(match.group(1)), int(match.group(2)))


def _listing(codes: Sequence[str], limit: int = 10) -> str:
    sass, ptx = split_codes(codes)
    shown = list(sass) + [f"ptx {c}" for c in ptx]
    return " ".join(shown[:limit]) + (f" (+{len(shown) - limit} more)" if len(shown) > limit else "") or "none"


def code_site(member: MemberCode) -> CodeSite:
    text = f"fatbin: {' '.join(member.codes) or 'no device code'}"
    return CodeSite(member.member, 0, text + (f" ({member.note})" if member.note else ""))


def read_torch_kernels(scan: BinaryScan, ctx: ReadContext) -> Reading:
    """torch-kernels: libtorch_cuda.so carries SASS that runs on the target, or PTX that JIT-compiles to it."""
    fact = "torch-kernels"
    target = _target(fact, ctx)
    if isinstance(target, Reading):
        return target
    nccl = tuple(CodeSite(scan.extra.get("metadata") or "METADATA", line, text) for line, text in scan.metadata)
    pin = next((p for p in (NCCL_PIN.match(text) for _, text in scan.metadata) if p), None)
    nccl_text = f"; NCCL {pin.group(2)} ({pin.group(1)})" if pin else "; no nvidia-nccl pin in its METADATA"
    runtime = next((p for p in (CUDA_RUNTIME_PIN.match(text) for _, text in scan.metadata) if p), None)
    built_for = f"{runtime.group(1)}.{runtime.group(2)}" if runtime else None
    if ctx.torch_cuda and built_for and built_for != ctx.torch_cuda:
        # torch publishes one build per CUDA version; the index's wheel is not the stack's
        return Reading(fact, ReadingStatus.UNDECIDED, f"this wheel is torch's CUDA {built_for} build (its "
                       f"nvidia-cuda-runtime pin); the stack's torch is the CUDA {ctx.torch_cuda} build, another "
                       f"wheel{nccl_text}", nccl, ("arch", "torch_cuda"))
    depends = ("arch", "torch_cuda") if ctx.torch_cuda and built_for else ("arch",)
    nccl_text = (f"; CUDA {built_for} build" if built_for else "") + nccl_text
    if not scan.members:
        return Reading(fact, ReadingStatus.UNAVAILABLE, f"no torch/lib/libtorch_cuda.so: a CPU build{nccl_text}",
                       nccl, depends)
    sites = tuple(code_site(m) for m in scan.members) + nccl
    codes = [c for m in scan.members for c in m.codes]
    sass = [c for c in codes if c.startswith("sm_") and covers(c, target)]
    ptx = [c for c in codes if c.startswith("compute_") and covers(c, target)]
    complete = all(m.complete for m in scan.members)
    seen = f"{', '.join(m.member.rpartition('/')[2] for m in scan.members)} carry {_listing(codes)}"
    if sass:
        return Reading(fact, ReadingStatus.AVAILABLE, f"SASS {' '.join(dict.fromkeys(sass))} runs on "
                       f"{target.sm_name} ({seen}){nccl_text}", sites, depends)
    if ptx:
        return Reading(fact, ReadingStatus.AVAILABLE, f"no SASS for {target.sm_name} "
                       f"{'' if complete else 'in what was read '}but PTX {' '.join(dict.fromkeys(ptx))} "
                       f"JIT-compiles to it at first use ({seen}){nccl_text}", sites, depends, manner="ptx jit")
    if not complete:
        note = next(m.note for m in scan.members if not m.complete)
        return Reading(fact, ReadingStatus.UNDECIDED, f"no code for {target.sm_name} in what was read ({seen}); "
                       f"the rest was not read: {note}{nccl_text}", sites, depends)
    return Reading(fact, ReadingStatus.UNAVAILABLE, f"neither SASS for {target.sm_name} nor PTX <= "
                   f"compute_{target.sm} ({seen}){nccl_text}", sites, depends)


def read_kernel_coverage(scan: BinaryScan, ctx: ReadContext) -> Reading:
    """kernel-arch-coverage: the package's device code covers the target when at least one of its files
    carries code that runs on it (as the gate probe decides); the files that do not are named."""
    fact = "kernel-arch-coverage"
    target = _target(fact, ctx)
    if isinstance(target, Reading):
        return target
    with_code = [m for m in scan.members if m.codes]
    runs = {code: covers(code, target) for m in with_code for code in m.codes}   # a cubin wheel has 16k members
    covering = [m for m in with_code if any(runs[c] for c in m.codes)]
    covered = {m.member for m in covering}
    partial = [m for m in scan.members if not m.complete and m.member not in covered]
    shown = dict.fromkeys(covering + [m for m in with_code if m.member not in covered] + partial)
    sites = tuple(code_site(m) for m in list(shown)[:12])
    archs = _listing(list(runs))
    lacking = [m.member for m in with_code if m.member not in covered and m.complete]
    lacking_text = (f"; no code for {target.sm_name} in {', '.join(lacking[:4])}"
                    + (f" (+{len(lacking) - 4} more)" if len(lacking) > 4 else "")) if lacking else ""
    if covering:
        return Reading(fact, ReadingStatus.AVAILABLE, f"{len(covering)}/{len(with_code)} files with device code "
                       f"cover {target.sm_name} ({archs}){lacking_text}", sites, ("arch",))
    if partial:
        return Reading(fact, ReadingStatus.UNDECIDED, f"no file covers {target.sm_name} in what was read "
                       f"({archs}); {len(partial)} file(s) not read to the end: {partial[0].note}", sites, ("arch",))
    if not with_code:
        return Reading(fact, ReadingStatus.UNDECIDED, f"no device code found ({scan.how}: "
                       f"{len(scan.members)} member(s))", sites, ("arch",))
    return Reading(fact, ReadingStatus.UNAVAILABLE, f"none of {len(with_code)} files with device code covers "
                   f"{target.sm_name} ({archs})", sites, ("arch",))


Scan = Callable[[RemoteZip, int], BinaryScan]


def _spec(fact: str, dist: str, reader: Callable[[BinaryScan, ReadContext], Reading], scan: Scan,
          what: str) -> ReaderSpec:
    return ReaderSpec(fact, dist, reader, what, scan=scan)  # type: ignore[arg-type]


READERS: tuple[ReaderSpec, ...] = (
    _spec("torch-kernels", "torch", read_torch_kernels, scan_torch,
          "fatbins of torch/lib/libtorch_cuda.so (by ranges, to the per-library limit) and the NCCL pin"),
    *(_spec("kernel-arch-coverage", dist, read_kernel_coverage, scan_kernels,
            "fatbins of every shared object (by ranges, each to the per-library limit)")
      for dist in ("sgl-kernel", "sglang-kernel")),
    *(_spec("kernel-arch-coverage", dist, read_kernel_coverage, scan_names,
            "the arch each cubin / module's path names (the central directory only)")
      for dist in ("flashinfer-cubin", "flashinfer-jit-cache")),
)


# --- the edge: a wheel's scan, fetched by ranges or taken from the wheel cache ----------------------------

def scan_wheel(scan: Scan, wheel: Any, *, cache: Any, limit: int) -> BinaryScan:
    """``scan`` of ``wheel`` (a ReleaseFile), stored as ``<wheel cache>/binaries/<sha256>-<scan>.json``; a
    stored scan that left bytes unread under another limit is read again.

    Raises:
        IndexUnreachableError: the wheel's host did not answer.
        BadZipFile: the answer is no zip this reader can walk.
    """
    import json
    import time

    from stackforge.core.fsio import atomic_write_text
    from stackforge.edges.index import with_credentials

    path = cache.root / "binaries" / f"{wheel.sha256}-{scan.__name__}.json" if wheel.sha256 else None
    if path is not None and path.is_file():
        try:
            stored = BinaryScan.from_json(json.loads(path.read_text()))
            if all(m.complete for m in stored.members) or stored.extra.get("limit") == limit:
                return stored
        except (OSError, ValueError, KeyError, TypeError):
            pass   # a damaged entry is read again
    started = time.monotonic()
    remote = RemoteZip(with_credentials(wheel.url, cache.indexes), session=cache.session, display_url=wheel.url)
    try:
        found = scan(remote, limit)
    finally:
        remote.close()
    result = BinaryScan(found.members, found.metadata, found.how, remote.fetched, remote.size or 0,
                        time.monotonic() - started, {**found.extra, "limit": limit})
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(result.to_json()))
    return result
