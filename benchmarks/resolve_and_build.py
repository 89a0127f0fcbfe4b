"""Resolve once, install exactly: how long a stack's lock takes on the host, and what it does to a build.

Part 1 (always): each stack resolved on the host the way `stackforge build` does first
(:func:`stackforge.build.locking.resolve_lock`: torch alone, the rest with torch's pins, the exact
packages), cold (an empty uv cache) and warm (the same again). Stacks: the default matrix's kept stacks
and the stack a user's hour-long build backtracked on (CUDA 13.1, torch 2.11.0, FlashInfer 0.6.12,
SGLang 0.5.15.post1, wheels flavour). Target: under 30 s per stack cold.

Part 2 (``--build``): one stack built cold three times on the local engine, side by side: per-layer
pip installs without a lock (each layer resolves on its own; ``--no-lock``), and the lock-driven installs
(``--no-deps --require-hashes`` per layer) by pip and by uv (``--installer uv``). Cold: ``--no-cache`` and BuildKit's pip cache mounts pruned before each
build, so both download everything. The stack is the small real one the tests build (torch 2.13.0+cpu
from this machine's wheelhouse, the CUDA 13.0 toolkit wheels, FlashInfer 0.6.6 with its dependencies,
SGLang --no-deps); the default matrix's 13.1 stack (about 10 GB of wheels per cold build) is not built
here. Run: ``python benchmarks/resolve_and_build.py [--build]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from stackforge.build.locking import resolve_lock
from stackforge.compose.dockerfile import ComposeOptions, lock_request
from stackforge.core.model import Flavour, Stack
from stackforge.edges import runner
from stackforge.edges.resolver import ResolverIndexes
from stackforge.plan.derive import derive, load_tables
from stackforge.plan.planner import plan_file

REPO = Path(__file__).resolve().parents[1]
WHEELHOUSE = Path("/opt/wheels")
ISSUE_STACK = Stack(cuda="13.1", torch="2.11.0", flashinfer="0.6.12", sglang="0.5.15.post1", python="3.11",
                    flavour=Flavour.WHEELS, os="debian12")
SMALL_STACK = Stack(cuda="13.0", torch="2.13.0", flashinfer="0.6.6", sglang="0.5.9", python="3.11",
                    flavour=Flavour.WHEELS, os="debian12", torch_variant="cpu")


def resolution_times(cells, ca: Path | None) -> None:
    glibc = load_tables().os_glibc
    print(f"{'stack':<66} {'packages':>8} {'cold s':>7} {'warm s':>7}  notes")
    for stack, derived in cells:
        request = lock_request(stack, derived, ComposeOptions(), glibc=glibc[stack.os])
        with tempfile.TemporaryDirectory(prefix="sf-uv-cache-") as cache:
            indexes = ResolverIndexes(ca_bundle=ca, cache_dir=Path(cache))
            times, lock = [], None
            for _ in range(2):
                started = time.monotonic()
                lock = resolve_lock(request, indexes)
                times.append(time.monotonic() - started)
        notes = "torch layer: full resolution's versions" if lock.notes else "torch layer: torch's own resolution"
        print(f"{stack.id:<66} {len(lock.packages):>8} {times[0]:>7.1f} {times[1]:>7.1f}  {notes}", flush=True)


def cold_builds(ca: Path | None) -> None:
    import docker

    from stackforge.build import Builder, BuildOptions, build_stacks
    from stackforge.build.locking import LockMode
    derived = dataclasses.replace(derive(SMALL_STACK, load_tables()), kernel_package=None, kernel_version=None)
    client = docker.from_env()
    print(f"\ncold builds of {SMALL_STACK.id} (no layer cache, pip cache mounts pruned)")
    print(f"{'installs':<28} {'build s':>8} {'lock s':>7} {'status':<8} image")
    for label, mode, installer in (("per-layer pip (unlocked)", LockMode.OFF, "pip"),
                                   ("lock, pip --no-deps", LockMode.RESOLVE, "pip"),
                                   ("lock, uv --no-deps", LockMode.RESOLVE, "uv")):
        runner.run(["docker", "builder", "prune", "-f", "--filter", "type=exec.cachemount"], timeout=300)
        with tempfile.TemporaryDirectory(prefix="sf-bench-build-") as out:
            options = BuildOptions(find_links=WHEELHOUSE, ca_bundle=ca, out_dir=Path(out), no_deps=frozenset({"sglang"}),
                                   builder=Builder.BUILDX, base_image="stackforge/debian:bookworm", no_cache=True,
                                   lock=mode, installer=installer, labels=(("io.stackforge.bench", "1"),),
                                   verify=False)
            record = build_stacks([(SMALL_STACK, derived)], options, client=client).records[0]
        print(f"{label:<28} {record.durations.get('build', 0):>8.1f} {record.durations.get('lock', 0):>7.1f} "
              f"{record.status.value:<8} {record.image_tag}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="store_true", help="also build the small stack cold, unlocked and locked")
    parser.add_argument("--ca", type=Path, default=Path("/etc/ssl/certs/ca-certificates.crt"),
                        help="CA bundle for the index (default: this machine's)")
    args = parser.parse_args()
    ca = args.ca if args.ca and args.ca.is_file() else None
    plan = plan_file(REPO / "matrices" / "default.yaml")
    cells = [(stack, plan.cells_for(stack)[0].derived) for stack in plan.kept_stacks()]
    cells.append((ISSUE_STACK, derive(ISSUE_STACK, load_tables())))
    resolution_times(cells, ca)
    if args.build:
        cold_builds(ca)


if __name__ == "__main__":
    main()
