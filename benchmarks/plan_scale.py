"""Expand and evaluate a synthetic 10,000-cell matrix against every shipped rule; print cells/s.

Target (issue #2): at least 20,000 cells/s on one core. Run: ``python benchmarks/plan_scale.py``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from stackforge.plan.matrix_file import load_matrix
from stackforge.plan.planner import load_knowledge, plan_matrix


def synthetic_matrix(knowledge, cells: int) -> str:
    """A matrix YAML whose axes multiply out to ``cells`` stacks (one target)."""
    toolkits = sorted(knowledge.tables.torch_variant_for_toolkit)[:5]
    pins = sorted(knowledge.tables.sglang_pins)[:10] or ["0.5.23"]
    per_axis = max(1, math.ceil((cells / (len(toolkits) * len(pins) * 2)) ** 0.5))
    torches = [f"2.{m}.{p}" for m in range(6, 16) for p in range(10)][:per_axis]
    flashinfers = [f"0.{m}.{p}" for m in range(2, 10) for p in range(20)][:per_axis]
    axes = {"cuda": toolkits, "torch": torches, "flashinfer": flashinfers, "sglang": pins, "python": ["3.11", "3.12"]}
    lines = ["schema: 1", "name: synthetic", "targets: [rtx-pro-6000-x8-pcie]", "axes:"]
    lines += [f"  {k}: [{', '.join(repr(v) for v in vs)}]" for k, vs in axes.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--compat", type=Path, default=None, help="compat folder (default: the shipped one)")
    args = parser.parse_args()
    knowledge = load_knowledge(args.compat)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.yaml"
        path.write_text(synthetic_matrix(knowledge, args.cells))
        start = time.perf_counter()
        matrix = load_matrix(path)
        expanded = time.perf_counter()
        plan = plan_matrix(matrix, knowledge)
        done = time.perf_counter()
    cells = len(plan.cells)
    pruned = sum(c.pruned for c in plan.cells)
    findings = sum(len(c.findings) for c in plan.cells)
    print(f"rules evaluated per cell : {len(knowledge.rules)}")
    print(f"cells                    : {cells} ({pruned} pruned, {findings} findings)")
    print(f"expand                   : {expanded - start:.3f} s")
    print(f"evaluate                 : {done - expanded:.3f} s")
    print(f"cells per second         : {cells / (done - start):,.0f}  (target >= 20,000 on one core)")


if __name__ == "__main__":
    main()
