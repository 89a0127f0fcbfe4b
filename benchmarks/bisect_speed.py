"""How long `stackforge bisect` takes to find two known boundaries, with a cold and a warm wheel cache.

* FlashInfer's allreduce fusion on sm_120 (flashinfer-python: 0.6.16.post4 -> 0.6.17);
* SGLang's torch symmetric memory on sm_120 (sglang releases).

Cold: a fresh, empty wheel cache (index pages and wheels fetched from the configured index, pip's
own configuration). Warm: the same search again on that cache. Targets (issue #12): each boundary
under 60 s cold and under 5 s warm on a 2-core machine. Building two images to answer the same
question takes about 8 minutes. Run: ``python benchmarks/bisect_speed.py [--target NAME]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from stackforge.edges.index import index_config
from stackforge.edges.pip_config import read_pip_config
from stackforge.plan.planner import load_knowledge
from stackforge.wheels.cache import WheelCache
from stackforge.wheels.tier import load_readers, resolve_specs, run_bisect, target_context, target_named

CASES = (("flashinfer-ar-fusion", "flashinfer-python"), ("torch-symm-mem", "sglang"))


def search_once(fact: str, dist: str, target_name: str, cache_root: Path) -> tuple[float, int, list[str]]:
    """(seconds, releases read, boundaries) of one search on the cache at ``cache_root``."""
    indexes = index_config(pip_config=read_pip_config(), env=os.environ)
    (spec,) = resolve_specs(load_readers(), fact, dist)
    ctx = target_context(target_named(load_knowledge().targets, target_name))
    started = time.perf_counter()
    search = run_bisect(spec, ctx, indexes=indexes, cache=WheelCache.open(indexes, cache_root))
    seconds = time.perf_counter() - started
    found = [f"{c.before.version} -> {c.after.version}" for c in search.changes]
    return seconds, len(search.points), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="rtx-pro-6000-x8-pcie")
    args = parser.parse_args()
    if not load_readers():
        raise SystemExit("no wheel readers (stackforge.wheels.readers) in this install")
    for fact, dist in CASES:
        root = Path(tempfile.mkdtemp(prefix="stackforge-bisect-bench-"))
        try:
            cold, reads, found = search_once(fact, dist, args.target, root)
            warm, _, again = search_once(fact, dist, args.target, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        assert found == again, "a warm search must find what the cold one found"
        print(f"{fact} ({dist}) on {args.target}: cold {cold:.1f} s, warm {warm:.2f} s, "
              f"{reads} releases read; boundaries: {', '.join(found) or 'none'}")


if __name__ == "__main__":
    main()
