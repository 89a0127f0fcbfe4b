"""Wall time of the gate tier per stack on real images (container start, imports, probes).

Target (issue #4): <= 30 s per stack on 2 cores, stacks in parallel. Run after building images:

    python benchmarks/probe_overhead.py                      # every local stackforge image
    python benchmarks/probe_overhead.py --image stackforge/cu130-...:abc123 -j 2

Prints, per stack, the wall time of all gate probes together and of each probe, and the overall
wall time divided by the number of stacks. The FlashInfer JIT compile probe (a real nvcc compile)
is listed separately and excluded from the per-stack figure unless --with-compile is given.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from stackforge.docker_engine import connect
from stackforge.model import Stack
from stackforge.probes.campaign import STACK_ID_LABEL, ProbeJob, run_jobs, select_specs
from stackforge.probes.catalog import catalog
from stackforge.probes.execute import detect_host_gpus
from stackforge.plan import load_knowledge

COMPILE_PROBE = "gate.flashinfer.jit"


def stacks_from_images(client, refs: list[str]) -> list[Stack]:
    """Stacks of the given images (or of every local stackforge image), from their labels."""
    images = [client.images.get(r) for r in refs] if refs else \
        client.images.list(filters={"label": STACK_ID_LABEL})
    stacks: dict[str, Stack] = {}
    for image in images:
        labels = image.labels or {}
        stack_json = labels.get("io.stackforge.stack.json")
        if stack_json:
            import json
            stack = Stack.from_json(json.loads(stack_json))
            stacks.setdefault(stack.id, stack)
    return list(stacks.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", action="append", default=[], help="image to probe (repeatable)")
    parser.add_argument("--target", default="rtx-pro-6000-x8-pcie")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--with-compile", action="store_true", help="include the real FlashInfer JIT compile")
    args = parser.parse_args()

    client = connect()
    target = load_knowledge().targets[args.target]
    stacks = stacks_from_images(client, args.image)
    if not stacks:
        raise SystemExit("no stackforge images found: build some first (stackforge build ...)")
    specs = [s for s in select_specs(catalog(), tier="gate") if args.with_compile or s.id != COMPILE_PROBE]
    jobs = [ProbeJob(stack, target, spec) for stack in stacks for spec in specs]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        records = run_jobs(jobs, run_id="probe-overhead", host_gpus=detect_host_gpus(client), write=lambda r: None,
                           client=client, parallel=args.jobs, log_dir=Path(tmp))
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
