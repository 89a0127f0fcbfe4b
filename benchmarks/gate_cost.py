"""Seconds of the gate tier per stack x target, cold (a fresh JIT build cache) and warm (a second run).

The FlashInfer gate probes build (compile and link) the modules a serving run JIT-builds first, which
costs minutes on 2 cores; the job runner keeps each (image, target arch)'s FlashInfer workspace under
``$STACKFORGE_JIT_CACHE`` (default ``~/.cache/stackforge/jit``) so a rerun has ninja prove the modules
up to date in seconds. This benchmark points that cache at a fresh temporary folder, runs the gate tier
twice on images that are already built, and prints both figures. Run after building images:

    python benchmarks/gate_cost.py --builds out                   # every gate probe, the default target
    python benchmarks/gate_cost.py --builds out --only-flashinfer --target rtx-pro-6000-x8-pcie -j 2

``--against REV`` also runs it on another commit (a temporary git worktree, that tree's ``stackforge``
first on the import path), alternating with this tree ``--rounds`` times, so the two figures come from
one machine under the same load. Nothing is built here: stacks without a built image are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FLASHINFER_PROBES = ("gate.flashinfer.jit", "gate.flashinfer.ar-fusion")
JIT_CACHE_ENV = "STACKFORGE_JIT_CACHE"   # stackforge.jobs.job_runner.JIT_CACHE_ENV (absent from older trees)


def built_images(builds_dir: Path) -> dict[Any, Any]:
    """Stacks and their images, from the build records of a `stackforge build --out` folder (probe_overhead's
    reader, imported here, after the import path is set: --against puts another tree's stackforge first)."""
    from probe_overhead import built_images as read_builds
    return read_builds(builds_dir)


def one_pass(images: dict[Any, Any], targets: list[str], only_flashinfer: bool, jobs: int,
             run_id: str) -> list[dict[str, Any]]:
    """Every chosen gate probe of every (stack, target) once: one row per record."""
    from stackforge.edges.docker_engine import connect
    from stackforge.edges.gpus import detect_host_gpus
    from stackforge.jobs.campaign import CellJob
    from stackforge.plan.planner import load_knowledge
    from stackforge.probes.campaign import run_probe_jobs, select_specs
    from stackforge.probes.catalog import catalog

    client = connect()
    knowledge = load_knowledge()
    specs = [s for s in select_specs(catalog(), tier="gate") if not only_flashinfer or s.id in FLASHINFER_PROBES]
    cells = [CellJob(stack, knowledge.targets[name], spec) for stack in images for name in targets for spec in specs]
    with tempfile.TemporaryDirectory() as logs:
        records = run_probe_jobs(cells, run_id=run_id, host_gpus=detect_host_gpus(client), write=lambda r: None,
                                 client=client, parallel=jobs, log_dir=Path(logs),
                                 images={stack.id: image for stack, image in images.items()})
    return [{"stack": r.stack_id, "target": r.target, "probe": r.probe, "status": r.outcome.status.value,
             "seconds": round(r.outcome.duration_s, 1), "reason": r.outcome.reason[:160]} for r in records]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Cold then warm, both over one fresh JIT cache folder; the wall time of each pass too."""
    images = built_images(args.builds)
    if not images:
        raise SystemExit(f"no built images in {args.builds}/builds: run `stackforge build` first")
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sf-gate-cost-") as cache:
        os.environ[JIT_CACHE_ENV] = cache
        for name in ("cold", "warm"):
            started = time.perf_counter()
            rows = one_pass(images, args.target, args.only_flashinfer, args.jobs, f"gate-cost-{name}")
            result[name] = {"wall_s": round(time.perf_counter() - started, 1), "rows": rows}
    return result


def print_table(label: str, result: dict[str, Any]) -> None:
    per_cell: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: {"cold": 0.0, "warm": 0.0})
    probes: dict[tuple[str, str, str], dict[str, str]] = defaultdict(dict)
    for phase in ("cold", "warm"):
        for row in result[phase]["rows"]:
            per_cell[(row["stack"], row["target"])][phase] += row["seconds"]
            probes[(row["stack"], row["target"], row["probe"])][phase] = f"{row['status']:<7} {row['seconds']:7.1f} s"
    print(f"{label}: cold wall {result['cold']['wall_s']} s, warm wall {result['warm']['wall_s']} s")
    for (stack, target), seconds in sorted(per_cell.items()):
        print(f"  {stack} x {target}: cold {seconds['cold']:.1f} s, warm {seconds['warm']:.1f} s of probe time")
        for (s, t, probe), phases in sorted(probes.items()):
            if (s, t) == (stack, target):
                print(f"    {probe:<30} cold {phases.get('cold', '-'):<18} warm {phases.get('warm', '-')}")


def tree_result(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """This benchmark run with ``tree``'s stackforge first on the import path; its JSON."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--json", "--builds", str(args.builds.resolve()),
            "-j", str(args.jobs), *[x for t in args.target for x in ("--target", t)],
            *(["--only-flashinfer"] if args.only_flashinfer else [])]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=4 * 3600,
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def against(rev: str, args: argparse.Namespace) -> None:
    """Alternate ``rev`` (a git worktree) and this tree ``--rounds`` times; print every round."""
    with tempfile.TemporaryDirectory(prefix="sf-gate-cost-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
        try:
            for round_ in range(args.rounds):
                print_table(f"{rev} (round {round_ + 1})", tree_result(tree, args))
                print_table(f"this tree (round {round_ + 1})", tree_result(REPO, args))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--builds", type=Path, default=Path("out"), help="a `stackforge build --out` folder")
    parser.add_argument("--target", action="append", default=None, help="target profile (repeatable)")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--only-flashinfer", action="store_true", help="only the FlashInfer gate probes")
    parser.add_argument("--against", metavar="REV", help="also measure this git revision, side by side")
    parser.add_argument("--rounds", type=int, default=1, help="alternating runs per tree with --against")
    parser.add_argument("--json", action="store_true", help="print the measurement as one JSON line")
    args = parser.parse_args()
    args.target = args.target or ["rtx-pro-6000-x8-pcie"]
    if args.against:
        against(args.against, args)
        return
    result = measure(args)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    print_table("this tree", result)


if __name__ == "__main__":
    main()
