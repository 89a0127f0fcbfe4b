"""Wall time of the gate tier per stack on real images (container start, imports, probes).

Target (issue #4): <= 30 s per stack on 2 cores, stacks in parallel. Run after building images:

    python benchmarks/probe_overhead.py                      # the images of ./out (stackforge build --out)
    python benchmarks/probe_overhead.py --builds out -j 2

Prints, per stack, the wall time of all gate probes together and of each probe, and the overall
wall time divided by the number of stacks. The FlashInfer JIT compile probe (a real nvcc compile)
is listed separately and excluded from the per-stack figure unless --with-compile is given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from stackforge.core.model import Stack
from stackforge.edges.docker_engine import connect
from stackforge.edges.gpus import detect_host_gpus
from stackforge.jobs.campaign import CellJob
from stackforge.plan.planner import load_knowledge
from stackforge.probes.campaign import run_probe_jobs, select_specs
from stackforge.probes.catalog import catalog
from stackforge.probes.execute import ImageRef

COMPILE_PROBE = "gate.flashinfer.jit"


def built_images(builds_dir: Path) -> dict[Stack, ImageRef]:
    """Stacks and their images, from the build records of a `stackforge build --out` folder. Only the four
    fields needed are read, not the whole record: a benchmark run with ``--against`` an older tree reads
    records that a newer stackforge wrote, with fields the older BuildRecord does not know."""
    found: dict[Stack, ImageRef] = {}
    for path in sorted((builds_dir / "builds").glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("status") in ("built", "cached") and data.get("image_id"):
            found[Stack.from_json(data["stack"])] = ImageRef(ref=data.get("image_tag") or data["image_id"],
                                                             image_id=data["image_id"])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--builds", type=Path, default=Path("out"), help="a `stackforge build --out` folder")
    parser.add_argument("--target", default="rtx-pro-6000-x8-pcie")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--with-compile", action="store_true", help="include the real FlashInfer JIT compile")
    args = parser.parse_args()

    client = connect()
    target = load_knowledge().targets[args.target]
    images = built_images(args.builds)
    if not images:
        raise SystemExit(f"no built images in {args.builds}/builds: run `stackforge build` first")
    stacks = list(images)
    specs = [s for s in select_specs(catalog(), tier="gate") if args.with_compile or s.id != COMPILE_PROBE]
    jobs = [CellJob(stack, target, spec) for stack in stacks for spec in specs]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        records = run_probe_jobs(jobs, run_id="probe-overhead", host_gpus=detect_host_gpus(client), write=lambda r: None,
                                 client=client, parallel=args.jobs, log_dir=Path(tmp),
                                 images={stack.id: image for stack, image in images.items()})
        wall = time.perf_counter() - started
    per_stack: dict[str, list] = defaultdict(list)
    for record in records:
        per_stack[record.stack_id].append(record)
    print(f"gate tier on {len(stacks)} stack(s), {len(jobs)} probe run(s), -j {args.jobs}, target {args.target}")
    for stack_id, rows in per_stack.items():
        total = sum(r.outcome.duration_s for r in rows)
        print(f"  {stack_id}: {total:.1f} s of probe time")
        for r in sorted(rows, key=lambda r: r.probe):
            print(f"    {r.probe:<32} {r.outcome.status.value:<7} {r.outcome.duration_s:6.1f} s")
    print(f"wall time {wall:.1f} s -> {wall / len(stacks):.1f} s per stack (target <= 30 s)")
    print(f"median probe {statistics.median(r.outcome.duration_s for r in records):.1f} s")


if __name__ == "__main__":
    main()
