"""The disk budget: how much free space ``scripts/test.sh`` and ``scripts/main-job.sh`` need, what
stackforge itself holds on this machine (its stack images, the engine's BuildKit cache, the tests'
probe-venv cache), and the check both scripts run before they start.

The figures live here and nowhere else: both scripts call this module (``python3 -m
stackforge.doctor.disk_budget check test``, from the checkout, before stackforge is installed: it
needs the standard library and :mod:`stackforge.edges.runner` only), and ``stackforge doctor`` shows
the same figures in its ``disk budget`` check. Where each figure comes from is in
docs/measurements.md ("Disk").

A need is split by where it is written: the engine's data root (images, BuildKit cache) and the
scratch space (the temp dir's probe venvs, the checkout's ``.cache``). When both lie on one
filesystem, that filesystem must hold the sum.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from stackforge.core.errors import HostError
from stackforge.edges import runner

GB = 1000 ** 3
NEED_ENV = "STACKFORGE_DISK_NEED_GB"       # overrides a command's whole need (tests; a machine you know)
PROBE_VENVS_ENV = "SF_PROBE_VENVS"         # tests/_probe_venvs.py's cache folder
PROBE_VENVS_DEFAULT = "/tmp/sf-probe-venvs"
#: The stack images stackforge builds carry this label (stackforge.jobs.job_runner.STACK_ID_LABEL).
STACK_LABEL = "io.stackforge.stack.id"
#: What the test command leaves of the engine's BuildKit cache when it ends (``docker buildx prune
#: --keep-storage``; buildx 0.13, what scripts/setup-engine.sh installs, has no --max-used-space).
BUILDKIT_KEEP_GB = 8
#: The probe-venv cache's cap (tests/_probe_venvs.py evicts least-recently-used venvs above it).
PROBE_VENVS_CAP_GB = 12
TOOL_TIMEOUT_S = 60.0
DU_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class DiskNeed:
    """Free space one command needs, by where it writes (decimal GB, as ``df -H`` and docker print)."""

    command: str
    script: str
    engine_gb: int      # on the engine's data root: images and BuildKit cache
    scratch_gb: int     # in the temp dir and the checkout: venvs, wheel caches, logs
    basis: str          # what the figure rests on (docs/measurements.md, "Disk")

    @property
    def total_gb(self) -> int:
        return self.engine_gb + self.scratch_gb


NEEDS = {
    # Measured (5e5c30f, from a clean clone, the probe venvs of an earlier run there, BuildKit's cache
    # pruned to 0 first): the disk peaked 48.6 GB above its start, the default CUDA 13.1 image the JIT-gate
    # tests build (11.6 GB) and its layers in BuildKit's cache included; a fresh machine adds the probe
    # venvs (capped at PROBE_VENVS_CAP_GB) to that peak.
    "test": DiskNeed("test", "scripts/test.sh", engine_gb=46, scratch_gb=15,
                     basis="a passing run peaked 48.6 GB above its start with the probe venvs already built "
                           "(the default 13.1 image and BuildKit's cache included); the venvs add up to 12 GB"),
    # Measured: the two images it keeps (12.0 GB + 11.6 GB), BuildKit's cache mounts (uv's and pip's
    # downloads of both stacks' wheels, ~10 GB), the venv and the results (under 2 GB).
    "main-job": DiskNeed("main-job", "scripts/main-job.sh", engine_gb=36, scratch_gb=2,
                         basis="two kept images of 12.0 + 11.6 GB and ~10 GB of BuildKit cache"),
}


@dataclass(frozen=True, slots=True)
class Holding:
    """Space stackforge itself holds: how much, where, and the command that frees it."""

    what: str                 # "stack images" | "BuildKit cache" | "probe venvs"
    path: str                 # the folder it lies in (decides the filesystem)
    size_bytes: int | None    # None: not measured (``detail`` says why)
    free_command: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Filesystem:
    """One filesystem that a command writes to: its free space and what is written there."""

    mount: str
    free_bytes: int
    roles: tuple[str, ...]    # "engine data root", "temp dir", "checkout"


@dataclass(frozen=True, slots=True)
class DiskBudget:
    """The facts: the filesystems, the engine's data root, what stackforge holds (no judgement)."""

    filesystems: tuple[Filesystem, ...]
    engine_root: str
    engine_note: str          # how the engine's data root was found ("" when the engine said it)
    holdings: tuple[Holding, ...]
    override_gb: int | None = None


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One filesystem that cannot hold a command's need."""

    filesystem: Filesystem
    need_bytes: int


# --------------------------------------------------------------------------- judging (pure)

def need_bytes_by_filesystem(budget: DiskBudget, need: DiskNeed) -> list[tuple[Filesystem, int]]:
    """The bytes each filesystem must have free for ``need`` (the override, when set, replaces the
    whole need and falls on the engine's filesystem)."""
    result = []
    for fs in budget.filesystems:
        if budget.override_gb is not None:
            wanted = budget.override_gb * GB if "engine data root" in fs.roles else 0
        else:
            wanted = (need.engine_gb * GB if "engine data root" in fs.roles else 0) \
                + (need.scratch_gb * GB if {"temp dir", "checkout"} & set(fs.roles) else 0)
        if wanted:
            result.append((fs, wanted))
    return result


def shortfalls(budget: DiskBudget, need: DiskNeed) -> list[Shortfall]:
    return [Shortfall(fs, wanted) for fs, wanted in need_bytes_by_filesystem(budget, need) if fs.free_bytes < wanted]


def refusal_line(need: DiskNeed, budget: DiskBudget, short: list[Shortfall]) -> str:
    """One line: the need, what is free, what stackforge holds there (the commands that free it follow,
    one a line: :func:`free_lines`)."""
    parts = [f"{gb_text(s.need_bytes)} free on {s.filesystem.mount} and {gb_text(s.filesystem.free_bytes)} is"
             for s in short]
    mounts = {s.filesystem.mount for s in short}
    held = [f"{h.what} {gb_text(h.size_bytes)}" for h in budget.holdings
            if h.size_bytes and mount_of(h.path, budget) in mounts]
    source = f"{NEED_ENV}={budget.override_gb}" if budget.override_gb is not None else "docs/measurements.md"
    return (f"not enough disk: {need.script} needs {'; '.join(parts)} ({source}); stackforge holds there: "
            f"{', '.join(held) or 'nothing'}")


def free_lines(budget: DiskBudget) -> list[str]:
    """The command that frees each thing stackforge holds (only those that hold something), one a line."""
    return [f"stackforge holds {h.what} {gb_text(h.size_bytes)}{' (' + h.detail + ')' if h.detail else ''}; "
            f"to free it: {h.free_command}" for h in budget.holdings if h.size_bytes]


def reuse_line(budget: DiskBudget) -> str:
    """The way past a refusal when the run reuses stack images already here (``--resume`` on unchanged stacks):
    the need counts every image anew, since a changed stack's build cannot be known before it runs; ""
    when no stack image is held or the override is already set."""
    held = next((h for h in budget.holdings if h.what == "stack images"), None)
    if budget.override_gb is not None or held is None or not held.size_bytes:
        return ""
    return (f"the need counts the stack images here ({gb_text(held.size_bytes)}) as built anew; a run that reuses "
            f"them (--resume, stacks unchanged) may set {NEED_ENV}=N to the GB it adds")


def ok_line(need: DiskNeed, budget: DiskBudget) -> str:
    parts = [f"{gb_text(wanted)} of {gb_text(fs.free_bytes)} free on {fs.mount}"
             for fs, wanted in need_bytes_by_filesystem(budget, need)]
    return f"disk: {need.script} needs {'; '.join(parts)}: enough"


def mount_of(path: str, budget: DiskBudget) -> str:
    """The mount (of the budget's filesystems) that holds ``path``: the longest that prefixes it."""
    found = [fs.mount for fs in budget.filesystems if path == fs.mount or path.startswith(fs.mount.rstrip("/") + "/")]
    return max(found, key=len) if found else ""


def gb_text(size: int | None) -> str:
    return "?" if size is None else f"{size / GB:.1f} GB"


_UNITS = {"b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
          "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4}
_SIZE = re.compile(r"([0-9.]+)\s*([kmgt]i?b|b)\b", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """``11.7GB`` / ``87B`` / ``1.2kB`` (docker's units, decimal) as bytes; None when none is there."""
    match = _SIZE.search(text)
    if not match:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def buildx_total(du_output: str) -> int | None:
    """The ``Total:`` line of ``docker buildx du``."""
    for line in du_output.splitlines():
        if line.strip().lower().startswith("total:"):
            return parse_size(line)
    return None


def system_df_bytes(df_output: str) -> int | None:
    """The sum of ``docker system df --format '{{.Type}}\\t{{.Size}}'``: the engine's own usage
    (images, containers, volumes, build cache; docker rounds each to 3 digits)."""
    sizes = [parse_size(line.split("\t", 1)[1]) for line in df_output.splitlines() if "\t" in line]
    return sum(s for s in sizes if s is not None) if sizes else None


# --------------------------------------------------------------------------- gathering (the edges)

def _docker(*args: str) -> tuple[bool, str]:
    if runner.which("docker") is None:
        return False, "no docker CLI"
    try:
        result = runner.run(["docker", *args], timeout=TOOL_TIMEOUT_S)
    except HostError as exc:   # a fact to report, never a traceback
        return False, exc.message[:200]
    return result.succeeded, result.output_tail


def existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (the engine's root before the engine is installed)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def mount_point(path: Path) -> Path:
    path = existing(path.resolve())
    device = path.stat().st_dev
    while path != path.parent and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def engine_root() -> tuple[str, str]:
    answered, output = _docker("info", "--format", "{{.DockerRootDir}}")
    # docker info may print warnings (no swap limit support...) beside the answer.
    root = next((line.strip() for line in output.splitlines() if line.startswith("/")), "") if answered else ""
    if root:
        return root, ""
    return "/var/lib/docker", "the engine did not answer: its default data root"


def du_bytes(path: Path) -> int | None:
    if not path.exists():
        return 0
    try:
        result = runner.run(["du", "-s", "-B1", str(path)], timeout=DU_TIMEOUT_S)
    except HostError:   # not measured is a fact
        return None
    # The total is du's last line (a folder it cannot read is a line on stderr before it).
    totals = [line.split()[0] for line in result.output_tail.splitlines() if line.split()[:1] != []]
    return int(totals[-1]) if totals and totals[-1].isdigit() else None


def stack_images() -> Holding:
    command = f"docker image rm $(docker image ls -q --filter label={STACK_LABEL})"
    answered, output = _docker("image", "ls", "-q", "--no-trunc", "--filter", f"label={STACK_LABEL}")
    if not answered:
        return Holding("stack images", "", None, command, detail=output.strip()[-120:] or "docker image ls failed")
    ids = sorted(set(output.split()))
    if not ids:
        return Holding("stack images", "", 0, command)
    answered, sizes = _docker("image", "inspect", "--format", "{{.Size}}", *ids)
    total = sum(int(s) for s in sizes.split() if s.isdigit()) if answered else None
    return Holding("stack images", "", total, command,
                   detail=f"{len(ids)} image(s) labelled {STACK_LABEL}; layers they share counted in each")


def buildkit_cache() -> Holding:
    command = "docker buildx prune --force"
    answered, output = _docker("buildx", "du")
    total = buildx_total(output) if answered else None
    if total is None:
        answered, output = _docker("system", "df", "--format", "{{.Type}}\t{{.Size}}")
        line = next((ln for ln in output.splitlines() if ln.startswith("Build Cache")), "") if answered else ""
        total = parse_size(line.split("\t", 1)[-1]) if line else None
    detail = "the engine's, shared by everything it builds" if total is not None else "docker buildx du failed"
    return Holding("BuildKit cache", "", total, command, detail=detail)


def probe_venvs(environ: Mapping[str, str]) -> Holding:
    folder = Path(environ.get(PROBE_VENVS_ENV) or PROBE_VENVS_DEFAULT)
    return Holding("probe venvs", str(folder), du_bytes(folder), f"rm -rf {folder}",
                   detail=f"the tests' cache, capped at {PROBE_VENVS_CAP_GB} GB")


def gather(checkout: Path, environ: Mapping[str, str] | None = None) -> DiskBudget:
    """Measure the filesystems, the engine's data root and what stackforge holds."""
    environ = os.environ if environ is None else environ
    root, note = engine_root()
    places = {"engine data root": Path(root), "temp dir": Path(tempfile.gettempdir()), "checkout": checkout}
    by_mount: dict[Path, list[str]] = {}
    for role, path in places.items():
        by_mount.setdefault(mount_point(path), []).append(role)
    filesystems = tuple(Filesystem(str(mount), _free(mount), tuple(roles)) for mount, roles in by_mount.items())
    holdings = tuple(_placed(h, root) for h in (stack_images(), buildkit_cache())) + (probe_venvs(environ),)
    override = environ.get(NEED_ENV, "").strip()
    return DiskBudget(filesystems, root, note, holdings,
                      override_gb=int(override) if override.isdigit() else None)


def _free(mount: Path) -> int:
    stat = os.statvfs(mount)
    return stat.f_bavail * stat.f_frsize


def _placed(holding: Holding, root: str) -> Holding:
    return Holding(holding.what, holding.path or root, holding.size_bytes, holding.free_command, holding.detail)


# --------------------------------------------------------------------------- the scripts' entry point

USAGE = ("usage: python3 -m stackforge.doctor.disk_budget check {test|main-job} | engine-bytes | buildkit-keep\n"
         f"  {NEED_ENV}=N replaces the command's need (GB)")


def main(argv: list[str], say: Callable[[str], None] = print) -> int:
    """``check CMD``: 0 with one line when the disk holds CMD's run, else 3 with the commands that free
    what stackforge holds, one a line, then the refusal line; ``engine-bytes``: the engine's own usage in bytes (docker
    system df); ``buildkit-keep``: the BuildKit cache the test command keeps (``--keep-storage``)."""
    if argv[:1] == ["check"] and len(argv) == 2 and argv[1] in NEEDS:
        override = os.environ.get(NEED_ENV, "").strip()
        if override and not override.isdigit():
            say(f"error: {NEED_ENV}={override!r} is not a whole number of GB")
            return 2
        need = NEEDS[argv[1]]
        budget = gather(Path.cwd())
        short = shortfalls(budget, need)
        if not short:
            say(ok_line(need, budget))
            return 0
        # The refusal last: what a person reads first when the run stops.
        for line in [*free_lines(budget), reuse_line(budget)]:
            if line:
                say(line)
        say(refusal_line(need, budget, short))
        return 3
    if argv == ["engine-bytes"]:
        answered, output = _docker("system", "df", "--format", "{{.Type}}\t{{.Size}}")
        total = system_df_bytes(output) if answered else None
        say(str(total) if total is not None else "")
        return 0 if total is not None else 1
    if argv == ["buildkit-keep"]:
        say(f"{BUILDKIT_KEEP_GB}gb")
        return 0
    say(USAGE)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
