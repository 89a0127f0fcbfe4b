"""Fatbin containers: which SASS / PTX archs a blob of device code carries (standard library only).

Shared by the in-image gate probe ``kernel_cubins.py`` (files on disk) and the wheel tier's binary
readers (a wheel member inflated by HTTP range requests): both hand over a ``read_at(offset, length)``
callable, so the same parser reads an open file and a remote zip member.

A fatbin container (``.nv_fatbin`` / ``__nv_relfatbin`` sections of a shared object, or a bare
``.fatbin`` file): header magic 0xBA55ED50, u16 version, u16 header size, u64 payload size; then
entries (u16 kind 1=PTX 2=ELF, u16, u32 header size, u64 payload size, ..., u32 arch at +28, u64
flags at +40). In those flags 0x100000 marks arch-specific (``a``) and 0x200000 family (``f``) code;
entries may be compressed, their headers are not. Containers start at 8-byte boundaries.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

#: Read ``length`` bytes at ``offset`` (fewer only at the end of the data).
ReadAt = Callable[[int, int], bytes]

FATBIN_MAGIC = 0xBA55ED50
FATBIN_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000
KIND_PTX, KIND_ELF = 1, 2
_HEADER = struct.Struct("<IHHQ")
_ENTRY_MIN = 48
#: A device code as listed: ``sm_120a`` (SASS), ``compute_90`` (PTX).
CODE = re.compile(r"(sm|compute)_(\d+)([af]?)")
#: The arch numbers a real entry carries (sm_20 .. sm_199): anything else is a stray magic, not a fatbin.
_ARCH_RANGE = range(20, 200)


def fatbin_entries(read_at: ReadAt, start: int, end: int, *, strict: bool = False) -> Iterator[tuple[int, int, int]]:
    """(kind, arch, flags) of every entry of every fatbin container in [start, end).

    ``strict``: also require version 1, a 16-byte header and plausible archs, for a scan of bytes that
    are not known to be a fatbin section (a whole shared object read front to back): a stray magic
    in host code or data is then skipped, not read as device code.
    """
    position = find_magic(read_at, start, end)
    while position is not None and position + _HEADER.size <= end:
        head = read_at(position, _HEADER.size)
        if len(head) < _HEADER.size:
            return
        magic, version, header_size, payload = _HEADER.unpack(head)
        if magic != FATBIN_MAGIC or header_size < 16 or (strict and (version != 1 or header_size != 16)):
            position = find_magic(read_at, position + 8, end)
            continue
        entries = list(_container_entries(read_at, position + header_size,
                                          min(position + header_size + payload, end), strict))
        if strict and not entries:
            position = find_magic(read_at, position + 8, end)
            continue
        yield from entries
        position = find_magic(read_at, position + header_size + payload, end)


def _container_entries(read_at: ReadAt, entry: int, container_end: int,
                       strict: bool) -> Iterator[tuple[int, int, int]]:
    while entry + _ENTRY_MIN <= container_end:
        head = read_at(entry, _ENTRY_MIN)
        if len(head) < _ENTRY_MIN:
            return
        kind, _unknown, entry_header, size = struct.unpack_from("<HHIQ", head, 0)
        if kind not in (KIND_PTX, KIND_ELF) or entry_header < _ENTRY_MIN:
            return
        arch, flags = struct.unpack_from("<I", head, 28)[0], struct.unpack_from("<Q", head, 40)[0]
        if strict and arch not in _ARCH_RANGE:
            return
        yield kind, arch, flags
        entry += entry_header + size


def find_magic(read_at: ReadAt, start: int, end: int, chunk: int = 1 << 20) -> int | None:
    """Offset of the next fatbin magic at an 8-byte boundary in [start, end)."""
    start += (-start) % 8
    while start < end:
        data = read_at(start, min(chunk, end - start) + 3)
        index = data.find(FATBIN_MAGIC_BYTES)
        while index >= 0 and (start + index) % 8:
            index = data.find(FATBIN_MAGIC_BYTES, index + 1)
        if index >= 0 and start + index < end:
            return start + index
        if len(data) < min(chunk, end - start):
            return None   # the data ended before ``end``
        start += chunk
    return None


def entry_code(kind: int, arch: int, flags: int) -> str:
    """``sm_120a`` for an ELF entry, ``compute_90`` for a PTX one."""
    suffix = "a" if flags & FLAG_ARCH_SPECIFIC else ("f" if flags & FLAG_FAMILY else "")
    return f"{'compute' if kind == KIND_PTX else 'sm'}_{arch}{suffix}"


@dataclass(frozen=True, slots=True)
class Arch:
    """A compute capability such as 12.0 (major 12, minor 0)."""

    major: int
    minor: int

    @property
    def sm(self) -> int:
        """The number nvcc and cubins use: 120 for 12.0."""
        return self.major * 10 + self.minor

    @property
    def dotted(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def sm_name(self) -> str:
        return f"sm_{self.sm}"


def code_runs_on(kind: str, number: int, suffix: str, target) -> bool:
    """Whether device code built for ``<kind>_<number><suffix>`` runs on ``target`` (a compute capability
    with ``major``, ``minor`` and ``sm``, e.g. 12, 0, 120).

    SASS (``sm``): arch-specific ``a`` runs only on its own arch; plain and family ``f`` code runs
    on the same major with a minor >= its own (sm_120 and sm_120f on 12.0 and 12.1).
    PTX (``compute``): the driver JIT-compiles plain PTX for any newer arch; ``a``/``f`` PTX only
    within its own major.
    """
    if kind == "compute":
        return number <= target.sm if not suffix else (number // 10 == target.major and number <= target.sm)
    if suffix == "a":
        return number == target.sm
    return number // 10 == target.major and number % 10 <= target.minor


def code_sort_key(code: str) -> tuple[int, str]:
    match = CODE.fullmatch(code)
    return (int(match.group(2)), code) if match else (0, code)


def split_codes(codes: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(SASS, PTX) of device codes, each once, by arch number."""
    unique = sorted(set(codes), key=code_sort_key)
    return (tuple(c for c in unique if c.startswith("sm_")), tuple(c for c in unique if c.startswith("compute_")))


def covers(code: str, target) -> bool:
    """Whether the listed code (``sm_120a``, ``compute_90``) runs on ``target`` (see :func:`code_runs_on`)."""
    match = CODE.fullmatch(code)
    return bool(match) and code_runs_on(match.group(1), int(match.group(2)), match.group(3), target)


def file_read_at(handle) -> ReadAt:
    """``read_at`` over an open binary file."""
    def read_at(offset: int, length: int) -> bytes:
        handle.seek(offset)
        return handle.read(length)
    return read_at
