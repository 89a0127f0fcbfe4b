"""Facts derived for one stack from the curated tables in ``compat/tables.yaml``.

The user pins what they care about (toolkit, torch, FlashInfer, SGLang, Python); everything that
follows from those pins (which torch wheel index, which kernel package, which base image, which
driver) is derived here from data, so the Dockerfile templates and the rules see the same facts.
"""

from __future__ import annotations

import functools

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from stackforge.core.data import data_dir
from stackforge.core.errors import SpecError
from stackforge.core.model import Flavour, Stack
from stackforge.core.versions import minor_of, parse_version, validate_specifier
from stackforge.core.yamlio import LineDict, check_keys, load_file, require_mapping
from stackforge.plan.pins_file import PINS_FILE, SOURCE_REF, read_pins_file
from stackforge.plan.rules import Source, parse_source

PYTORCH_INDEX = "https://download.pytorch.org/whl"


@dataclass(frozen=True, slots=True)
class Derived:
    """Everything a stack implies.

    Attributes:
        torch_variant: torch wheel variant, e.g. ``"cu130"`` (``"cpu"`` for CPU wheels).
        torch_cuda: CUDA version of that variant (``"13.0"``), ``None`` for cpu.
        torch_index_url: the PyTorch index to install torch from, or ``None`` when PyPI's default
            variant for this torch release *is* the wanted variant (then PyPI serves).
        torch_requirement: the exact pip requirement for torch (``"torch==2.14.1"``).
        kernel_package / kernel_version: ``sgl-kernel`` or ``sglang-kernel`` and its pin.
        flashinfer_extra: extra of flashinfer-python SGLang asks for (``"cu13"``) or ``None``.
        cuda_image_version: full toolkit version for ``nvidia/cuda`` tags (``"13.1.0"``).
        base_image: the image the stack's Dockerfile starts FROM.
        base_python: python3 version the base provides.
        toolkit_wheels: exact ``nvidia-*`` wheel pins for the wheels flavour (nvcc, nvvm, crt...).
        has_nvcc: whether the image will have nvcc (devel, or wheels with CUDA >= 13).
        min_driver: the stack's driver floor: the oldest driver that runs it through CUDA
            minor-version compatibility (the higher of the toolkit's and the torch wheel's CUDA family).
        min_driver_reason: why ``min_driver`` is that version (from ``cuda_driver_floor``).
        toolkit_driver: the driver bundled with the toolkit's GA release (information only; needed just
            for features outside minor-version compatibility), or ``None`` when not tabulated.
        expected_arch_list: TORCH_CUDA_ARCH_LIST the torch variant is known to be built with.
        sglang_pins: SGLang's own pins for this release (package -> requirement), if known.
        nccl: the NCCL version the torch release pins (``torch_nccl``), or ``None`` when not tabulated.
    """

    torch_variant: str
    torch_cuda: str | None
    torch_index_url: str | None
    torch_requirement: str
    kernel_package: str | None
    kernel_version: str | None
    flashinfer_extra: str | None
    cuda_image_version: str
    base_image: str
    base_python: str | None
    toolkit_wheels: dict[str, str] = field(default_factory=dict)
    has_nvcc: bool = True
    min_driver: str | None = None
    min_driver_reason: str = ""
    toolkit_driver: str | None = None
    expected_arch_list: tuple[str, ...] = ()
    sglang_pins: dict[str, str] = field(default_factory=dict)
    nccl: str | None = None

    def to_json(self) -> dict:
        data = asdict(self)
        data["expected_arch_list"] = list(self.expected_arch_list)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Derived":
        """Inverse of :meth:`to_json`."""
        return cls(**{**data, "toolkit_wheels": dict(data.get("toolkit_wheels") or {}),
                      "expected_arch_list": tuple(data.get("expected_arch_list", ())),
                      "sglang_pins": dict(data.get("sglang_pins") or {})})


# --------------------------------------------------------------------------- tables

@dataclass(frozen=True, slots=True)
class Tables:
    """The curated tables of ``compat/tables.yaml``, parsed once."""

    torch_variant_for_toolkit: dict[str, str]
    torch_variants: tuple[tuple[SpecifierSet, tuple[str, ...], str], ...]   # (torch spec, variants, pypi default)
    torch_arch_list: tuple[tuple[SpecifierSet, str, tuple[str, ...]], ...]   # (torch spec, variant, archs)
    cuda_driver_floor: dict[str, str]          # CUDA major -> minor-version compatibility floor
    cuda_driver_floor_reason: str              # template with {major} and {floor}
    cuda_toolkit_driver: dict[str, str]        # toolkit minor -> driver bundled with its GA release
    cuda_image_tags: dict[str, str]
    os_python: dict[str, str]
    os_glibc: dict[str, str]                   # base OS -> its glibc (the platform a stack is locked for)
    sglang_pins: dict[str, dict[str, str]]     # sglang version -> pins (compat/sglang_pins.yaml, generated)
    toolkit_wheels: dict[str, dict[str, str]]  # toolkit minor -> {package: version}
    torch_nccl: dict[str, str]                 # torch version -> the NCCL version it pins
    sources: dict[str, tuple[Source, ...]]     # table name -> sources


TABLE_NAMES = ("torch_variant_for_toolkit", "torch_variants", "torch_arch_list", "cuda_driver_floor",
               "cuda_toolkit_driver", "cuda_image_tags", "os_python", "toolkit_wheels", "torch_nccl")
DEBIAN_CODENAMES = {"debian12": "bookworm", "debian13": "trixie"}


def load_tables(path: Path | None = None) -> Tables:
    """Parse ``compat/tables.yaml`` (every table must name its source), and SGLang's pins from the generated
    ``sglang_pins.yaml`` beside it (the shipped one when that folder has none)."""
    path = path or data_dir("compat") / "tables.yaml"
    pins_path = path.with_name(PINS_FILE)
    pins = read_pins_file(pins_path if pins_path.is_file() else data_dir("compat") / PINS_FILE)
    doc = require_mapping(load_file(path), what="tables file", source=str(path))
    check_keys(doc, allowed={"schema", "tables", "description"}, what="tables file", required={"schema", "tables"})
    tables = require_mapping(doc["tables"], what="tables", source=str(path))
    missing = [n for n in TABLE_NAMES if n not in tables]
    if missing:
        raise SpecError(f"tables file lacks table(s): {', '.join(missing)}", source=str(path), line=tables.line)
    parsed = {name: require_mapping(tables[name], what=f"table {name}", source=str(path)) for name in TABLE_NAMES}
    return Tables(
        torch_variant_for_toolkit=_string_map(parsed["torch_variant_for_toolkit"]),
        torch_variants=tuple((_spec(r, "torch"), tuple(str(v) for v in r["variants"]), str(r["pypi_default"]))
                             for r in _rows(parsed["torch_variants"])),
        torch_arch_list=tuple((_spec(r, "torch"), str(r["variant"]), tuple(str(r["archs"]).split(";")))
                              for r in _rows(parsed["torch_arch_list"])),
        cuda_driver_floor=_string_map(parsed["cuda_driver_floor"], extra_keys={"reason"}),
        cuda_driver_floor_reason=str(parsed["cuda_driver_floor"].get("reason", "CUDA {major}.x: driver >= {floor}")),
        cuda_toolkit_driver=_string_map(parsed["cuda_toolkit_driver"]),
        cuda_image_tags=_string_map(parsed["cuda_image_tags"]),
        os_python=_string_map(parsed["os_python"]),
        os_glibc=_string_map(require_mapping(tables["os_glibc"], what="table os_glibc", source=str(path)))
        if "os_glibc" in tables else {},
        sglang_pins=pins.by_version(),
        toolkit_wheels={str(k): {str(p): str(v) for p, v in require_mapping(m, what="toolkit wheels",
                                                                          source=str(path)).items()}
                        for k, m in _map(parsed["toolkit_wheels"]).items()},
        torch_nccl=_string_map(parsed["torch_nccl"]),
        sources={**{name: _table_sources(table) for name, table in parsed.items()},
                 **({"os_glibc": _table_sources(tables["os_glibc"])} if "os_glibc" in tables else {}),
                 "sglang_pins": (Source(ref=SOURCE_REF, confidence="verified", url="https://pypi.org/project/sglang/"),)},
    )


def _map(table: LineDict, extra_keys: frozenset[str] | set[str] = frozenset()) -> LineDict:
    check_keys(table, allowed={"source", "sources", "map", "note", *extra_keys}, what="table", required={"map"})
    return require_mapping(table["map"], what="table map", source=table.source)


def _string_map(table: LineDict, extra_keys: frozenset[str] | set[str] = frozenset()) -> dict[str, str]:
    return {str(k): str(v) for k, v in _map(table, extra_keys).items()}


def _rows(table: LineDict) -> list[LineDict]:
    check_keys(table, allowed={"source", "sources", "rows", "note"}, what="table", required={"rows"})
    return [require_mapping(r, what="table row", source=table.source) for r in table["rows"]]


def _spec(row: LineDict, key: str) -> SpecifierSet:
    return validate_specifier(row[key], what=key, source=row.source, line=row.line_of(key))


def _table_sources(table: LineDict) -> tuple[Source, ...]:
    raw = table.get("sources", table.get("source"))
    if raw is None:
        raise SpecError("every table needs a source", source=table.source, line=table.line)
    items = raw if isinstance(raw, list) else [raw]
    return tuple(parse_source(require_mapping(i, what="source", source=table.source)) for i in items)


# --------------------------------------------------------------------------- derivation

def derive(stack: Stack, tables: Tables) -> Derived:
    """Everything ``stack`` implies, from the tables. Unknown toolkit or OS versions raise SpecError."""
    cuda_minor = minor_of(stack.cuda)
    variant = stack.torch_variant or _lookup(tables.torch_variant_for_toolkit, cuda_minor, "CUDA toolkit",
                                             "torch_variant_for_toolkit")
    pins = tables.sglang_pins.get(stack.sglang, {})
    torch_cuda = variant_cuda(variant)
    floor, floor_reason = driver_floor_for(stack.cuda, torch_cuda, tables)
    return Derived(
        torch_variant=variant,
        torch_cuda=torch_cuda,
        torch_index_url=_torch_index(stack.torch, variant, tables),
        torch_requirement=f"torch=={stack.torch}",
        kernel_package=pins.get("kernel_package"),
        kernel_version=stack.kernel or pins.get("kernel"),
        flashinfer_extra=pins.get("flashinfer_extra"),
        cuda_image_version=_cuda_image_version(stack.cuda, tables),
        base_image=base_image_for(stack, tables),
        base_python=tables.os_python.get(stack.os),
        toolkit_wheels=dict(tables.toolkit_wheels.get(cuda_minor, {})) if stack.flavour is Flavour.WHEELS else {},
        has_nvcc=_has_nvcc(stack),
        min_driver=floor,
        min_driver_reason=floor_reason,
        toolkit_driver=tables.cuda_toolkit_driver.get(cuda_minor),
        expected_arch_list=_arch_list(stack.torch, variant, tables),
        sglang_pins=pins,
        nccl=tables.torch_nccl.get(stack.torch),
    )


def driver_floor_for(cuda: str, torch_cuda: str | None, tables: Tables) -> tuple[str | None, str]:
    """The minor-version compatibility floor of the newest CUDA family the stack carries, and why."""
    majors = sorted({parse_version(v).major for v in (cuda, torch_cuda) if v}, reverse=True)
    for major in majors:
        floor = tables.cuda_driver_floor.get(str(major))
        if floor is not None:
            what = f"toolkit {cuda}" + (f", torch wheel CUDA {torch_cuda}" if torch_cuda else "")
            reason = tables.cuda_driver_floor_reason.format(major=major, floor=floor)
            return floor, f"{reason} ({what})"
    return None, ""


@dataclass(frozen=True, slots=True)
class DriverFloor:
    """The one driver floor of a stack on a target: the highest of its parts, with every reason."""

    version: str | None
    because: tuple[str, ...]

    def text(self) -> str:
        return f">= {self.version}" if self.version else "unknown"

    def to_json(self) -> dict:
        return {"version": self.version, "because": list(self.because)}


def combine_driver_floor(parts: Iterable[tuple[str | None, str]]) -> DriverFloor:
    """The highest version among ``(version, reason)`` parts, with every reason (those that reach it first).

    The plan (text, JSON) and ``pick`` both call this, so the floor they show and enforce is the same.
    """
    known = [(v, r) for v, r in parts if v and _is_version(v)]
    if not known:
        return DriverFloor(None, ())
    top = max(Version(v) for v, _ in known)
    reaching = [f"{r} [>= {v}]" for v, r in known if Version(v) == top]
    others = [f"{r} [>= {v}]" for v, r in known if Version(v) != top]
    best = next(v for v, _ in known if Version(v) == top)
    return DriverFloor(best, tuple(reaching + others))


@functools.lru_cache(maxsize=4096)
def cell_driver_floor(stack_floor: str | None, stack_reason: str, target: str, target_min: str | None,
                      requires: tuple[tuple[str, str], ...]) -> DriverFloor:
    """A stack's floor on a target: its CUDA family's, the target's ``min_driver``, ``requires`` rules.

    Pure, and asked the same question for most cells of a matrix (a few CUDA families, a few targets), so its
    answers are remembered: version parsing was a fifth of planning a large matrix."""
    parts = [(stack_floor, stack_reason or "CUDA minor-version compatibility"),
             (target_min, f"target {target} hardware (min_driver)")]
    parts += [(spec_lower_bound(spec), f"rule {rule}") for rule, spec in requires]
    return combine_driver_floor(parts)


def spec_lower_bound(spec: str) -> str | None:
    """``">=570"`` -> ``"570"``: the lower bound a ``requires: driver`` specifier sets, if any."""
    try:
        specifiers = SpecifierSet(spec)
    except InvalidSpecifier:
        return None    # plan JSON from elsewhere: an odd specifier sets no floor (pick still checks it)
    bounds = [s.version for s in specifiers if s.operator in (">=", "==", "~=") and _is_version(s.version)]
    return max(bounds, key=Version) if bounds else None


def _is_version(text: str) -> bool:
    try:
        Version(str(text))
    except InvalidVersion:
        return False
    return True


def variant_cuda(variant: str) -> str | None:
    """``"cu130"`` -> ``"13.0"``; ``"cpu"`` -> ``None``."""
    if not variant.startswith("cu") or not variant[2:].isdigit() or len(variant) < 5:
        return None
    digits = variant[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def _lookup(table: dict[str, str], key: str, what: str, name: str) -> str:
    if key not in table:
        raise SpecError(f"{what} {key} is not in compat/tables.yaml {name}; known: {', '.join(sorted(table))}",
                        remedy="add it to compat/tables.yaml with a source, or pick a known version")
    return table[key]


def _torch_row(torch: str, tables: Tables) -> tuple[tuple[str, ...], str] | None:
    version = parse_version(torch)
    for spec, variants, default in tables.torch_variants:
        if spec.contains(version, prereleases=True):
            return variants, default
    return None


def _torch_index(torch: str, variant: str, tables: Tables) -> str | None:
    """PyPI serves when its default variant for this release is the wanted one; else the PyTorch index."""
    row = _torch_row(torch, tables)
    if row is not None and row[1] == variant:
        return None
    return f"{PYTORCH_INDEX}/{variant}"


def _arch_list(torch: str, variant: str, tables: Tables) -> tuple[str, ...]:
    version = parse_version(torch)
    for spec, row_variant, archs in tables.torch_arch_list:
        if row_variant == variant and spec.contains(version, prereleases=True):
            return archs
    return ()


def _cuda_image_version(cuda: str, tables: Tables) -> str:
    if len(parse_version(cuda).release) >= 3:
        return cuda
    return _lookup(tables.cuda_image_tags, minor_of(cuda), "CUDA toolkit", "cuda_image_tags")


def _has_nvcc(stack: Stack) -> bool:
    # 13.x toolkit wheels ship nvcc under nvidia/cu13/bin; 12.x wheels ship only ptxas (the wheel
    # file lists cited by compat/rules/cuda.yaml no-nvcc-no-codegen).
    if stack.flavour is Flavour.WHEELS:
        return parse_version(stack.cuda).major >= 13
    return stack.flavour is Flavour.DEVEL


def base_image_for(stack: Stack, tables: Tables) -> str:
    """The FROM image: official nvidia/cuda for devel/runtime, official slim Python for wheels."""
    if stack.flavour is Flavour.WHEELS:
        codename = DEBIAN_CODENAMES.get(stack.os)
        if codename is None:
            raise SpecError(f"stack {stack.id}: flavour 'wheels' builds on a Debian base; os must be one of "
                            f"{', '.join(DEBIAN_CODENAMES)}, not {stack.os!r}")
        return f"python:{stack.python}-slim-{codename}"
    return f"nvidia/cuda:{_cuda_image_version(stack.cuda, tables)}-{stack.flavour.value}-{stack.os}"
