"""The fixed workspace the ``stackforge upgrade`` tests and the README example read: tests/data/upgrade/.

It is the seed campaign of :mod:`matrix_fixtures` (CUDA 12.8 dead ends, 13.0 gate-only, 13.1 the way
out, one pruned stack) written as a results folder (``results/run-a``), the plan (``plan.json``) and
the build records of the two probed stacks that were built here (``out/builds``, with their image
sizes). Regenerate it after changing :mod:`matrix_fixtures` with::

    .venv/bin/python tests/upgrade_fixtures.py tests/data/upgrade
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

from matrix_fixtures import CU128, CU131, MIN_DRIVER, STACKS, plan_dict, seed_records

from stackforge.build.records import BuildRecord, BuildStatus
from stackforge.build.records import write_record as write_build_record
from stackforge.core.records import ResultRecord
from stackforge.results.store import RUN_FILE, RunInfo, atomic_write_text, record_path

UPGRADE_DATA = Path(__file__).resolve().parent / "data" / "upgrade"
RUN_ID = "run-a"
#: Bytes as the engine reports them: a CUDA 12.8 devel image and a CUDA 13.1 one.
IMAGE_SIZES = {CU128: 7_412_000_000, CU131: 11_604_000_000}


def build_records() -> list[BuildRecord]:
    """The build records of the stacks that have an image size (built, verified)."""
    return [BuildRecord(stack_id=stack_id, stack=STACKS[stack_id], derived={"min_driver": MIN_DRIVER[stack_id]},
                        status=BuildStatus.BUILT, image_tag=f"stackforge/{stack_id}:abc123",
                        image_id="sha256:" + "1" * 64, image_size=size, builder="buildkit",
                        created_at="2026-03-01T01:00:00+00:00", stackforge_version="0.1.0")
            for stack_id, size in IMAGE_SIZES.items()]


def write_run(results_root: Path, records: list[ResultRecord], run_id: str = RUN_ID) -> Path:
    """A finished run folder with fixed metadata (no clock, no host name), so the files never change."""
    run_dir = results_root / run_id
    run = RunInfo(run_id=run_id, started_at="2026-03-01T02:00:00+00:00", finished_at="2026-03-01T02:30:00+00:00",
                  host="gpu-box-1", command=("stackforge", "probe"), stackforge_version="0.1.0")
    atomic_write_text(run_dir / RUN_FILE, json.dumps(run.to_json(), indent=2, sort_keys=True) + "\n")
    for record in records:
        atomic_write_text(record_path(run_dir, record.key), dataclasses.replace(record, run_id=run_id).dumps())
    return run_dir


def write_workspace(folder: Path, *, without: tuple[str, ...] = ()) -> Path:
    """``folder`` with ``results/``, ``plan.json`` and ``out/builds/``; records of ``without`` stacks left out."""
    records = [r for r in seed_records() if r.stack_id not in without]
    write_run(folder / "results", records)
    (folder / "plan.json").write_text(json.dumps(plan_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for build in build_records():
        write_build_record(folder / "out", build)
    return folder


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else UPGRADE_DATA)
    shutil.rmtree(target, ignore_errors=True)
    write_workspace(target)
    print(f"wrote {target}")
