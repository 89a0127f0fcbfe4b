"""A CUDA driver stand-in (``libcuda.so.1``) written without a compiler, for loading only.

Compiled extensions (sgl-kernel, DeepGEMM, FlashInfer's JIT modules) link ``libcuda.so.1``, which only
a driver provides. To load them where no driver is, ``stack_imports.py`` puts the toolkit's link stub
(``$CUDA_HOME/lib64/stubs/libcuda.so``) on the loader path. An image without a compiler and without
that stub (a runtime-only flavour: CUDA wheels without nvcc) still has the driver API's header,
``cuda.h``, in its CUDA runtime wheel. From it this module writes an ELF shared object with the soname
``libcuda.so.1`` that defines every driver-API function the header names, each returning 34
(``CUDA_ERROR_STUB_LIBRARY``, as NVIDIA's own stub and ``dockerfiles/context/cuda-jit-layout.sh``'s
answer). Nothing is meant to call them: the loader only has to find each name.

The names are those ``cuda.h`` declares (``CUresult CUDAAPI cuName(``) and those its macros map them to
(``#define cuCtxCreate cuCtxCreate_v4``; ``__CUDA_API_PTDS(cuMemcpy)`` gives ``cuMemcpy`` and
``cuMemcpy_ptds``): the union a driver exports for the header's release, whichever way a module was
compiled. The build's stub takes the same names from the preprocessed header (gcc -E), once per
per-thread-stream setting.

The library is a 64-bit little-endian ``ET_DYN`` for x86-64 or AArch64: a read-only segment (ELF and
program headers, ``.hash``, ``.dynsym``, ``.dynstr``, the code) and a writable one (``.dynamic``, which
the loader relocates in place), a non-executable stack, and section headers so that ``readelf`` and
``nm -D`` read it. Standard library only (it runs inside images).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence

SONAME = "libcuda.so.1"
#: CUDA_ERROR_STUB_LIBRARY: what every function of the stand-in returns.
STUB_RESULT = 34
#: The function body, per ``platform.machine()``: return STUB_RESULT.
_RETURN_STUB = {
    "x86_64": (62, bytes([0xB8, STUB_RESULT, 0, 0, 0, 0xC3])),                    # mov eax, 34; ret
    "aarch64": (183, struct.pack("<II", 0x52800000 | (STUB_RESULT << 5), 0xD65F03C0)),  # mov w0, #34; ret
}
SUPPORTED_MACHINES = tuple(_RETURN_STUB)

_DECLARED = re.compile(r"\bCUresult\s+(?:CUDAAPI\s+)?(cu[A-Za-z0-9_]+)\s*\(")
_MAPPED = re.compile(r"^\s*#\s*define\s+(cu[A-Za-z0-9_]+)\s+(?:__CUDA_API_(PTDS|PTSZ)\s*\(\s*)?(cu[A-Za-z0-9_]+)",
                     re.MULTILINE)
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)

# ELF constants (the System V ABI's names).
_PT_LOAD, _PT_DYNAMIC, _PT_GNU_STACK = 1, 2, 0x6474E551
_PF_X, _PF_W, _PF_R = 1, 2, 4
_SHT_PROGBITS, _SHT_STRTAB, _SHT_HASH, _SHT_DYNAMIC, _SHT_DYNSYM = 1, 3, 5, 6, 11
_SHF_WRITE, _SHF_ALLOC, _SHF_EXECINSTR = 1, 2, 4
_DT_NULL, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ, _DT_SYMENT, _DT_SONAME = 0, 4, 5, 6, 10, 11, 14
_STB_GLOBAL, _STT_FUNC = 1, 2
#: The largest page size of either machine (AArch64 kernels may use 64 KiB pages): the writable segment's
#: address is its file offset plus a multiple of it, so no page is both code and data.
_MAX_PAGE = 0x10000
_EHDR, _PHDR, _SHDR, _SYM, _DYN = "<16sHHIQQQIHHHHHH", "<IIQQQQQQ", "<IIQQQQIIQQ", "<IBBHQQ", "<qQ"


def driver_api_names(header_text: str) -> tuple[str, ...]:
    """Every driver-API function name ``cuda.h``'s text declares or maps a name to, sorted; () when it
    declares none (not the driver API's header)."""
    text = _COMMENT.sub(" ", header_text)
    names = set(_DECLARED.findall(text))
    if not names:
        return ()
    for _alias, per_thread, target in _MAPPED.findall(text):
        names.add(target)
        if per_thread:
            names.add(f"{target}_{per_thread.lower()}")
    return tuple(sorted(names))


def stub_library(names: Sequence[str], machine: str, soname: str = SONAME) -> bytes:
    """The bytes of a shared object named ``soname`` that defines ``names`` as functions returning
    :data:`STUB_RESULT`, for ``machine`` (one of :data:`SUPPORTED_MACHINES`).

    Raises:
        ValueError: an unsupported machine, no names, or a name that is not a C identifier.
    """
    if machine not in _RETURN_STUB:
        raise ValueError(f"no stub code for {machine!r} (supported: {', '.join(SUPPORTED_MACHINES)})")
    if not names or any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in names):
        raise ValueError("the stub needs C identifiers to define")
    e_machine, code = _RETURN_STUB[machine]
    unique = sorted(set(names))
    dynstr, offsets = _string_table([soname, *unique])
    shstr, shnames = _string_table(["", ".hash", ".dynsym", ".dynstr", ".text", ".dynamic", ".shstrtab"])
    nsyms = len(unique) + 1
    nbucket = max(1, nsyms // 2) | 1

    phnum = 4
    hash_off = _align(struct.calcsize(_EHDR) + phnum * struct.calcsize(_PHDR), 8)
    dynsym_off = _align(hash_off + 4 * (2 + nbucket + nsyms), 8)
    dynstr_off = dynsym_off + nsyms * struct.calcsize(_SYM)
    text_off = _align(dynstr_off + len(dynstr), 16)
    text_end = text_off + len(code)
    dynamic_off = _align(text_end, 8)
    dynamic_addr = dynamic_off + _align(text_end, _MAX_PAGE)
    dyn_entries = ((_DT_HASH, hash_off), (_DT_STRTAB, dynstr_off), (_DT_SYMTAB, dynsym_off),
                   (_DT_STRSZ, len(dynstr)), (_DT_SYMENT, struct.calcsize(_SYM)), (_DT_SONAME, offsets[soname]),
                   (_DT_NULL, 0))
    dynamic = b"".join(struct.pack(_DYN, tag, value) for tag, value in dyn_entries)
    shstr_off = dynamic_off + len(dynamic)
    shoff = _align(shstr_off + len(shstr), 8)

    text_index = 4
    symbols = struct.pack(_SYM, 0, 0, 0, 0, 0, 0) + b"".join(
        struct.pack(_SYM, offsets[name], (_STB_GLOBAL << 4) | _STT_FUNC, 0, text_index, text_off, len(code))
        for name in unique)
    header = struct.pack(_EHDR, b"\x7fELF\x02\x01\x01" + bytes(9), 3, e_machine, 1, 0,
                         struct.calcsize(_EHDR), shoff, 0, struct.calcsize(_EHDR), struct.calcsize(_PHDR), phnum,
                         struct.calcsize(_SHDR), 7, 6)
    program = b"".join([
        struct.pack(_PHDR, _PT_LOAD, _PF_R | _PF_X, 0, 0, 0, text_end, text_end, _MAX_PAGE),
        struct.pack(_PHDR, _PT_LOAD, _PF_R | _PF_W, dynamic_off, dynamic_addr, dynamic_addr, len(dynamic),
                    len(dynamic), _MAX_PAGE),
        struct.pack(_PHDR, _PT_DYNAMIC, _PF_R | _PF_W, dynamic_off, dynamic_addr, dynamic_addr, len(dynamic),
                    len(dynamic), 8),
        struct.pack(_PHDR, _PT_GNU_STACK, _PF_R | _PF_W, 0, 0, 0, 0, 0, 16),
    ])
    sections = b"".join([
        bytes(struct.calcsize(_SHDR)),
        struct.pack(_SHDR, shnames[".hash"], _SHT_HASH, _SHF_ALLOC, hash_off, hash_off, 4 * (2 + nbucket + nsyms),
                    2, 0, 8, 4),
        struct.pack(_SHDR, shnames[".dynsym"], _SHT_DYNSYM, _SHF_ALLOC, dynsym_off, dynsym_off, len(symbols),
                    3, 1, 8, struct.calcsize(_SYM)),
        struct.pack(_SHDR, shnames[".dynstr"], _SHT_STRTAB, _SHF_ALLOC, dynstr_off, dynstr_off, len(dynstr),
                    0, 0, 1, 0),
        struct.pack(_SHDR, shnames[".text"], _SHT_PROGBITS, _SHF_ALLOC | _SHF_EXECINSTR, text_off, text_off,
                    len(code), 0, 0, 16, 0),
        struct.pack(_SHDR, shnames[".dynamic"], _SHT_DYNAMIC, _SHF_ALLOC | _SHF_WRITE, dynamic_addr, dynamic_off,
                    len(dynamic), 3, 0, 8, struct.calcsize(_DYN)),
        struct.pack(_SHDR, shnames[".shstrtab"], _SHT_STRTAB, 0, 0, shstr_off, len(shstr), 0, 0, 1, 0),
    ])
    image = bytearray(shoff + len(sections))
    for offset, chunk in ((0, header), (struct.calcsize(_EHDR), program),
                          (hash_off, _hash_table(unique, nbucket)), (dynsym_off, symbols), (dynstr_off, dynstr),
                          (text_off, code), (dynamic_off, dynamic), (shstr_off, shstr), (shoff, sections)):
        image[offset:offset + len(chunk)] = chunk
    return bytes(image)


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def _string_table(strings: Iterable[str]) -> tuple[bytes, dict[str, int]]:
    """(a string table: NUL, then each string NUL-terminated; each string's offset in it)."""
    table, offsets = bytearray(b"\0"), {"": 0}
    for text in strings:
        if text and text not in offsets:
            offsets[text] = len(table)
            table += text.encode("ascii") + b"\0"
    return bytes(table), offsets


def _elf_hash(name: str) -> int:
    """The System V ABI's symbol hash (``DT_HASH``)."""
    value = 0
    for byte in name.encode("ascii"):
        value = ((value << 4) + byte) & 0xFFFFFFFF
        high = value & 0xF0000000
        if high:
            value ^= high >> 24
        value &= ~high & 0xFFFFFFFF
    return value


def _hash_table(names: Sequence[str], nbucket: int) -> bytes:
    """``.hash`` for the symbols 1..len(names) (symbol 0 is the null one)."""
    nchain = len(names) + 1
    buckets, chains = [0] * nbucket, [0] * nchain
    for index, name in enumerate(names, start=1):
        slot = _elf_hash(name) % nbucket
        chains[index], buckets[slot] = buckets[slot], index
    return struct.pack(f"<II{nbucket}I{nchain}I", nbucket, nchain, *buckets, *chains)
