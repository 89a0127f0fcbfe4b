"""Plan cells for external images (``probe --image``): the rules judge an image a team already runs, as they
judge a matrix stack, from what the image was read to have.

An external image is no matrix stack: its records carry ``stack.external`` and the versions read in it (torch,
its CUDA, FlashInfer, SGLang, the kernel package, nvcc, Python, OS). From those this module makes the
:class:`~stackforge.core.model.Stack` the rules see and overrides what :func:`~stackforge.plan.derive.derive`
would assume with what the image holds (nvcc or not, torch's CUDA, the kernel package), so a rule's ``when``
reads the image, not a guess. The cell keeps the image's own stack id (``image-<name>-<id>``).

An image the rules cannot judge (no torch, no CUDA, a version the tables do not know) gets no cell: its row
stays "unplanned", and :func:`external_plan_cells` says why in a note.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from packaging.version import InvalidVersion, Version

from stackforge.core.errors import SpecError
from stackforge.core.model import DEFAULT_OS, Flavour, Stack, Target
from stackforge.plan.derive import derive

__all__ = ["ExternalCells", "external_plan_cells", "external_stack"]


@dataclass(frozen=True, slots=True)
class ExternalCells:
    """The plan cells made for external images, and one note per image the rules could not judge."""

    cells: tuple[Any, ...]        # PlanCell (planner imports this module's caller, not the other way round)
    notes: tuple[str, ...]


def external_stack(stack: Mapping[str, Any]) -> tuple[Stack, dict[str, Any]] | str:
    """The Stack the rules see for an external image's record ``stack``, and the facts that override its
    derivation; or why the rules cannot judge it."""
    derived = stack.get("derived") if isinstance(stack.get("derived"), Mapping) else {}
    missing = [axis for axis in ("cuda", "torch", "flashinfer", "sglang", "python") if not stack.get(axis)]
    if missing:
        return f"the image has no {', '.join(missing)} the rules could read"
    torch = str(stack["torch"])
    try:
        public, local = Version(torch).public, Version(torch).local
        for axis in ("cuda", "flashinfer", "sglang", "python"):
            Version(str(stack[axis]))
    except InvalidVersion as exc:
        return f"a version the rules cannot compare ({exc})"
    has_nvcc = bool(derived.get("has_nvcc"))
    kernel = stack.get("kernel")
    model = Stack(cuda=_minor(str(stack["cuda"])), torch=public, flashinfer=str(stack["flashinfer"]),
                  sglang=str(stack["sglang"]), python=str(stack["python"]),
                  flavour=Flavour.DEVEL if has_nvcc else Flavour.RUNTIME, os=str(stack.get("os") or DEFAULT_OS),
                  torch_variant=local if local and local.startswith("cu") else None,
                  kernel=str(kernel) if kernel else None)
    overrides = {"has_nvcc": has_nvcc, "torch_cuda": derived.get("torch_cuda"),
                 "kernel_package": derived.get("kernel_package"), "kernel_version": derived.get("kernel_version")}
    return model, overrides


def external_plan_cells(stacks: Mapping[str, Mapping[str, Any]], targets: Iterable[Target],
                        knowledge: Any) -> ExternalCells:
    """One plan cell per external image (stack id -> its records' ``stack``) and target."""
    from stackforge.plan.planner import evaluate_cell

    cells, notes = [], []
    chosen = tuple(targets)
    for stack_id, stack in sorted(stacks.items()):
        made = external_stack(stack)
        if isinstance(made, str):
            notes.append(f"{stack_id}: no predictions ({made})")
            continue
        model, overrides = made
        # The tables know the OSes stackforge builds on; an image's own OS only changes its base image, which
        # an external image already has, so a known OS stands in for the derivation.
        known_os = model.os in knowledge.tables.os_python
        try:
            derived = derive(model if known_os else replace(model, os=DEFAULT_OS), knowledge.tables)
        except SpecError as exc:
            notes.append(f"{stack_id}: no predictions ({exc.one_line()})")
            continue
        # What the image holds, absences included: an image without a kernel package has none, whatever
        # SGLang's pins would have installed.
        derived = replace(derived, **overrides)
        cells.extend(replace(evaluate_cell(model, target, knowledge, derived=derived), external_id=stack_id)
                     for target in chosen)
    return ExternalCells(cells=tuple(cells), notes=tuple(notes))


def _minor(version: str) -> str:
    """``13.1.0`` -> ``13.1`` (the toolkit minor the tables are keyed by)."""
    return ".".join(version.split(".")[:2])
