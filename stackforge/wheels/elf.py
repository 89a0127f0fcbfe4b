"""The dynamic symbol table of an ELF shared object, read from the front of the file only.

The loader resolves an extension's undefined symbols against the ``.dynsym`` of the libraries it
links: that table and its names (``.dynstr``) are all an ABI comparison needs. Two ways to find them:

* **.dynamic**: the program headers' ``PT_DYNAMIC`` gives ``DT_SYMTAB``, ``DT_STRTAB``, ``DT_STRSZ`` and
  ``DT_GNU_HASH`` / ``DT_HASH`` (the symbol count), addresses mapped to file offsets by ``PT_LOAD``.
  Exact, but ``.dynamic`` sits in the writable segment, after the code: 344 MB into torch 2.13's
  434 MB ``libtorch_cpu.so``, so a compressed wheel member must be inflated that far.
* **layout**: linkers put ``.dynsym`` (after the build-id note and, with GNU ld's default script, a
  ``.gnu.hash``) at the front of the first segment and ``.dynstr`` right behind it; torch's
  ``libtorch_cpu.so`` has it at 0x260, its names ending 7 MB in. The table is found there: the null
  symbol, the count from the ``.gnu.hash`` before it or else from where entries stop being symbol
  entries, and it is taken only when the table behind it starts with a NUL and every symbol's name
  offset points at a printable name in it (a wrong boundary fails that check).

The layout reading is tried first (it needs the front only); ``.dynamic`` is the fallback while it lies
within ``limit`` bytes. Only 64-bit little-endian objects are read (the x86_64 / aarch64 wheels).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

#: Read ``length`` bytes at ``offset`` of the object (raises EOFError past its end).
ReadAt = Callable[[int, int], bytes]

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SYM = struct.Struct("<IBBHQQ")
_DYN = struct.Struct("<qQ")
_PT_LOAD, _PT_DYNAMIC, _PT_NOTE = 1, 2, 4
_DT_NULL, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ = 0, 4, 5, 6, 10
_DT_GNU_HASH = 0x6FFFFEF5
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_SHN_UNDEF = 0
_VALID_TYPES = frozenset({0, 1, 2, 3, 4, 5, 6, 10})     # NOTYPE..TLS, GNU_IFUNC
_VALID_BINDS = frozenset({0, 1, 2, 10})                 # LOCAL, GLOBAL, WEAK, GNU_UNIQUE
_MAX_SYMBOLS = 4_000_000


class ElfError(ValueError):
    """Not an ELF object this reader reads, or its dynamic symbol table could not be found."""


@dataclass(frozen=True, slots=True)
class DynamicSymbols:
    """What one shared object exports and needs, by mangled name.

    Attributes:
        defined: global / weak / unique symbols with a section (what the loader can bind to).
        undefined: global undefined symbols (a weak undefined one does not fail a load).
        located: how the table was found, said in the evidence (``.dynamic`` or ``layout ...``).
        count: entries in ``.dynsym``.
        end: the first byte past ``.dynsym`` and the names read (how far into the object it read).
    """

    defined: frozenset[str]
    undefined: frozenset[str]
    located: str
    count: int
    end: int


def dynamic_symbols(read_at: ReadAt, *, limit: int) -> DynamicSymbols:
    """The dynamic symbols of the object ``read_at`` reads, without reading past ``limit`` bytes.

    Raises:
        ElfError: not a 64-bit little-endian ELF object, or no table found within ``limit``.
    """
    header = _EHDR.unpack(read_at(0, _EHDR.size))
    ident, phoff, phentsize, phnum = header[0], header[5], header[9], header[10]
    if ident[:4] != b"\x7fELF":
        raise ElfError("not an ELF object (no \\x7fELF magic)")
    if ident[4] != 2 or ident[5] != 1:
        raise ElfError(f"ELF class {ident[4]} / data {ident[5]}: only 64-bit little-endian objects are read")
    programs = [_PHDR.unpack(read_at(phoff + i * phentsize, _PHDR.size)) for i in range(phnum)]
    layout_error = ""
    try:
        return _by_layout(read_at, programs, phoff + phnum * phentsize, limit)
    except (ElfError, EOFError) as exc:
        layout_error = str(exc)
    dynamic = next((p for p in programs if p[0] == _PT_DYNAMIC), None)
    if dynamic is None:
        raise ElfError(f"no PT_DYNAMIC and no .dynsym where linkers put it ({layout_error})")
    if dynamic[2] + dynamic[5] > limit:
        raise ElfError(f"PT_DYNAMIC at byte {dynamic[2]}, past the {limit >> 20} MiB read limit "
                       f"(no .dynsym where linkers put it: {layout_error})")
    return _by_dynamic(read_at, programs, dynamic)


# --- through PT_DYNAMIC ------------------------------------------------------------------------------

def _by_dynamic(read_at: ReadAt, programs: list[tuple[int, ...]], dynamic: tuple[int, ...]) -> DynamicSymbols:
    raw = read_at(dynamic[2], dynamic[5])
    tags: dict[int, int] = {}
    for tag, value in _DYN.iter_unpack(raw[: len(raw) // _DYN.size * _DYN.size]):
        if tag == _DT_NULL:
            break
        tags.setdefault(tag, value)
    if _DT_SYMTAB not in tags or _DT_STRTAB not in tags:
        raise ElfError(".dynamic has no DT_SYMTAB / DT_STRTAB")
    symtab, strtab = _file_offset(programs, tags[_DT_SYMTAB]), _file_offset(programs, tags[_DT_STRTAB])
    if _DT_GNU_HASH in tags:
        count, _ = _gnu_hash_count(read_at, _file_offset(programs, tags[_DT_GNU_HASH]))
    elif _DT_HASH in tags:
        count = struct.unpack("<II", read_at(_file_offset(programs, tags[_DT_HASH]), 8))[1]
    else:   # .dynsym ends where .dynstr starts when it precedes it
        count = (strtab - symtab) // _SYM.size if strtab > symtab else 0
    strsz = tags.get(_DT_STRSZ, 0)
    symbols = _entries(read_at(symtab, count * _SYM.size), count)
    strings = read_at(strtab, strsz)
    return _named(symbols, strings, located=".dynamic", end=strtab + strsz)


def _file_offset(programs: list[tuple[int, ...]], address: int) -> int:
    for kind, _, offset, vaddr, _, filesz, _, _ in programs:
        if kind == _PT_LOAD and vaddr <= address < vaddr + filesz:
            return address - vaddr + offset
    raise ElfError(f"address {address:#x} is in no PT_LOAD segment")


def _gnu_hash_count(read_at: ReadAt, offset: int) -> tuple[int, int]:
    """(symbols in .dynsym, first byte past the table) from a .gnu.hash at ``offset``."""
    nbuckets, symoffset, bloom_size, bloom_shift = struct.unpack("<IIII", read_at(offset, 16))
    if not (0 < nbuckets < _MAX_SYMBOLS and symoffset < _MAX_SYMBOLS and 0 < bloom_size < _MAX_SYMBOLS
            and bloom_size & (bloom_size - 1) == 0 and bloom_shift < 64):
        raise ElfError(f"no .gnu.hash header at {offset}")
    buckets_at = offset + 16 + 8 * bloom_size
    buckets = struct.unpack(f"<{nbuckets}I", read_at(buckets_at, 4 * nbuckets))
    chains_at = buckets_at + 4 * nbuckets
    last = max(buckets)
    if last == 0:
        return symoffset, chains_at
    if last < symoffset:
        raise ElfError(f".gnu.hash at {offset}: bucket {last} below its symbol offset {symoffset}")
    while True:   # the last chain ends at the entry with its low bit set
        (value,) = struct.unpack("<I", read_at(chains_at + 4 * (last - symoffset), 4))
        if value & 1:
            return last + 1, chains_at + 4 * (last + 1 - symoffset)
        last += 1
        if last > _MAX_SYMBOLS:
            raise ElfError(f".gnu.hash at {offset}: a chain that does not end")


# --- by layout ---------------------------------------------------------------------------------------

def _by_layout(read_at: ReadAt, programs: list[tuple[int, ...]], headers_end: int, limit: int) -> DynamicSymbols:
    notes_end = max([p[2] + p[5] for p in programs if p[0] == _PT_NOTE and p[2] < 65536], default=0)
    at = _align(max(headers_end, notes_end), 8)
    hashed_count: int | None = None
    located = "layout: .dynsym after the program headers and notes"
    if read_at(at, _SYM.size) != bytes(_SYM.size):   # a .gnu.hash first (GNU ld's default order)
        hashed_count, hash_end = _gnu_hash_count(read_at, at)
        at = _align(hash_end, 8)
        located = "layout: .dynsym after the .gnu.hash, its count from that hash"
        if read_at(at, _SYM.size) != bytes(_SYM.size):
            raise ElfError(f"no null symbol at {at}, after the .gnu.hash")
    count = hashed_count if hashed_count is not None else _plausible_count(read_at, at, limit)
    if count < 2:   # the null entry alone is no table (zeroed space a tool left behind looks like it)
        raise ElfError(f"no symbol entries at {at}")
    strtab = at + count * _SYM.size
    symbols = _entries(read_at(at, count * _SYM.size), count)
    if read_at(strtab, 1) != b"\0":
        raise ElfError(f"no string table right after the {count} entries at {at}")
    longest = max((s[0] for s in symbols), default=0)
    if strtab + longest > limit:
        raise ElfError(f"names past the {limit >> 20} MiB read limit")
    strings = _strings_through(read_at, strtab, longest, limit)
    if not all(_names_a_symbol(strings, name) for name, *_ in symbols[1:]):
        raise ElfError(f"the {count} entries at {at} do not name strings of the table behind them")
    return _named(symbols, strings, located=f"{located} ({count} entries at byte {at}, names checked against "
                                             "the .dynstr behind it)", end=strtab + len(strings))


def _plausible_count(read_at: ReadAt, at: int, limit: int) -> int:
    """Entries from ``at`` while they look like symbol entries (the null one first)."""
    count, block = 1, 4096
    position = at + _SYM.size
    while position < limit:
        data = read_at(position, min(block, (limit - position) // _SYM.size) * _SYM.size)
        for name, info, other, shndx, _, _ in _SYM.iter_unpack(data):
            if not (name and info & 0xF in _VALID_TYPES and info >> 4 in _VALID_BINDS and other <= 3
                    and (shndx < 0xFF00 or shndx == 0xFFF1) and name < 1 << 28):
                return count
            count += 1
        position += len(data)
        if len(data) < block * _SYM.size:
            break
    raise ElfError(f"symbol entries from {at} run past the {limit >> 20} MiB read limit")


def _strings_through(read_at: ReadAt, offset: int, last_name: int, limit: int) -> bytes:
    """The string table from ``offset`` through the end of the name starting at ``last_name``."""
    length = last_name + 256
    while True:
        try:
            data = read_at(offset, length)
        except EOFError:
            raise ElfError("the object ends inside its string table") from None
        if data.find(b"\0", last_name) >= 0:
            return data
        if offset + length >= limit:
            raise ElfError(f"names past the {limit >> 20} MiB read limit")
        length *= 2


def _names_a_symbol(strings: bytes, offset: int) -> bool:
    """Whether ``offset`` starts a non-empty printable name in the table (linkers merge common
    suffixes, so a name may start inside another one: its start needs no NUL before it)."""
    close = strings.find(b"\0", offset)
    return 0 < offset < close and all(0x21 <= c <= 0x7E for c in strings[offset:close])


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


# --- entries and names ---------------------------------------------------------------------------------

def _entries(raw: bytes, count: int) -> list[tuple[int, int, int, int, int, int]]:
    return list(_SYM.iter_unpack(raw[: count * _SYM.size]))


def _named(symbols: list[tuple[int, int, int, int, int, int]], strings: bytes, *, located: str,
           end: int) -> DynamicSymbols:
    defined: set[str] = set()
    undefined: set[str] = set()
    for name_at, info, other, shndx, _, _ in symbols:
        bind = info >> 4
        if not name_at or bind not in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE):
            continue
        close = strings.find(b"\0", name_at)
        name = strings[name_at:close if close >= 0 else len(strings)].decode("ascii", errors="replace")
        if shndx != _SHN_UNDEF:
            if other & 3 in (0, 3):   # default or protected: visible to other objects
                defined.add(name)
        elif bind == _STB_GLOBAL:
            undefined.add(name)
    return DynamicSymbols(frozenset(defined), frozenset(undefined), located, len(symbols), end)
