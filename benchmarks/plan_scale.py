"""Expand and evaluate a synthetic 10,000-cell matrix against every shipped rule; print cells/s.

Target (issue #2): at least 20,000 cells/s on one core. Run: ``python benchmarks/plan_scale.py``.
``--json-memory 10000 100000`` runs ``stackforge plan --json`` on synthetic matrices of those sizes, each in
a process of its own, and prints its peak memory (the child's maxrss), the JSON's bytes and bytes per cell
(issue #32 targets: under 2 KB a cell, 10^5 cells under 1 GB).
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


def json_memory(sizes: list[int]) -> None:
    """``stackforge plan --json`` on a synthetic matrix of each size, in its own process: its peak memory
    (``wait4``'s maxrss of that child alone) and what it printed, per cell."""
    knowledge = load_knowledge()
    print(f"{'cells':>9}  {'peak memory':>12}  {'JSON bytes':>14}  {'bytes/cell':>10}  {'seconds':>7}")
    with tempfile.TemporaryDirectory(prefix="sf-plan-json-") as tmp:
        for cells in sizes:
            matrix, out = Path(tmp) / f"m{cells}.yaml", Path(tmp) / f"plan{cells}.json"
            matrix.write_text(synthetic_matrix(knowledge, cells))
            start = time.perf_counter()
            with out.open("wb") as stdout:
                child = subprocess.Popen([sys.executable, "-m", "stackforge", "plan", "--matrix", str(matrix), "--json",
                                          "--max-cells", str(max(cells * 2, 1))], stdout=stdout,
                                         stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
                _, status, usage = os.wait4(child.pid, 0)
            seconds = time.perf_counter() - start
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"stackforge plan --json failed on {cells} cells (exit "
                                 f"{os.waitstatus_to_exitcode(status)})")
            planned = int(re.search(rb'"cells": (\d+)', out.read_bytes()[:100_000]).group(1))
            size = out.stat().st_size
            peak = usage.ru_maxrss * 1024     # kilobytes on Linux
            print(f"{planned:>9,}  {peak / 2**20:>9,.0f} MiB  {size:>14,}  {size / planned:>10,.0f}  {seconds:>7.1f}")
            out.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--compat", type=Path, default=None, help="compat folder (default: the shipped one)")
    parser.add_argument("--against", metavar="REV", help="also measure this git revision, side by side")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per tree with --against")
    parser.add_argument("--json-memory", type=int, nargs="+", metavar="CELLS",
                        help="peak memory and bytes per cell of `plan --json` at these sizes (e.g. 10000 100000)")
    args = parser.parse_args()
    if args.json_memory:
        json_memory(args.json_memory)
        return
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
