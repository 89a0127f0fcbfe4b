"""Gate probe ``kernel-arch-coverage``: which archs do the prebuilt kernel libraries carry?

Looks for the kernel packages in site-packages (``sgl_kernel`` / ``sglang_kernel``,
``flashinfer_cubin``, ``flashinfer_jit_cache``, plus ``--package`` / ``--path``) and lists the
device code in each shared object, cubin or fatbin: SASS archs (``sm_120a``) and PTX
(``compute_90``). With ``cuobjdump`` in the image that is ``cuobjdump --list-elf --list-ptx``;
otherwise (or with ``--method parse``) the files are read directly, standard library only:

- ELF shared objects keep their device code in the ``.nv_fatbin`` section: a sequence of fatbin
  containers (header: magic 0xBA55ED50, u16 version, u16 header size, u64 payload size), each a
  sequence of entries (u16 kind 1=PTX 2=ELF, u16, u32 header size, u64 payload size, ..., u32 arch
  at +28, u64 flags at +40). In those flags 0x100000 marks arch-specific (``a``) and 0x200000
  family (``f``) code; entries may be compressed, the header is not. The parser is ``_sffatbin.py``,
  shared with the wheel tier's binary readers (which read the same containers by HTTP ranges).
- A bare cubin is an NVIDIA ELF (e_machine 190); its SM is in e_flags (bits 8..15 from ELF ABI
  version 8 on, the low byte before), the ``a``/``f`` suffix in ptxas' ``-arch`` note.

A package covers the target when at least one of its files has SASS that runs on it (same major,
minor <= target; ``a`` only on its own arch) or PTX that JIT-compiles to it. Only the kernels the
target would use are judged: a kernel family its project builds and dispatches for other
architectures only (:data:`ARCH_SCOPED_KERNELS`, e.g. FlashInfer's trtllm-gen cubins, SM10x only) is
listed as excluded, with why and the public source, and its missing code is no gap. No GPU needed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import struct
import sys
from collections import Counter
from collections.abc import Iterator, Sequence

import _sfprobe as sf
from _sffatbin import FATBIN_MAGIC_BYTES, code_sort_key, covers, entry_code, fatbin_entries, file_read_at
from _sffatbin import split_codes as split_sass_ptx

DEFAULT_PACKAGES = ("sgl_kernel", "sglang_kernel", "flashinfer_cubin", "flashinfer_jit_cache")
EM_CUDA = 190
DEVICE_SUFFIXES = (".so", ".cubin", ".fatbin")
#: Files without code for the target, named: in the reason (a line a person reads), in the evidence, in the
#: metrics (with the total beside them). A wheel of arch-specific cubins can lack it in hundreds of files.
REASON_FILES, EVIDENCE_FILES, NOT_COVERING_LISTED = 3, 12, 100


@dataclasses.dataclass(frozen=True, slots=True)
class KernelFamily:
    """Prebuilt kernels of one package that their project builds, and dispatches to, only on GPUs of
    some compute-capability majors: on any other target they are never loaded."""

    package: str             # the package directory (site-packages/<package>)
    name: str
    path: str                # regular expression on the file's path inside the package
    majors: tuple[int, ...]  # the compute-capability majors the kernels are built for
    why: str
    source: str

    def excludes(self, package: str, relative: str, target: sf.Arch) -> bool:
        return (package == self.package and target.major not in self.majors
                and re.search(self.path, relative.replace(os.sep, "/")) is not None)


_FI = "flashinfer-python 0.7.2 wheel, flashinfer/"
#: What the public wheels were read for, printed once under the exclusions.
SCOPED_KERNELS_CHECKED = ("flashinfer-cubin 0.6.13 wheel: 15,653 of its 15,970 cubins (fmha/trtllm-gen, batched_gemm-*, "
                          "gemm-*) are named Sm100a / Sm100f / Sm103a / sm100f / sm103a, the other 317 (deep-gemm) "
                          "all read as sm_100f; fmha/cute-dsl holds only the checksums of sm_100a, sm_103a, sm_110a")
#: Kernel families built for some architectures only, by design (not a coverage gap elsewhere).
ARCH_SCOPED_KERNELS = (
    KernelFamily("flashinfer_cubin", "trtllm-gen FMHA", r"(^|/)fmha/trtllm-gen/", (10,),
                 "TensorRT-LLM-gen attention kernels, published for Blackwell SM10x only (Sm100a/Sm100f/Sm103a, "
                 "Rubin Sm107a)",
                 f"{_FI}artifacts.py:141-142, {_FI}jit/trtllm_gen_metainfo.py:46-48 (BLACKWELL_CUBIN_ARCHS), "
                 f"{_FI}mla/_batch_mla/_backends/trtllm_gen_backend.py:173-178 ('trtllm-gen MLA requires "
                 "SM100/SM103/SM107')"),
    KernelFamily("flashinfer_cubin", "trtllm-gen batched GEMM (fused MoE)", r"(^|/)batched_gemm-[^/]*/", (10,),
                 "TensorRT-LLM-gen batched-GEMM kernels of the trtllm-gen fused MoE, SM10x only",
                 f"{_FI}artifacts.py:141-142, {_FI}jit/fused_moe.py:378-381 (the module's kernel list is "
                 f"filtered to BLACKWELL_CUBIN_ARCHS, {_FI}jit/trtllm_gen_metainfo.py:46-48)"),
    KernelFamily("flashinfer_cubin", "trtllm-gen GEMM", r"(^|/)gemm-[^/]*/", (10,),
                 "TensorRT-LLM-gen GEMM kernels, SM10x only",
                 f"{_FI}artifacts.py:141-142, {_FI}jit/gemm/core.py:722-725 (the trtllm-gen GEMM runner "
                 "targets supported_major_versions=[10])"),
    KernelFamily("flashinfer_cubin", "DeepGEMM", r"(^|/)deep-gemm/", (10,),
                 "DeepGEMM's SM100 FP8 grouped GEMMs (SM100FP8GemmRuntime)",
                 f"{_FI}deep_gemm.py:1382 and :1489 (@supported_compute_capability([100, 103, 107]))"),
    KernelFamily("flashinfer_cubin", "CuTe-DSL FMHA", r"(^|/)fmha/cute-dsl/", (10, 11),
                 "CuTe-DSL attention kernels published per arch for sm_100a/sm_103a/sm_107a/sm_110a only",
                 f"{_FI}artifacts.py:154-159 (DSL_FMHA_ARCHS)"),
)


@dataclasses.dataclass(frozen=True, slots=True)
class KernelFile:
    """A shared object whose absence of code for a target costs something a user picks by name."""

    package: str
    path: str                # regular expression on the file's path inside the package
    what: str                # the kernels it holds, and what cannot run without them
    source: str

    def matches(self, package: str, relative: str) -> bool:
        return package == self.package and re.search(self.path, relative.replace(os.sep, "/")) is not None


_SK = "sglang-kernel 0.4.2 wheel, sgl_kernel/"
_SG = "sglang 0.5.23 wheel, sglang/srt/layers/attention/"
#: What the files that may lack code for a target hold: named in the reason when they do. Read with this
#: script's parser in the PyPI wheels: flash_ops carries sm_80 sm_86 sm_90a (sgl-kernel 0.3.21, sglang-kernel
#: 0.4.2 and 0.4.10), flashmla_ops sm_90a sm_100a (0.3.21), + sm_103a (0.4.2), sm_100f sm_103a (0.4.10): no sm_12x.
KNOWN_KERNEL_FILES = (
    KernelFile("sgl_kernel", r"(^|/)flash_ops[^/]*\.so$",
               "FlashAttention 3: SGLang's fa3 attention backend (which SGLang itself admits only on SM80/SM90)",
               f"{_SK}flash_attn.py:8 (from sgl_kernel import flash_ops); {_SG}attention_registry.py:241-245 "
               "('FlashAttention v3 Backend requires SM>=80 and SM<=90')"),
    KernelFile("sgl_kernel", r"(^|/)flashmla_ops[^/]*\.so$", "FlashMLA: SGLang's flashmla attention backend",
               f"{_SK}flash_mla.py:6 (from sgl_kernel import flashmla_ops); {_SG}attention_registry.py:231-235"),
)


def known_file(package: str, relative: str) -> str:
    """What a kernel file holds, when :data:`KNOWN_KERNEL_FILES` knows it (else ``""``)."""
    found = next((k for k in KNOWN_KERNEL_FILES if k.matches(package, relative)), None)
    return f"{found.what} (source: {found.source})" if found else ""


@dataclasses.dataclass(frozen=True, slots=True)
class FileCode:
    """Device code found in one file."""

    path: str
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    error: str = ""

    @property
    def has_code(self) -> bool:
        return bool(self.sass or self.ptx)


# --------------------------------------------------------------------------------------------
# ELF and fatbin parsing
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class Elf:
    """The parts of an ELF header this probe needs."""

    little: bool
    is64: bool
    abi_version: int
    machine: int
    flags: int
    sections: tuple[tuple[str, int, int], ...]  # (name, file offset, size)


def read_elf(handle) -> Elf | None:
    """Parse the ELF header and section table; None if the file is not ELF."""
    handle.seek(0)
    ident = handle.read(64)
    if len(ident) < 52 or ident[:4] != b"\x7fELF":
        return None
    is64, little = ident[4] == 2, ident[5] == 1
    order = "<" if little else ">"
    machine = struct.unpack_from(order + "H", ident, 18)[0]
    if is64:
        shoff, flags = struct.unpack_from(order + "Q", ident, 40)[0], struct.unpack_from(order + "I", ident, 48)[0]
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", ident, 58)
    else:
        shoff, flags = struct.unpack_from(order + "I", ident, 32)[0], struct.unpack_from(order + "I", ident, 36)[0]
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", ident, 46)
    raw = []
    if shoff and shnum and shentsize:
        handle.seek(shoff)
        table = handle.read(shentsize * shnum)
        for index in range(len(table) // shentsize):
            entry = table[index * shentsize:(index + 1) * shentsize]
            if is64:
                name, _, _, _, offset, size = struct.unpack_from(order + "IIQQQQ", entry, 0)
            else:
                name, _, _, _, offset, size = struct.unpack_from(order + "IIIIII", entry, 0)
            raw.append((name, offset, size))
    sections = []
    if raw and shstrndx < len(raw):
        _, str_offset, str_size = raw[shstrndx]
        handle.seek(str_offset)
        names = handle.read(str_size)
        for name_offset, offset, size in raw:
            end = names.find(b"\0", name_offset)
            sections.append((names[name_offset:end if end >= 0 else None].decode("ascii", "replace"), offset, size))
    return Elf(little, is64, ident[8], machine, flags, tuple(sections))


def cubin_code(handle, elf: Elf) -> str:
    """``sm_120a`` for a bare cubin (SM from e_flags, suffix from ptxas' -arch note)."""
    sm = (elf.flags >> 8) & 0xFF if elf.abi_version >= 8 else elf.flags & 0xFF
    suffix = ""
    for name, offset, size in elf.sections:
        if name == ".note.nv.tkinfo" and size < 1 << 16:
            handle.seek(offset)
            match = re.search(rb"-arch[ =]sm_(\d+)([af]?)", handle.read(size))
            if match and int(match.group(1)) == sm:
                suffix = match.group(2).decode()
    return f"sm_{sm}{suffix}"


def parse_file(path: str) -> FileCode:
    """Device code of one file by reading it directly."""
    codes: list[str] = []
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
            if head == FATBIN_MAGIC_BYTES:
                size = os.fstat(handle.fileno()).st_size
                codes = [entry_code(*e) for e in fatbin_entries(file_read_at(handle), 0, size)]
            else:
                elf = read_elf(handle)
                if elf is not None and elf.machine == EM_CUDA:
                    codes = [cubin_code(handle, elf)]
                elif elf is not None:
                    for name, offset, size in elf.sections:
                        if name in (".nv_fatbin", "__nv_relfatbin"):
                            codes += [entry_code(*e) for e in fatbin_entries(file_read_at(handle), offset,
                                                                             offset + size)]
    except (OSError, struct.error) as exc:
        return FileCode(path, (), (), sf.describe_exception(exc))
    return split_codes(path, codes)


def split_codes(path: str, codes: Sequence[str]) -> FileCode:
    return FileCode(path, *split_sass_ptx(codes))


def cuobjdump_file(cuobjdump: str, path: str) -> FileCode:
    """Device code of one file via ``cuobjdump --list-elf --list-ptx``."""
    result = sf.run_command([cuobjdump, "--list-elf", "--list-ptx", path], 120)
    text = result.output
    if result.timed_out:
        return FileCode(path, (), (), "cuobjdump timed out")
    codes = []
    for line in text.splitlines():
        match = re.match(r"\s*(ELF|PTX) file\s+\d+:\s*\S*?\.(sm_\d+[af]?)\.(cubin|ptx)\s*$", line)
        if match:
            code = match.group(2)
            codes.append(code if match.group(1) == "ELF" else code.replace("sm_", "compute_"))
    if not codes and not result.ok and "does not contain device code" not in text:
        return FileCode(path, (), (), sf.one_line(text)[:300])
    return split_codes(path, codes)


# --------------------------------------------------------------------------------------------
# Discovery and decision
# --------------------------------------------------------------------------------------------

def device_files(root: str) -> list[str]:
    """Candidate files under a package (or a single file)."""
    if os.path.isfile(root):
        return [root]
    files = []
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(DEVICE_SUFFIXES) or ".so." in name:
                files.append(os.path.join(directory, name))
    return sorted(files)


def relative_path(path: str, root: str) -> str:
    return os.path.relpath(path, root) if os.path.isdir(root) else os.path.basename(path)


def split_scoped(name: str, root: str, files: Sequence[str], target: sf.Arch,
                 families: Sequence[KernelFamily] = ARCH_SCOPED_KERNELS
                 ) -> tuple[list[str], dict[KernelFamily, list[str]]]:
    """(files the target would use, {family: files excluded because the family is not for the target})."""
    judged: list[str] = []
    excluded: dict[KernelFamily, list[str]] = {}
    for path in files:
        family = next((f for f in families if f.excludes(name, relative_path(path, root), target)), None)
        if family is None:
            judged.append(path)
        else:
            excluded.setdefault(family, []).append(path)
    return judged, excluded


def exclusion_lines(excluded: dict[KernelFamily, list[str]], target: sf.Arch) -> list[str]:
    lines = [f"  excluded, not used on {target.sm_name}: {family.name}, {len(paths)} files (built for compute "
             f"capability {'/'.join(f'{m}.x' for m in family.majors)} only: {family.why}; source: {family.source})"
             for family, paths in excluded.items()]
    return lines + [f"  (checked: {SCOPED_KERNELS_CHECKED})"] if lines else []


def summarize(name: str, root: str, results: Sequence[FileCode], target: sf.Arch,
              excluded: dict[KernelFamily, list[str]] | None = None,
              list_limit: int = EVIDENCE_FILES) -> tuple[str, dict[str, object]]:
    """One evidence block and one metrics entry for a package (``results``: the files judged)."""
    excluded = excluded or {}
    with_code = [r for r in results if r.has_code]
    covering = [r for r in with_code if any(covers(c, target) for c in (*r.sass, *r.ptx))]
    histogram = Counter(c for r in with_code for c in (*r.sass, *r.ptx))
    lines = [f"{name} ({root}): {len(covering)}/{len(with_code)} judged files with device code cover "
             f"{target.sm_name}"]
    # The files whose cost is known (the FA3 backend...) first: the reason names only the first few.
    missing = sorted((relative_path(r.path, root) for r in with_code if r not in covering),
                     key=lambda rel: not known_file(name, rel))
    lines += [f"  no code for {target.sm_name}: {rel}" + (f": {known_file(name, rel)}" if known_file(name, rel) else "")
              for rel in missing[:list_limit]]
    if len(missing) > list_limit:
        lines.append(f"  ... and {len(missing) - list_limit} more files with no code for {target.sm_name}")
    lines += exclusion_lines(excluded, target)
    for result in with_code[:list_limit]:
        rel = relative_path(result.path, root)
        ptx = f" ptx: {' '.join(result.ptx)}" if result.ptx else ""
        lines.append(f"  {rel}: {' '.join(result.sass) or '-'}{ptx}")
    if len(with_code) > list_limit:
        lines.append(f"  ... {len(with_code) - list_limit} more; archs over all files: "
                     + ", ".join(f"{c} x{n}" for c, n in sorted(histogram.items(), key=lambda i: code_sort_key(i[0]))))
    errors = [r for r in results if r.error]
    if errors:
        lines.append(f"  unreadable: {len(errors)} (first: {errors[0].path}: {errors[0].error})")
    metrics = {"files": len(results), "files_with_device_code": len(with_code), "covering": len(covering),
               "not_covering": missing[:NOT_COVERING_LISTED], "not_covering_total": len(missing),
               "archs": dict(sorted(histogram.items(), key=lambda i: code_sort_key(i[0]))),
               "excluded": {family.name: len(paths) for family, paths in excluded.items()}}
    return "\n".join(lines), metrics


def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--package", action="append", default=[], help="another package directory name to scan")
    parser.add_argument("--path", action="append", default=[], help="a file or directory to scan as well")
    parser.add_argument("--method", choices=("auto", "cuobjdump", "parse"), default="auto")
    parser.add_argument("--cuobjdump", default="", help="cuobjdump to use (default: PATH, next to nvcc)")
    args = parser.parse_args(argv)
    target = args.arch
    facts = sf.collect_facts()
    roots = sf.package_dirs((*DEFAULT_PACKAGES, *args.package))
    roots.update({os.path.basename(p.rstrip("/")) or p: p for p in args.path})
    if not roots:
        sf.emit("skip", f"no kernel packages ({', '.join(DEFAULT_PACKAGES)}) in this image's site-packages",
                evidence="searched: " + ", ".join(sf.site_packages_dirs()), facts=facts)
    cuobjdump = find_cuobjdump(args.cuobjdump) if args.method != "parse" else ""
    if args.method == "cuobjdump" and not cuobjdump:
        sf.emit("error", "--method cuobjdump but no cuobjdump in this image", facts=facts)
    read = (lambda path: cuobjdump_file(cuobjdump, path)) if cuobjdump else parse_file
    blocks, per_package, uncovered, not_judged = [], {}, [], []
    for name, root in sorted(roots.items()):
        judged, excluded = split_scoped(name, root, device_files(root), target)
        evidence, metrics = summarize(name, root, [read(p) for p in judged], target, excluded)
        blocks.append(evidence)
        per_package[name] = metrics
        if metrics["files_with_device_code"] and not metrics["covering"]:
            uncovered.append(f"{name} ({', '.join(metrics['archs'])})")
        if excluded:
            not_judged.append(f"{name}: {', '.join(f'{f.name} ({len(p)} files)' for f, p in excluded.items())}")
    method = f"cuobjdump ({cuobjdump})" if cuobjdump else "ELF/fatbin parser"
    metrics = {"method": method, "packages": per_package}
    evidence = "\n".join(blocks)
    with_code = [n for n, m in per_package.items() if m["files_with_device_code"]]
    excluded_text = (f"; not judged, built for other GPUs by design: {'; '.join(not_judged)}" if not_judged else "")
    if not with_code and not_judged:
        sf.emit("skip", f"no kernel that {target.sm_name} would use in {', '.join(roots)}{excluded_text}",
                evidence, metrics, facts)
    if not with_code:
        sf.emit("skip", f"kernel packages found ({', '.join(roots)}) but no device code in them", evidence,
                metrics, facts)
    if uncovered:
        sf.emit("fail", f"no code for {target.sm_name} in {'; '.join(uncovered)}{excluded_text}", evidence,
                metrics, facts)
    sf.emit("pass", f"{', '.join(with_code)} carry code for {target.sm_name} ("
            + "; ".join(f"{n}: {per_package[n]['covering']}/{per_package[n]['files_with_device_code']} files"
                        for n in with_code) + f"; read by {method}){missing_text(per_package, target)}{excluded_text}",
            evidence, metrics, facts)


def missing_text(per_package: dict[str, dict[str, object]], target: sf.Arch) -> str:
    """``; no code for sm_120 in sgl_kernel/flash_ops.abi3.so (FlashAttention 3: ...)``: what the files that
    lack it cost, so that a pass of the package never hides them."""
    parts = []
    for name, metrics in per_package.items():
        for rel in metrics["not_covering"][:REASON_FILES]:
            what = known_file(name, rel)
            parts.append(f"{name}/{rel}" + (f" ({what.split(' (source:')[0]})" if what else ""))
        more = metrics["not_covering_total"] - min(len(metrics["not_covering"]), REASON_FILES)
        if more > 0:
            parts.append(f"{more} more {name} files (the evidence lists the first {EVIDENCE_FILES})")
    return f"; no code for {target.sm_name} in {', '.join(parts)}" if parts else ""


def find_cuobjdump(explicit: str) -> str:
    """cuobjdump from --cuobjdump, PATH, or next to an nvcc the image has."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else ""
    on_path = shutil.which("cuobjdump")
    if on_path:
        return on_path
    for nvcc in sf.nvcc_candidates():
        candidate = os.path.join(os.path.dirname(nvcc), "cuobjdump")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return ""


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
