"""Human-readable text for plans (pure functions returning strings)."""

from __future__ import annotations

from stackforge.core.data import display_path
from stackforge.core.model import Stack
from stackforge.core.records import Verdict
from stackforge.core.textfit import fit_table, wrap_line, wrap_text
from stackforge.plan.planner import Plan, PlanCell


def _torch_source(cell: PlanCell) -> str:
    derived = cell.derived
    return f"{derived.torch_index_url} ({derived.torch_variant})" if derived.torch_index_url else \
        f"PyPI ({derived.torch_variant})"


def _dead_ends(cell: PlanCell) -> str:
    groups = []
    for verdict, word in ((Verdict.UNAVAILABLE, "unavailable"), (Verdict.HAZARD, "hazard")):
        features = [p.feature for p in cell.predictions if p.verdict is verdict]
        if features:
            groups.append(f"{word}: {', '.join(features)}")
    return "; ".join(groups) or "-"


def plan_table(plan: Plan, width: int | None = None) -> str:
    """The plan as tables: kept cells (with predicted dead ends), pruned cells (with rule, reason, source).

    ``width`` is the terminal's: cells wrap (stack ids stay whole); ``None`` keeps every row on one line.
    Nothing is cut off either way.
    """
    kept = [c for c in plan.cells if not c.pruned]
    pruned = [c for c in plan.cells if c.pruned]
    targets = ", ".join(f"{t.name} ({t.sm}, {t.gpu_count}x {t.interconnect.value})" for t in plan.targets)
    lines = [*wrap_line(f"matrix {plan.matrix.name} ({display_path(plan.matrix.source)}): {len(plan.cells)} "
                        f"cell(s) for {targets}", width),
             f"  {len(kept)} kept, {len(pruned)} pruned by rules, {plan.matrix.excluded} excluded by the matrix file",
             "", *wrap_line("KEPT (predicted: features rules say are unavailable or a hazard; predictions come from "
                            "rules, not measurements; driver: the minimum driver, --explain says why)", width)]
    lines += fit_table([[c.stack.id, c.target.name, c.derived.base_image, _torch_source(c),
                         c.driver_floor.text(), _dead_ends(c)] for c in kept]
                       or [["(none)", "", "", "", "", ""]],
                       ["stack", "target", "base image", "torch from", "driver", "predicted"], width)
    if pruned:
        lines += ["", *wrap_line("PRUNED (first rule shown; --explain STACK_ID lists all)", width)]
        lines += fit_table([_pruned_row(c) for c in pruned], ["stack", "target", "rule", "reason", "source"], width)
    return "\n".join(lines)


def _pruned_row(cell: PlanCell) -> list[str]:
    rule = next(f.rule for f in cell.findings if f.rule.effect.value == "incompatible")
    source = rule.sources[0].ref if rule.sources else ""
    return [cell.stack.id, cell.target.name, rule.id, rule.reason, source]


def explain_stack(plan: Plan, stack: Stack, width: int | None = None) -> str:
    """Every rule that fired for one stack, per target, with reason, remedy and sources.

    ``width`` wraps long lines at word boundaries (ids and URLs stay whole); ``None`` does not wrap.
    """
    lines = [f"stack {stack.id}"]
    for cell in plan.cells_for(stack):
        derived = cell.derived
        lines += ["", f"target {cell.target.name}: {cell.status.upper()}",
                  f"  base image      {derived.base_image}",
                  f"  torch           {derived.torch_requirement} from {_torch_source(cell)}",
                  f"  expected archs  {';'.join(derived.expected_arch_list) or 'unknown'}",
                  f"  kernel package  {derived.kernel_package or '-'}=={derived.kernel_version or '-'}",
                  f"  nvcc in image   {'yes' if derived.has_nvcc else 'no'}",
                  *_driver_lines(cell)]
        if not cell.findings:
            lines.append("  no rule fired")
        for finding in cell.findings:
            rule = finding.rule
            what = f"{rule.effect.value}" + (f" [{rule.feature}]" if rule.feature else "")
            lines += [f"  - {rule.id}: {what} ({rule.confidence})", f"      reason: {rule.reason}"]
            if rule.error:
                lines.append(f"      error:  {rule.error}")
            if rule.remedy:
                lines.append(f"      remedy: {rule.remedy}")
            if rule.requires:
                lines.append(f"      requires: {dict(rule.requires)}")
            lines += [f"      source: {s.ref}" + (f" <{s.url}>" if s.url else "") + f" [{s.confidence}]"
                      for s in rule.sources]
            lines.append(f"      defined at {rule.origin}")
    return wrap_text("\n".join(lines), width)


def _driver_lines(cell: PlanCell) -> list[str]:
    """The one driver floor and every reason for it; the toolkit's bundled driver only as information."""
    floor = cell.driver_floor
    lines = [f"  driver          {floor.text()}"]
    lines += [f"    because       {reason}" for reason in floor.because]
    toolkit = cell.derived.toolkit_driver
    if toolkit:
        lines.append(f"  toolkit driver  {toolkit} (bundled with CUDA {cell.stack.cuda}; not required: "
                     "only features outside minor-version compatibility need it)")
    return lines
