"""Expand and evaluate a synthetic 10,000-cell matrix against every shipped rule; print cells/s.

Target (issue #2): at least 20,000 cells/s on one core. Run: ``python benchmarks/plan_scale.py``.
``--against REV`` also runs this benchmark on another commit (a temporary git worktree), alternating with
this tree ``--rounds`` times, so the two figures come from one machine under the same load.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
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


REPO = Path(__file__).resolve().parents[1]


def cells_per_second(tree: Path, cells: int) -> float:
    """``tree``'s own plan benchmark (its modules may live elsewhere), with ``tree``'s code first on the path."""
    done = subprocess.run([sys.executable, str(tree / "benchmarks" / "plan_scale.py"), "--cells", str(cells)],
                          capture_output=True, text=True, check=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
    return float(re.search(r"cells per second\s*: ([\d,]+)", done.stdout).group(1).replace(",", ""))


def against(rev: str, cells: int, rounds: int) -> None:
    """Alternate this tree and ``rev`` (a git worktree) ``rounds`` times; print both medians and their ratio."""
    with tempfile.TemporaryDirectory(prefix="sf-plan-scale-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
        try:
            here, there = [], []
            for _ in range(rounds):
                there.append(cells_per_second(tree, cells))
                here.append(cells_per_second(REPO, cells))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    print(f"{rev:<24}: {median(there):,.0f} cells/s (runs: {', '.join(f'{v:,.0f}' for v in there)})")
    print(f"{'this tree':<24}: {median(here):,.0f} cells/s (runs: {', '.join(f'{v:,.0f}' for v in here)})")
    print(f"ratio this tree / {rev}: {median(here) / median(there):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--compat", type=Path, default=None, help="compat folder (default: the shipped one)")
    parser.add_argument("--against", metavar="REV", help="also measure this git revision, side by side")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per tree with --against")
    args = parser.parse_args()
    if args.against:
        against(args.against, args.cells, args.rounds)
        return
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
