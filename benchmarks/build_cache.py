"""Benchmark: does stackforge's layer order make matrices cheap to build? Measured in one run.

    .venv/bin/python benchmarks/build_cache.py [--torch pypi-cu128|wheelhouse-cpu] [--builder buildx|classic]
                                               [--keep] [--warm-pip-cache]

Builds small real stacks (wheels flavour on the bootstrapped Debian base, FlashInfer from PyPI with its
dependencies, SGLang --no-deps, no kernel package) and checks three claims. The torch layer is the
real thing by default: torch 2.9.1 as PyPI serves it (cu128, 8 GB image, about 2-3 minutes cold,
about 8 GB of disk until the images are removed at the end). ``--torch wheelhouse-cpu`` uses the
190 MB CPU wheel from /opt/wheels instead (about 1.5 minutes): there the first build is so small that
the fixed per-stack cost of a FlashInfer change (FlashInfer + SGLang wheel installs, freeze, export,
labels: about 7 s) is ~15% of it, so claim 1a is not expected to hold in that mode.

The claims:

1. A second stack that differs only in FlashInfer builds in <= 10% of the first stack's time and adds
   <= 5% of the first image's bytes in new layers (layers after the common prefix of the two images'
   build histories). The first stack is built as on a fresh machine: --no-cache, and (BuildKit) with
   BuildKit's cache mounts emptied first, so pip downloads what it needs (pass --warm-pip-cache to
   keep them; that measures a first build on a machine that built similar stacks before).
2. A no-op rebuild of 4 stacks takes <= 5 s per stack.
3. The second stack downloads no torch bytes: its build log shows the torch step as cached and no
   torch wheel transfer.

"Build time" is the image production (builder + metadata step), as recorded per phase in the build
records; verification inside the image is reported separately. Prints every measurement with the
numbers it was decided on; exits 1 when a claim fails. Images are labelled and removed afterwards
unless --keep is given (the builder's layer cache stays, as it would in real use).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _build_helpers import SYSTEM_CA, WHEELHOUSE, small_cell  # noqa: E402
from _session import TEST_LABEL  # noqa: E402

from stackforge.build import Builder, BuildOptions, BuildRecord, BuildStatus, build_stacks  # noqa: E402
from stackforge.core.model import Flavour, Stack  # noqa: E402
from stackforge.edges import docker_engine, runner  # noqa: E402
from stackforge.plan.derive import derive, load_tables  # noqa: E402

BENCH_LABEL = "io.stackforge.bench"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builder", choices=["buildx", "classic"], default="buildx")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the images")
    parser.add_argument("--torch", choices=["pypi-cu128", "wheelhouse-cpu"], default="pypi-cu128",
                        help="torch 2.9.1+cu128 from PyPI (a real stack's proportions) "
                             "or the CPU wheel from /opt/wheels")
    parser.add_argument("--warm-pip-cache", action="store_true",
                        help="do not empty BuildKit's cache mounts (pip's download cache) before the first build")
    args = parser.parse_args(argv)
    run_id = f"build-cache-{uuid.uuid4().hex[:8]}"
    client = docker_engine.connect()
    out = args.out or Path(tempfile.mkdtemp(prefix="sf-bench-"))
    real = args.torch == "pypi-cu128"
    base = dict(find_links=None if real else Path(WHEELHOUSE), ca_bundle=Path(SYSTEM_CA), out_dir=out,
                no_deps=frozenset({"sglang"}), labels=((TEST_LABEL, "1"), (BENCH_LABEL, run_id)),
                builder=Builder(args.builder))
    if args.builder == "buildx" and not args.warm_pip_cache:
        # Only download caches go (RUN --mount=type=cache); layers and images are untouched.
        print("emptying BuildKit's cache mounts (pip download cache) so the first build is a cold one")
        pruned = runner.run(["docker", "buildx", "prune", "--force", "--filter", "type=exec.cachemount"], timeout=300)
        if not pruned.succeeded:
            print(f"  could not: {pruned.output_tail.strip()[-200:]}")
    try:
        return _measure(client, base, real_cell if real else small_cell)
    finally:
        if not args.keep:
            removed = docker_engine.remove_labelled(client, f"{BENCH_LABEL}={run_id}")
            print(f"\nremoved {len(removed.images)} image(s) labelled {BENCH_LABEL}={run_id}")


def real_cell(flashinfer: str, sglang: str = "0.5.9"):
    """torch 2.9.1 as PyPI serves it (cu128, with its CUDA libraries) and the CUDA 12.8 toolkit wheels."""
    stack = Stack(cuda="12.8", torch="2.9.1", flashinfer=flashinfer, sglang=sglang, python="3.11",
                  flavour=Flavour.WHEELS, os="debian12")
    return stack, dataclasses.replace(derive(stack, load_tables()), kernel_package=None, kernel_version=None)


def _measure(client, base: dict, cell) -> int:
    # FlashInfer 0.6.5 and 0.6.6 declare the same dependencies (0.6.7 adds cuda-tile, which would be
    # a different dependency layer: a real change, not what claim 1 is about).
    first_cell, second_cell = cell("0.6.6"), cell("0.6.5")
    extra = [cell("0.6.6", sglang="0.5.8"), cell("0.6.5", sglang="0.5.8")]
    print(f"stacks: {first_cell[0].id}, {second_cell[0].id} (+2 for the no-op rebuild)")

    first = _build([first_cell], BuildOptions(**base, no_cache=True), client)[0]
    second = _build([second_cell], BuildOptions(**base), client)[0]
    second_log = Path(second.log_path).read_text(encoding="utf-8", errors="replace")   # before a rebuild rewrites it
    _build(extra, BuildOptions(**base), client)
    started = time.monotonic()
    noop = _build([first_cell, second_cell, *extra], BuildOptions(**base), client)
    noop_wall = time.monotonic() - started

    results = [_claim_incremental_time(first, second), _claim_incremental_bytes(client, first, second),
               _claim_noop(noop, noop_wall), _claim_no_torch_download(second_log)]
    print()
    for ok, text in results:
        print(f"[{'PASS' if ok else 'FAIL'}] {text}")
    return 0 if all(ok for ok, _ in results) else 1


def _build(cells, options: BuildOptions, client) -> list[BuildRecord]:
    summary = build_stacks(cells, options, client=client)
    for record in summary.records:
        seconds = ", ".join(f"{k} {v:.1f}" for k, v in record.durations.items())
        print(f"  {record.status.value:<7} {record.stack_id}: {seconds}")
        if not record.status.ok:
            raise SystemExit(f"benchmark stack failed: {record.reason} (log: {record.log_path})")
    return list(summary.records)


def _image_time(record: BuildRecord) -> float:
    return record.durations.get("build", 0.0) + record.durations.get("metadata", 0.0)


def _claim_incremental_time(first: BuildRecord, second: BuildRecord) -> tuple[bool, str]:
    t1, t2 = _image_time(first), _image_time(second)
    ratio = t2 / t1 if t1 else float("inf")
    return ratio <= 0.10, (f"(1a) FlashInfer-only change builds in {t2:.1f} s = {ratio:.1%} of the cold first "
                           f"build's {t1:.1f} s (limit 10%); verification adds "
                           f"{second.durations.get('verify', 0):.1f} s")


def _claim_incremental_bytes(client, first: BuildRecord, second: BuildRecord) -> tuple[bool, str]:
    total = int(client.images.get(first.image_id).attrs["Size"])
    new_bytes, shared_steps, new_steps = _new_layer_bytes(client, first.image_id, second.image_id)
    share = new_bytes / total if total else float("inf")
    return share <= 0.05, (f"(1b) it adds {new_bytes / 1e6:.1f} MB in {new_steps} new layer(s) = {share:.2%} of the "
                           f"first image's {total / 1e9:.2f} GB (limit 5%); {shared_steps} build steps shared")


def _new_layer_bytes(client, first_id: str, second_id: str) -> tuple[int, int, int]:
    """Bytes of the second image's steps after the common prefix of both build histories (oldest first)."""
    def steps(image_id: str) -> list[tuple[str, int]]:
        return [(str(h.get("CreatedBy", "")), int(h.get("Size", 0))) for h in reversed(client.api.history(image_id))]

    a, b = steps(first_id), steps(second_id)
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    fresh = b[common:]
    return sum(size for _, size in fresh), common, sum(1 for _, size in fresh if size)


def _claim_noop(records: list[BuildRecord], wall: float) -> tuple[bool, str]:
    per_stack = wall / len(records)
    slowest = max(sum(r.durations.values()) for r in records)
    cached = sum(r.status is BuildStatus.CACHED for r in records)
    ok = per_stack <= 5.0 and slowest <= 5.0 and cached == len(records)
    return ok, (f"(2) no-op rebuild of {len(records)} stacks: {wall:.1f} s wall = {per_stack:.1f} s per stack, "
                f"slowest stack {slowest:.1f} s, {cached}/{len(records)} cached (limit 5 s per stack)")


def _claim_no_torch_download(log: str) -> tuple[bool, str]:
    cached, evidence = _torch_step_cached(log)
    transfers = [line.strip() for line in log.splitlines()
                 if re.search(r"(Downloading|Processing|Obtaining|Collecting)\s+\S*torch-\d", line)
                 or re.search(r"Collecting torch[=<> ]", line)]
    ok = cached and not transfers
    detail = evidence if ok else f"{evidence}; transfer lines: {transfers[:3]}"
    return ok, f"(3) second stack downloads no torch bytes: {detail}"


def _torch_step_cached(log: str) -> tuple[bool, str]:
    """Find the torch install step in a BuildKit (plain progress) or classic log and whether it was cached."""
    lines = log.splitlines()
    for index, line in enumerate(lines):
        buildkit = re.match(r"#(\d+) \[.*\] RUN .*\"torch==", line)
        if buildkit:
            step = buildkit.group(1)
            cached = any(other.strip() == f"#{step} CACHED" for other in lines[index + 1:])
            return cached, f"BuildKit step #{step} (torch install) {'CACHED' if cached else 'was executed'}"
        if re.match(r"Step \d+/\d+ : RUN .*\"torch==", line):
            following = " ".join(lines[index + 1:index + 4])
            cached = "Using cache" in following
            return cached, f"classic step '{line[:40]}...' {'used the cache' if cached else 'was executed'}"
    return False, "no torch install step found in the log"


if __name__ == "__main__":
    sys.exit(main())
