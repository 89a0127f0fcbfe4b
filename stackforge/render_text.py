"""Human-readable text for plans (pure functions returning strings)."""

from __future__ import annotations

from stackforge.data import display_path
from stackforge.model import Stack
from stackforge.plan import Cell, Plan
from stackforge.records import Verdict


def _table(rows: list[list[str]], headers: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip(),
            *(fmt.format(*r).rstrip() for r in rows)]


def _torch_source(cell: Cell) -> str:
    derived = cell.derived
    return f"{derived.torch_index_url} ({derived.torch_variant})" if derived.torch_index_url else \
        f"PyPI ({derived.torch_variant})"


def _dead_ends(cell: Cell) -> str:
    marks = {Verdict.UNAVAILABLE: "x", Verdict.HAZARD: "!"}
    items = [f"{marks[p.verdict]}{p.feature}" for p in cell.predictions() if p.verdict in marks]
    return " ".join(items) or "-"


def plan_table(plan: Plan) -> str:
    """The plan as tables: kept cells (with predicted dead ends), pruned cells (with rule, reason, source)."""
    kept = [c for c in plan.cells if not c.pruned]
    pruned = [c for c in plan.cells if c.pruned]
    targets = ", ".join(f"{t.name} ({t.sm}, {t.gpu_count}x {t.interconnect.value})" for t in plan.targets)
    lines = [f"matrix {plan.matrix.name} ({display_path(plan.matrix.source)}): {len(plan.cells)} cell(s) for {targets}",
             f"  {len(kept)} kept, {len(pruned)} pruned by rules, {plan.matrix.excluded} excluded by the matrix file",
             "", "KEPT (x = predicted unavailable, ! = hazard; predictions come from rules, not measurements)"]
    lines += _table([[c.stack.id, c.target.name, c.derived.base_image, _torch_source(c), c.derived.min_driver or "?",
                      _dead_ends(c)] for c in kept] or [["(none)", "", "", "", "", ""]],
                    ["stack", "target", "base image", "torch from", "driver>=", "predicted"])
    if pruned:
        lines += ["", "PRUNED (first rule shown; --explain STACK_ID lists all)"]
        lines += _table([_pruned_row(c) for c in pruned], ["stack", "target", "rule", "reason", "source"])
    return "\n".join(lines)


def _pruned_row(cell: Cell) -> list[str]:
    rule = next(f.rule for f in cell.findings if f.rule.effect.value == "incompatible")
    source = rule.sources[0].ref if rule.sources else ""
    return [cell.stack.id, cell.target.name, rule.id, _clip(rule.reason, 90), _clip(source, 60)]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def explain_stack(plan: Plan, stack: Stack) -> str:
    """Every rule that fired for one stack, per target, with reason, remedy and sources."""
    lines = [f"stack {stack.id}"]
    for cell in plan.cells_for(stack):
        derived = cell.derived
        lines += ["", f"target {cell.target.name}: {cell.status.upper()}",
                  f"  base image      {derived.base_image}",
                  f"  torch           {derived.torch_requirement} from {_torch_source(cell)}",
                  f"  expected archs  {';'.join(derived.expected_arch_list) or 'unknown'}",
                  f"  kernel package  {derived.kernel_package or '-'}=={derived.kernel_version or '-'}",
                  f"  nvcc in image   {'yes' if derived.has_nvcc else 'no'}",
                  f"  driver >=       {derived.min_driver or 'unknown'}"]
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
    return "\n".join(lines)
