"""Shared helpers for stackforge probe scripts (standard library only).

Probe scripts run INSIDE a stack image as ``python3 /stackforge/probes/<file>.py [args]``; this
module is mounted with the in-image package at ``/stackforge/inimage``, which the runner puts on
``PYTHONPATH``, and imported as ``_sfprobe`` (the bench scripts import it too). It must import with
nothing but the standard library and ``_sfshared`` beside it (the result marker,
formulas and statistics the host imports too): torch, FlashInfer and SGLang are imported by the
scripts themselves, lazily, so that a missing or broken package becomes a clear result instead
of a traceback.

The result-line contract: a script prints human logs freely and, as its LAST stdout line, exactly::

    STACKFORGE_RESULT {"status": ..., "reason": ..., "evidence": ..., "metrics": {...}, "facts": {...}}

with status in pass | fail | skip | error | undecided | timeout. ``undecided``: the script ran but could not
reach the code path that decides the feature honestly (it needs a context only the real program
provides, such as a running server's published config); its evidence says why, and it is never a
pass or a fail. ``timeout``: a step the script watched itself (a JIT build under its own time limit)
did not finish in time, with what it had printed as evidence; the runner also assigns it when it kills
the whole script at its hard timeout. ``crash`` is assigned by the runner only, never by the script. :func:`emit` prints that line and ends the process at once
(``os._exit``) so no atexit hook, C library or child process can print after it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import importlib.metadata
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import platform
import re
import shutil
import signal
import site
import statistics
import struct
import subprocess
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import _sfshared  # beside this file: the result marker, formulas and statistics the host uses too
from _sffatbin import Arch, code_runs_on  # noqa: F401  (beside this file, shared with the wheel tier)

RESULT_PREFIX = _sfshared.RESULT_MARKER
STATUSES = ("pass", "fail", "skip", "error", "undecided", "timeout")
INTERCONNECTS = ("pcie", "nvlink", "nvswitch")
NO_GPU_REASON = "no CUDA device visible (torch.cuda.device_count()==0)"

# Evidence is the exact text a result was decided on; keep both ends of very long text because
# compilers and NCCL put the decisive line at the start or at the end.
EVIDENCE_LIMIT = 6000
#: A reason is one line a person reads; past this it is cut in the middle (the evidence holds the rest).
REASON_LIMIT = 2000

# Distributions whose installed versions are provenance for every record (asked-for is not
# installed: pip may resolve something else).
PROVENANCE_DISTRIBUTIONS = (
    "torch",
    "triton",
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "sglang",
    "sgl-kernel",
    "sglang-kernel",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime",
    "nvidia-cuda-nvcc-cu12",
    "nvidia-cuda-nvcc",
    "cuda-python",
    "apache-tvm-ffi",
)


# --------------------------------------------------------------------------------------------
# Target arguments
# --------------------------------------------------------------------------------------------

def parse_arch(text: str) -> Arch:
    """Parse a target compute capability ``"12.0"``; raises ValueError on anything else."""
    match = re.fullmatch(r"(\d{1,2})\.(\d)", text.strip())
    if not match:
        raise ValueError(f"--arch must look like 12.0 (compute capability), got {text!r}")
    return Arch(int(match.group(1)), int(match.group(2)))


def _arch_type(text: str) -> Arch:
    try:
        return parse_arch(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _gpus_type(text: str) -> int:
    value = int(text)
    if value < 0 or value > 1024:
        raise argparse.ArgumentTypeError(f"--gpus must be between 0 and 1024, got {value}")
    return value


def common_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the target arguments every probe script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--arch", type=_arch_type, default=parse_arch("12.0"),
                        help="target compute capability, e.g. 12.0 for sm_120")
    parser.add_argument("--gpus", type=_gpus_type, default=1, help="number of GPUs of the target")
    parser.add_argument("--interconnect", choices=INTERCONNECTS, default="pcie",
                        help="how the target's GPUs are connected")
    return parser


# --------------------------------------------------------------------------------------------
# Result emission
# --------------------------------------------------------------------------------------------

def one_line(text: object) -> str:
    """Collapse any whitespace (newlines included) so a reason stays on one line."""
    return " ".join(str(text).split())


def bound_text(text: str, limit: int = EVIDENCE_LIMIT) -> str:
    """Keep head and tail of long text, saying how much was cut from the middle."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n...[{cut} characters cut]...\n{text[-tail:]}"


def result_line(status: str, reason: str, evidence: str = "",
                metrics: Mapping[str, Any] | None = None, facts: Mapping[str, Any] | None = None) -> str:
    """The exact ``STACKFORGE_RESULT {...}`` line for these values (no newline)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    payload = {
        "status": status,
        "reason": one_line(bound_text(one_line(reason), REASON_LIMIT)),
        "evidence": bound_text(str(evidence)),
        "metrics": dict(metrics or {}),
        "facts": dict(facts or {}),
    }
    # default=str: a stray Path or Version in metrics must not cost the whole result.
    return RESULT_PREFIX + json.dumps(payload, sort_keys=True, default=str, ensure_ascii=True)


def emit(status: str, reason: str, evidence: str = "",
         metrics: Mapping[str, Any] | None = None, facts: Mapping[str, Any] | None = None) -> None:
    """Print the result as the last stdout line and end the process immediately."""
    line = result_line(status, reason, evidence, metrics, facts)
    sys.stderr.flush()
    sys.stdout.write("\n" + line + "\n")
    sys.stdout.flush()
    # os._exit: nothing may print after the result line (atexit hooks, NCCL teardown, FI logging).
    os._exit(0)


@dataclasses.dataclass(frozen=True, slots=True)
class ScriptResult:
    """A decided result, before it is printed: scripts that must clean up (temporary workspaces)
    decide first, clean up, then emit."""

    status: str
    reason: str
    evidence: str = ""
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def emit_result(result: ScriptResult, facts: Mapping[str, Any] | None = None,
                extra_metrics: Mapping[str, Any] | None = None) -> None:
    """:func:`emit` a :class:`ScriptResult`, merging ``extra_metrics`` under its own metrics."""
    metrics = {**dict(extra_metrics or {}), **dict(result.metrics)}
    emit(result.status, result.reason, result.evidence, metrics, facts)


def run_main(main: Callable[[Sequence[str]], None], argv: Sequence[str] | None = None) -> None:
    """Run a script's ``main``; an escaped exception still produces an ``error`` result line.

    ``main`` is expected to call :func:`emit`; returning without doing so is a bug in the script
    and is reported as an error too.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        main(args)
    except SystemExit as exc:
        # argparse usage errors exit 2 after printing usage; report them as errors.
        if exc.code not in (0, None):
            emit("error", f"probe arguments rejected (exit {exc.code})", evidence=" ".join(args))
        raise
    except BaseException as exc:  # noqa: BLE001 - the one place that turns anything into a result
        emit("error", f"probe script raised {describe_exception(exc)}", evidence=traceback_text(exc))
    emit("error", "probe script ended without a result (bug in the probe)")


# --------------------------------------------------------------------------------------------
# Exceptions as evidence
# --------------------------------------------------------------------------------------------

def describe_exception(exc: BaseException) -> str:
    """``RuntimeError: message`` plus its chain (``caused by: ...``) on one line."""
    parts = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = one_line(str(current))
        name = type(current).__name__
        parts.append(f"{name}: {text}" if text else name)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return " | caused by: ".join(parts)


def traceback_text(exc: BaseException, limit_lines: int = 40) -> str:
    """The last lines of the formatted traceback (the decisive frames are at the end)."""
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    return "\n".join(lines[-limit_lines:])


# --------------------------------------------------------------------------------------------
# Subprocesses with a hard timeout
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class ScriptCommand:
    """Outcome of one command: exit status (None when it timed out or could not start)."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    start_error: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def output(self) -> str:
        return (self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr).strip()


def run_command(argv: Sequence[str], timeout_s: float, *, env: Mapping[str, str] | None = None,
                cwd: str | None = None) -> ScriptCommand:
    """Run a command in its own process group; on timeout kill the whole group (nvcc spawns
    cicc/ptxas, ninja spawns nvcc: killing only the direct child would leave them running)."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", env=None if env is None else dict(env), cwd=cwd,
                                start_new_session=True)
    except OSError as exc:
        return ScriptCommand(tuple(argv), None, "", "", False, 0.0, start_error=describe_exception(exc))
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return ScriptCommand(tuple(argv), proc.returncode, out, err, False, time.monotonic() - started)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        return ScriptCommand(tuple(argv), None, out, err, True, time.monotonic() - started)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------------------------
# Locating things inside the image
# --------------------------------------------------------------------------------------------

def site_packages_dirs() -> tuple[str, ...]:
    """Every site-packages / dist-packages directory this interpreter can import from."""
    candidates: list[str] = []
    for getter in (site.getsitepackages,):
        try:
            candidates.extend(getter())
        except AttributeError:  # virtualenv's old site module
            pass
    try:
        candidates.append(site.getusersitepackages())
    except AttributeError:
        pass
    candidates.extend(sysconfig.get_paths().get(key, "") for key in ("purelib", "platlib"))
    candidates.extend(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    unique: list[str] = []
    for path in candidates:
        if path and os.path.isdir(path) and os.path.realpath(path) not in map(os.path.realpath, unique):
            unique.append(path)
    return tuple(unique)

def package_dirs(names: Sequence[str]) -> dict[str, str]:
    """{package: directory} for the import packages ``names`` installed in any site-packages (first found wins)."""
    found: dict[str, str] = {}
    for root in site_packages_dirs():
        for name in names:
            path = os.path.join(root, name)
            if name not in found and os.path.isdir(path):
                found[name] = path
    return found


def nvcc_candidates(explicit: str | None = None) -> tuple[str, ...]:
    """Where an image may keep nvcc, in the order CUDA tooling looks: an explicit path, then
    $CUDA_HOME / $CUDA_PATH, /usr/local/cuda, the CUDA 13 wheels (nvidia/cu13/bin), then PATH."""
    if explicit:
        return (explicit,)
    paths: list[str] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            paths.append(os.path.join(os.environ[var], "bin", "nvcc"))
    paths.append("/usr/local/cuda/bin/nvcc")
    for root in site_packages_dirs():
        paths.append(os.path.join(root, "nvidia", "cu13", "bin", "nvcc"))
        paths.append(os.path.join(root, "nvidia", "cuda_nvcc", "bin", "nvcc"))
    on_path = shutil.which("nvcc")
    if on_path:
        paths.append(on_path)
    unique: list[str] = []
    for path in paths:
        if path not in unique:
            unique.append(path)
    return tuple(unique)


#: What stackforge stored about the stack an image was built for (its stack.json layer).
STACK_JSON = "/opt/stackforge/stack.json"


def image_flavour(path: str = STACK_JSON) -> str:
    """The flavour (devel / runtime / wheels) the image was built as, "" outside a stackforge image."""
    try:
        with open(path, encoding="utf-8") as handle:
            flavour = json.load(handle).get("stack", {}).get("flavour")
    except (OSError, ValueError, AttributeError):
        return ""
    return flavour if isinstance(flavour, str) else ""


def no_nvcc(what: str, flavour: str | None = None) -> str:
    """The reason of a probe that needs nvcc in an image without one. Starts with the same words for
    every such probe: the image's flavour has no compiler (the runtime image, CUDA 12.x wheels, which
    carry ptxas only), which says nothing about the packages, so the probe skips instead of failing."""
    flavour = image_flavour() if flavour is None else flavour
    return f"no nvcc in this flavour{f' ({flavour})' if flavour else ''}: {what}"


def find_nvcc(explicit: str | None = None) -> str | None:
    """The first executable nvcc among :func:`nvcc_candidates`, or None."""
    for path in nvcc_candidates(explicit):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def flashinfer_cuda_home(environ: Mapping[str, str] | None = None) -> str:
    """FlashInfer's CUDA home when FlashInfer itself cannot be asked: $CUDA_HOME, $CUDA_PATH, the folder above
    the bin of the ``nvcc`` on PATH, else /usr/local/cuda; raises RuntimeError in FlashInfer's words when that
    does not exist (flashinfer-ai/flashinfer@v0.6.3:flashinfer/jit/cpp_ext.py:44-60 ``get_cuda_path``; the
    flashinfer-python 0.7.2 wheel's is the same at :48-64)."""
    environ = os.environ if environ is None else environ
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if home:
        return home
    on_path = shutil.which("nvcc", path=environ.get("PATH"))
    if on_path:
        return os.path.dirname(os.path.dirname(on_path))
    if not os.path.exists("/usr/local/cuda"):
        raise RuntimeError("Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist")
    return "/usr/local/cuda"


def flashinfer_nvcc(get_cuda_path: Callable[[], Any] | None = None,
                    environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(the nvcc FlashInfer's JIT will call, or "", where FlashInfer looked), as a serving run in this image finds it.

    FlashInfer's ninja file calls ``$FLASHINFER_NVCC``, else ``<CUDA home>/bin/nvcc``
    (flashinfer-ai/flashinfer@v0.6.3:flashinfer/jit/cpp_ext.py:233; 0.7.2 wheel :289), the CUDA home from
    ``get_cuda_path`` (FlashInfer's own when given, else :func:`flashinfer_cuda_home`). An nvcc elsewhere (the
    CUDA wheels' ``nvidia/cu13/bin``, not on PATH, no CUDA_HOME: what :func:`find_nvcc` also finds) is never
    FlashInfer's, so a JIT probe must not count it."""
    environ = os.environ if environ is None else environ
    explicit = environ.get("FLASHINFER_NVCC")
    if explicit:
        found = explicit if os.path.isabs(explicit) else shutil.which(explicit, path=environ.get("PATH"))
        usable = bool(found) and os.path.isfile(found) and os.access(found, os.X_OK)
        return (found if usable else ""), f"$FLASHINFER_NVCC={explicit}"
    try:
        home = str(get_cuda_path() if get_cuda_path is not None else flashinfer_cuda_home(environ))
    except Exception as exc:  # noqa: BLE001 - FlashInfer's own words are where it looked
        return "", f"no CUDA home ({describe_exception(exc)})"
    nvcc = os.path.join(home, "bin", "nvcc")
    return (nvcc if os.path.isfile(nvcc) and os.access(nvcc, os.X_OK) else ""), nvcc


def nvcc_version(nvcc: str, timeout_s: float = 60) -> tuple[str, str]:
    """(``"13.0"``, the full version line) from ``nvcc --version``; ("", error text) if it fails."""
    result = run_command([nvcc, "--version"], timeout_s)
    if not result.ok:
        return "", result.start_error or result.output or f"nvcc --version exited {result.returncode}"
    release = re.search(r"release (\d+\.\d+), (V[\d.]+)", result.stdout)
    if not release:
        return "", result.output
    return release.group(1), f"Cuda compilation tools, release {release.group(1)}, {release.group(2)}"


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, or None."""
    return _sfshared.installed_versions((distribution,)).get(distribution)


def try_import(module: str) -> tuple[Any, str]:
    """(module, "") or (None, the import error as one line)."""
    try:
        return importlib.import_module(module), ""
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return None, describe_exception(exc)


# --------------------------------------------------------------------------------------------
# Provenance facts
# --------------------------------------------------------------------------------------------

def collect_facts(*, torch_module: Any = None, import_torch: bool = True,
                  nvcc_path: str | None = None, search_nvcc: bool = True) -> dict[str, Any]:
    """What is actually inside this image: Python, installed versions, torch's build facts,
    nvcc, and (when visible) GPUs and driver. Never raises; unknowns are simply absent.

    Keys the result store reads as provenance: ``versions`` (distribution -> installed version),
    ``torch_arch_list``, ``torch_git_version``, ``torch_cuda``, ``nvcc`` (version line),
    ``driver``, ``gpus`` (names). ``nvcc_path`` reports that nvcc; otherwise nvcc is searched
    unless ``search_nvcc`` is False (a probe told to use one nvcc must not report another).
    """
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "versions": _sfshared.installed_versions(PROVENANCE_DISTRIBUTIONS),
    }
    torch = torch_module
    if torch is None and import_torch and facts["versions"].get("torch"):
        torch, error = try_import("torch")
        if error:
            facts["torch_import_error"] = error
    if torch is not None:
        facts.update(torch_facts(torch))
    nvcc = nvcc_path or (find_nvcc() if search_nvcc else None)
    if nvcc:
        release, line = nvcc_version(nvcc)
        facts["nvcc"] = line if release else f"unusable: {one_line(line)[:200]}"
        facts["nvcc_path"] = nvcc
    facts.update(gpu_facts())
    return facts


def torch_facts(torch: Any) -> dict[str, Any]:
    """torch's version, CUDA build, git version, compiled arch list and NCCL version."""
    build = _sfshared.torch_build_facts(torch)
    facts: dict[str, Any] = {"torch_version": build["version"], "torch_cuda": build["cuda"],
                             "torch_git_version": build["git_version"]}
    if build["arch_flags"] is not None:
        facts["torch_arch_list"] = build["arch_flags"].split()
    try:
        nccl = torch.cuda.nccl.version()
    except Exception as exc:  # noqa: BLE001 - CPU builds have no NCCL
        facts["torch_nccl_error"] = describe_exception(exc)[:200]
    else:
        facts["torch_nccl"] = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else str(nccl)
    try:
        facts["cuda_device_count"] = int(torch.cuda.device_count())
    except Exception as exc:  # noqa: BLE001
        facts["cuda_device_count_error"] = describe_exception(exc)
    return facts


#: The compile-time arch list of torch (the probes' name for the shared reader).
torch_arch_flags = _sfshared.torch_arch_flags


def gpu_facts(timeout_s: float = 30) -> dict[str, Any]:
    """GPU names, compute capabilities and driver from nvidia-smi (no CUDA context is created,
    which matters before spawning ranks) and /proc/driver/nvidia/version."""
    facts: dict[str, Any] = {}
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as handle:
            facts["driver_banner"] = one_line(handle.readline())
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return facts
    result = run_command([smi, "--query-gpu=index,name,compute_cap,driver_version,pci.bus_id",
                          "--format=csv,noheader"], timeout_s)
    if not result.ok:
        facts["nvidia_smi_error"] = one_line(result.start_error or result.output)[:500]
        return facts
    details = []
    for row in result.stdout.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) >= 5:
            details.append({"index": cells[0], "name": cells[1], "compute_cap": cells[2],
                            "driver": cells[3], "pci_bus_id": cells[4]})
    facts["gpus"] = [d["name"] for d in details]
    facts["gpu_details"] = details
    if details:
        facts["driver"] = details[0]["driver"]
    return facts


class _LogCollector(logging.Handler):
    """Keeps each message once (a record reaches both a child logger and its parent)."""

    def __init__(self, level: int, messages: list[str]) -> None:
        super().__init__(level=level)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message not in self.messages:
            self.messages.append(message)


@contextmanager
def captured_logs(*names: str, level: int = logging.WARNING) -> Iterator[list[str]]:
    """What the named loggers log at ``level`` and above while the block runs, each message once: how
    gate code that logs rather than raises (FlashInfer's device detection, SGLang's disabled
    communicators, ServerArgs saying what it turned on) gives its answer. A logger that would drop
    ``level`` is lowered to it for the block."""
    messages: list[str] = []
    handler = _LogCollector(level, messages)
    loggers = [logging.getLogger(name) for name in names]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        if logger.getEffectiveLevel() > level:
            logger.setLevel(level)
        logger.addHandler(handler)
    try:
        yield messages
    finally:
        for logger, level_before in zip(loggers, saved):
            logger.removeHandler(handler)
            logger.setLevel(level_before)


@contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    """Temporarily replace ``target.name`` (used to emulate a target GPU for gate code that only
    asks torch for a capability or a world size)."""
    missing = object()
    old = getattr(target, name, missing)
    setattr(target, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(target, name)
        else:
            setattr(target, name, old)


# --------------------------------------------------------------------------------------------
# Multi-rank harness: each rank in its own process, the parent enforces a timeout per phase
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class RankEvent:
    """One report from a rank: a phase started, finished, failed or was skipped."""

    rank: int
    phase: str
    state: str  # start | ok | fail (fatal) | check-fail (an attempt) | skip | done
    detail: str = ""
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    at: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class RanksOutcome:
    """What the parent observed of all ranks."""

    events: tuple[RankEvent, ...]
    exitcodes: tuple[int | None, ...]
    hung: tuple[int, str, float] | None  # (rank, phase, seconds without progress)
    closed_first: tuple[int, ...] = ()  # ranks whose process ended on its own, in that order

    def failures(self) -> tuple[RankEvent, ...]:
        return tuple(e for e in self.events if e.state == "fail")

    def phase_events(self, phase: str, state: str = "ok") -> tuple[RankEvent, ...]:
        return tuple(e for e in self.events if e.phase == phase and e.state == state)

    def nccl_facts(self) -> dict[str, Any]:
        """``nccl`` (version) and ``gpus`` (names) as the ranks reported them in their ``init`` phase."""
        init = self.phase_events("init")
        if not init or "nccl" not in init[0].data:
            return {}
        return {"nccl": init[0].data["nccl"], "gpus": sorted({e.data.get("gpu", "") for e in init})}

    def crashed(self) -> tuple[tuple[int, int], ...]:
        """(rank, exit code) of ranks that died on their own without reporting ``done``, first
        death first (ranks the parent killed afterwards are not crashes)."""
        done = {e.rank for e in self.events if e.state == "done"}
        return tuple((rank, self.exitcodes[rank]) for rank in self.closed_first
                     if rank not in done and self.exitcodes[rank] not in (0, None))

    def log(self) -> str:
        """A readable per-event log for evidence."""
        lines = []
        for e in self.events:
            tail = f": {e.detail}" if e.detail else ""
            lines.append(f"[{e.at:7.2f}s] rank {e.rank} {e.phase} {e.state}{tail}")
        return "\n".join(lines)


class RankReporter:
    """Handed to a rank's worker: reports phases to the parent over a pipe.

    Sends are synchronous (a pipe, not a queue with a feeder thread) so that the parent knows a
    phase started even if the rank then hangs inside NCCL forever.
    """

    def __init__(self, rank: int, conn: multiprocessing.connection.Connection) -> None:
        self.rank = rank
        self._conn = conn
        self._t0 = time.monotonic()
        self.reported_failure = False

    def send(self, phase: str, state: str, detail: str = "", **data: Any) -> None:
        self._conn.send(RankEvent(self.rank, phase, state, one_line(detail)[:2000], dict(data),
                                  time.monotonic() - self._t0))

    @contextmanager
    def phase(self, name: str, budget_s: float | None = None) -> Iterator[dict[str, Any]]:
        """``with reporter.phase("eager") as data: ...`` reports start, then ok (with ``data``) or
        fail (with the exception) and re-raises so the worker stops. ``budget_s``: how long this phase may
        make no progress before it counts as a hang, instead of the run's phase timeout (a first JIT
        compile is slow, not hung)."""
        if budget_s is None:
            self.send(name, "start")
        else:
            self.send(name, "start", budget_s=budget_s)
        data: dict[str, Any] = {}
        try:
            yield data
        except BaseException as exc:
            self.send(name, "fail", describe_exception(exc), traceback=traceback_text(exc, 12))
            self.reported_failure = True
            raise
        self.send(name, "ok", **data)

    @contextmanager
    def attempt(self, name: str) -> Iterator[dict[str, Any]]:
        """Like :meth:`phase` but a failure is reported and swallowed, so the worker can go on
        to its next independent check (one all-reduce variant failing says nothing of another)."""
        self.send(name, "start")
        data: dict[str, Any] = {}
        try:
            yield data
        except Exception as exc:  # noqa: BLE001 - reported, then the next check runs
            self.send(name, "check-fail", describe_exception(exc), traceback=traceback_text(exc, 12))
            return
        self.send(name, "ok", **data)


# Exceptions that mean the probe itself is broken (an API it calls moved), not that the feature
# failed: a rank failing with one of these is an ``error`` result, anything else a ``fail``.
PROBE_BUG_EXCEPTIONS = ("AttributeError", "TypeError", "NameError", "ImportError", "ModuleNotFoundError",
                        "SyntaxError")


def failure_status(detail: str) -> str:
    """``error`` for a probe bug (see PROBE_BUG_EXCEPTIONS), ``fail`` for anything else."""
    return "error" if detail.split(":", 1)[0].strip() in PROBE_BUG_EXCEPTIONS else "fail"


def ranks_result(outcome: RanksOutcome, what: str) -> ScriptResult | None:
    """The result when the ranks did not all finish cleanly (hang, failure, crash), else None.

    A hang is a measured outcome (NCCL hanging on a PCIe box is the finding), so it is a ``fail``
    with the phase it hung in; ``timeout`` is reserved for the runner killing the whole script.
    """
    log = outcome.log()
    if outcome.hung is not None:
        rank, phase, seconds = outcome.hung
        return ScriptResult("fail", f"{what}: rank {rank} made no progress in phase '{phase}' for {seconds:.0f} s "
                            "(hang); all ranks were killed", log)
    failures = outcome.failures()
    if failures:
        first = failures[0]
        tb = first.data.get("traceback", "")
        return ScriptResult(failure_status(first.detail), f"{what}: rank {first.rank} failed in phase "
                            f"'{first.phase}': {first.detail}", log + (f"\n{tb}" if tb else ""))
    crashed = outcome.crashed()
    if crashed:
        rank, code = crashed[0]
        last = [e.phase for e in outcome.events if e.rank == rank]
        where = last[-1] if last else "startup"
        return ScriptResult("fail", f"{what}: rank {rank} died ({rank_signal_name(code)}) in phase '{where}'", log)
    return None


def _rank_entry(worker: Callable[..., None], rank: int, world_size: int, options: Mapping[str, Any],
                conn: multiprocessing.connection.Connection) -> None:
    reporter = RankReporter(rank, conn)
    try:
        worker(rank, world_size, dict(options), reporter)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        if not reporter.reported_failure:
            reporter.send("worker", "fail", describe_exception(exc), traceback=traceback_text(exc, 12))
        conn.close()
        os._exit(1)
    reporter.send("worker", "done")
    conn.close()


def run_ranks(worker: Callable[..., None], world_size: int, options: Mapping[str, Any], *,
              phase_timeout_s: float, env: Mapping[str, str] | None = None,
              total_timeout_s: float | None = None) -> RanksOutcome:
    """Run ``worker(rank, world_size, options, reporter)`` in ``world_size`` spawned processes.

    The parent watches every rank's current phase; a phase that makes no progress for
    ``phase_timeout_s`` (a hang, the norm for NCCL on PCIe boxes) ends the run: all ranks are
    killed and the hung (rank, phase) is reported. ``worker`` must be a module-level function of
    the calling script (spawn pickles it by name). When this returns, or when SIGTERM / SIGINT
    ends the script meanwhile, every rank and everything a rank started is gone, a process in its
    own session included (this process adopts orphans: :func:`adopt_orphans`).
    """
    ctx = multiprocessing.get_context("spawn")
    adopt_orphans()
    with ending_descendants_on_signal():
        return _spawn_and_watch(ctx, worker, world_size, options, phase_timeout_s, env, total_timeout_s)


def _spawn_and_watch(ctx: Any, worker: Callable[..., None], world_size: int, options: Mapping[str, Any],
                     phase_timeout_s: float, env: Mapping[str, str] | None,
                     total_timeout_s: float | None) -> RanksOutcome:
    saved_env = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})  # spawned children inherit the parent's environment
    procs, conns = [], []
    try:
        for rank in range(world_size):
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_rank_entry, args=(worker, rank, world_size, dict(options), child_conn),
                               name=f"sf-rank{rank}")
            proc.start()
            child_conn.close()
            procs.append(proc)
            conns.append(parent_conn)
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        return _watch_ranks(procs, conns, phase_timeout_s, total_timeout_s)
    finally:
        # What the ranks started and left behind (a subprocess in its own session, a server) dies
        # with them: the ranks are gone by now, so every descendant but multiprocessing's helper is.
        end_descendants(keep=_multiprocessing_helpers())


# --------------------------------------------------------------------------------------------
# Nothing a probe started outlives it
# --------------------------------------------------------------------------------------------

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def adopt_orphans() -> bool:
    """Make this process the subreaper of everything below it (Linux ``prctl``): a grandchild whose
    rank died, even one in its own session, is re-parented here instead of to init, so
    :func:`end_descendants` still finds it. False where the kernel or libc cannot."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendant_pids(root: int) -> list[int]:
    """Every process below ``root`` (children before grandchildren), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after the command name: state, ppid, ...
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    queue = list(children.get(root, ()))
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(children.get(pid, ()))
    return found


def end_descendants(keep: Sequence[int] = (), settle_s: float = 2.0) -> list[int]:
    """SIGKILL every process below this one except ``keep`` (and what is below those), reap the
    ones that are (or become, as their parents die) this process's children; the pids killed."""
    kept = set(keep)
    for pid in list(kept):
        kept.update(descendant_pids(pid))
    doomed = [pid for pid in descendant_pids(os.getpid()) if pid not in kept]
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + settle_s
    waiting = set(doomed)
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            try:
                reaped, _ = os.waitpid(pid, os.WNOHANG)
                if reaped:
                    waiting.discard(pid)
            except ChildProcessError:  # not (yet) ours: its parent reaps it, or it is re-parented here
                if not os.path.exists(f"/proc/{pid}"):
                    waiting.discard(pid)
        if waiting:
            time.sleep(0.05)
    return doomed


def _multiprocessing_helpers() -> tuple[int, ...]:
    """multiprocessing's own helper processes (the resource tracker), which outlive a run by design."""
    try:
        from multiprocessing import resource_tracker
        pid = getattr(resource_tracker._resource_tracker, "_pid", None)  # noqa: SLF001 - no public accessor
    except (ImportError, AttributeError):
        return ()
    return (pid,) if pid else ()


@contextmanager
def ending_descendants_on_signal() -> Iterator[None]:
    """While ranks run: SIGTERM (the runner stopping a probe at its timeout) or SIGINT first ends
    every descendant, ranks and whatever they started, then takes its usual course."""
    def handler(signum: int, frame: Any) -> None:
        end_descendants(keep=_multiprocessing_helpers(), settle_s=1.0)
        signal.signal(signum, previous.get(signum, signal.SIG_DFL))
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)

    previous: dict[int, Any] = {}
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread: signals cannot be handled here
        previous.clear()
    try:
        yield
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)


def _watch_ranks(procs: list[Any], conns: list[Any], phase_timeout_s: float,
                 total_timeout_s: float | None, after_failure_grace_s: float = 20.0) -> RanksOutcome:
    t0 = time.monotonic()
    events: list[RankEvent] = []
    last_progress = [t0] * len(procs)
    budget = [phase_timeout_s] * len(procs)   # a phase may bring its own (reporter.phase(budget_s=...))
    current = ["spawn"] * len(procs)
    finished = [False] * len(procs)
    closed_first: list[int] = []
    first_failure_at: float | None = None
    hung: tuple[int, str, float] | None = None
    open_conns = dict(enumerate(conns))
    while open_conns:
        ready = multiprocessing.connection.wait(list(open_conns.values()), timeout=0.5)
        now = time.monotonic()
        for conn in ready:
            rank = next(r for r, c in open_conns.items() if c is conn)
            try:
                event = conn.recv()
            except (EOFError, OSError):
                del open_conns[rank]
                closed_first.append(rank)
                if not finished[rank] and first_failure_at is None:
                    first_failure_at = now  # died or failed without finishing
                continue
            events.append(dataclasses.replace(event, at=now - t0))
            last_progress[rank] = now
            current[rank] = event.phase
            if event.state == "start":
                budget[rank] = float(event.data.get("budget_s", phase_timeout_s))
            finished[rank] = finished[rank] or event.state == "done"
            if event.state == "fail" and first_failure_at is None:
                first_failure_at = now
        if first_failure_at is not None:
            # Peers of a failed rank usually block in the next collective; that is a consequence,
            # not a hang of its own, so give them a short grace and stop.
            if now - first_failure_at > min(after_failure_grace_s, phase_timeout_s):
                break
            continue
        stalled = [r for r in open_conns if not finished[r] and now - last_progress[r] > budget[r]]
        if stalled:
            rank = stalled[0]
            hung = (rank, current[rank], now - last_progress[rank])
            break
        if total_timeout_s is not None and now - t0 > total_timeout_s and open_conns:
            rank = min(open_conns)
            hung = (rank, current[rank], now - last_progress[rank])
            break
    # Ranks still running now are stuck (or were told to stop): no grace for them.
    _stop_processes(procs, grace_s=0.0 if open_conns else 5.0)
    return RanksOutcome(tuple(events), tuple(p.exitcode for p in procs), hung, tuple(closed_first))


def _stop_processes(procs: list[Any], grace_s: float = 5.0) -> None:
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=2.0)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=2.0)


#: Where rendezvous ports are drawn from when the ephemeral range starts above it (see free_tcp_port).
RENDEZVOUS_PORTS = (20000, 32767)
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_tcp_port(attempts: int = 200, rng: Any = None) -> int:
    """A free localhost port for the process-group rendezvous.

    The port is chosen here and bound later by rank 0's TCPStore, so something else may take it in
    between. A port the kernel hands out itself (a bind to port 0) is in the ephemeral range, which
    the kernel also gives every outgoing connection made meanwhile; a port below that range is only
    ever taken by a process that names it. So: a random port of :data:`RENDEZVOUS_PORTS` under the
    ephemeral range that binds now; the kernel's pick only when none does.
    """
    import random
    import socket

    rng = rng or random.SystemRandom()
    low, high = RENDEZVOUS_PORTS
    high = min(high, ephemeral_range()[0] - 1)
    for _ in range(attempts if high > low else 0):
        port = rng.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it assigns itself (Linux default 32768-60999)."""
    try:
        with open(EPHEMERAL_RANGE_FILE, encoding="utf-8") as handle:
            low, high = (int(v) for v in handle.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def rank_signal_name(exitcode: int | None) -> str:
    """``SIGSEGV`` for a process killed by signal 11 (negative exit code), else ``exit N``."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit {exitcode}"


# --------------------------------------------------------------------------------------------
# Helpers for the runtime (GPU) probes; torch is passed in or imported lazily
# --------------------------------------------------------------------------------------------

def gpu_preflight(gpus: int, arch: Arch | None = None) -> tuple[str, str, Any]:
    """("", "", torch) when the first ``gpus`` visible devices exist and, when ``arch`` is given, are
    of the target's compute capability (a result measured on other GPUs says nothing about the
    target); else (status, reason, torch)."""
    torch, error = try_import("torch")
    if torch is None:
        return "skip", f"torch is not importable: {error}", None
    count = torch.cuda.device_count()
    if count == 0:
        return "skip", NO_GPU_REASON, torch
    if count < gpus:
        return "skip", f"needs {gpus} GPUs, {count} visible", torch
    if arch is not None:
        others = sorted({f"{major}.{minor}" for major, minor in
                         (torch.cuda.get_device_capability(i) for i in range(gpus))} - {arch.dotted})
        if others:
            return "skip", (f"visible GPUs have compute capability {', '.join(others)}, the target is "
                            f"{arch.dotted}: results here would not speak for it"), torch
    return "", "", torch


def multi_gpu_preflight(backend: str, gpus: int, arch: Arch | None = None) -> tuple[str, str, Any]:
    """("", "", torch) when a multi-rank run can go ahead, else (status, reason, torch).

    With NCCL the GPUs must pass :func:`gpu_preflight`; gloo needs only torch.
    """
    if backend == "nccl":
        status, reason, torch = gpu_preflight(gpus, arch)
        if status:
            return status, reason, torch
    else:
        torch, error = try_import("torch")
        if torch is None:
            return "skip", f"torch is not importable: {error}", None
    if gpus < 2:
        return "skip", f"a collective across GPUs needs at least 2 ranks (--gpus {gpus})", torch
    return "", "", torch


def init_nccl_rank(torch: Any, dist: Any, rank: int, world_size: int, options: Mapping[str, Any]) -> Any:
    """Pin a rank of :func:`run_ranks` to GPU ``rank`` and join the NCCL process group; return its device.

    The rendezvous is ``tcp://127.0.0.1:<options["port"]>``; ``options["collective_timeout_s"]``
    bounds every collective, so a peer that never arrives ends in an error, not a silent wait.
    """
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{options['port']}", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=options["collective_timeout_s"]))
    return device


def median_us(fn: Callable[[], Any], sync: Callable[[], Any], iters: int) -> float:
    """Median wall time of ``fn`` in microseconds over ``iters`` runs, each synchronised."""
    samples = []
    for _ in range(max(iters, 1)):
        start = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - start) * 1e6)
    return round(statistics.median(samples), 1)


def check_allreduce_sum(tensor: Any, world_size: int, where: str) -> float:
    """Raise AssertionError unless every element equals 1 + 2 + ... + world_size (rank r
    contributed r + 1); returns the largest deviation."""
    expected = world_size * (world_size + 1) / 2
    error = float((tensor.double() - expected).abs().max().item())
    if error > 1e-6:
        raise AssertionError(f"{where}: all_reduce result off by up to {error} "
                             f"(expected every element = {expected})")
    return error


# --------------------------------------------------------------------------------------------
# torch symmetric memory: what its all-reduce kernels are built for
# --------------------------------------------------------------------------------------------

#: dtypes every torch.ops.symm_mem all-reduce kernel is compiled for: AT_DISPATCH_FLOAT_AND_BFLOAT16
#: (bfloat16, float32) in pytorch torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu
#: (read at 03a4032ba32d4eddaf2f98b8efb65d9746744764); float16 reaches no kernel.
SYMM_MEM_DTYPES = ("bfloat16", "float32")
#: Ops compiled for fixed world sizes only (DISPATCH_WORLD_SIZES_NO_DEFAULT: "Not implemented for
#: world_size=N"); the other all-reduce ops have a generic world-size kernel (DISPATCH_WORLD_SIZES).
SYMM_MEM_FIXED_WORLD_SIZES = {"two_shot_all_reduce_out": (2, 4, 8)}
#: Ops that need a multicast object ("multicast support is required").
SYMM_MEM_MULTICAST_OPS = ("multimem_all_reduce_", "multimem_one_shot_all_reduce")
#: The pytorch commit the dtype and world-size tables above were read at (the compiled kernels of a torch
#: wheel carry no source to read them from again).
SYMM_MEM_TABLE_COMMIT = "03a4032ba32d4eddaf2f98b8efb65d9746744764"


def symm_mem_unsupported(op: str, world_size: int, dtype: str, multicast: bool | None = None,
                         torch_git: str | None = None) -> str | None:
    """Why torch has no kernel for ``op`` at this world size and dtype (None: it has one). An
    unsupported case is ``unsupported``, not a failure: nothing was tried that could fail.

    The dtype and world-size tables hold for the torch they were read in (:data:`SYMM_MEM_TABLE_COMMIT`);
    given the image's torch (``torch.version.git_version``), a reason from them says which torch that was
    when it is another one."""
    if dtype not in SYMM_MEM_DTYPES:
        return (f"torch.ops.symm_mem.{op} has no {dtype} kernel (its kernels are built for "
                f"{' and '.join(SYMM_MEM_DTYPES)} only{_read_in(torch_git)})")
    sizes = SYMM_MEM_FIXED_WORLD_SIZES.get(op)
    if sizes is not None and world_size not in sizes:
        return (f"torch.ops.symm_mem.{op} is built for world sizes {', '.join(map(str, sizes))} only "
                f"(not {world_size}{_read_in(torch_git)})")
    if op in SYMM_MEM_MULTICAST_OPS and multicast is False:
        return f"torch.ops.symm_mem.{op} needs multicast, which these devices lack (handle.multicast_ptr == 0)"
    return None


def _read_in(torch_git: str | None) -> str:
    """``; read in pytorch 03a4032ba32d, not this image's torch (git ...)`` when the image's torch is another."""
    if not torch_git or torch_git == SYMM_MEM_TABLE_COMMIT:
        return ""
    return f"; read in pytorch {SYMM_MEM_TABLE_COMMIT[:12]}, not in this image's torch (git {torch_git[:12]})"


# --------------------------------------------------------------------------------------------
# SGLang's custom all-reduce, chosen the way SGLang chooses it
# --------------------------------------------------------------------------------------------

SGLANG_CUSTOM_AR_MODULE = "sglang.srt.distributed.device_communicators.custom_all_reduce"
SGLANG_CUSTOM_AR_UTILS_MODULE = "sglang.srt.distributed.device_communicators.custom_all_reduce_utils"
SGLANG_P2P_CHECK_SKIPPED = "skipped, as an SGLang server does without --enable-p2p-check"


def skip_sglang_p2p_check() -> str:
    """Skip SGLang's own P2P test the way a server does, before its custom all-reduce is constructed;
    returns what the record says about the check.

    SGLang's ``gpu_p2p_access_check`` asks ``get_world_group()`` for the local rank and a barrier,
    state that only SGLang's own distributed bootstrap creates (0.5.9: "world group is not
    initialized"; 0.5.23 through ``get_parallel().world_group``); a probe that builds its own process
    groups crashes in it. A server never runs it either: unless ``--enable-p2p-check``, it calls
    ``monkey_patch_p2p_access_check()`` first (0.5.9 ``ModelRunner.init_torch_distributed``, 0.5.23
    ``distributed/bootstrap.py``). SGLang's own function is used, then the name is rebound in
    ``custom_all_reduce`` too, because 0.5.9 imports ``gpu_p2p_access_check`` by name there and an
    import that happened first would keep the unpatched check. The copy that really crosses the
    link is the p2p probe's business.
    """
    utils = importlib.import_module("sglang.srt.utils")
    utils.monkey_patch_p2p_access_check()
    patched_check = importlib.import_module(SGLANG_CUSTOM_AR_UTILS_MODULE).gpu_p2p_access_check
    custom_ar = importlib.import_module(SGLANG_CUSTOM_AR_MODULE)
    if hasattr(custom_ar, "gpu_p2p_access_check"):
        custom_ar.gpu_p2p_access_check = patched_check
    return SGLANG_P2P_CHECK_SKIPPED


def sglang_custom_allreduce_class(group: Any, device: Any) -> tuple[Any, str]:
    """The custom all-reduce class SGLang's own ``GroupCoordinator`` would construct, and its name.

    SGLang picks it with ``dispatch_custom_allreduce``: in 0.5.9 without arguments (CUDA gets
    ``CustomAllreduce``); in 0.5.23 with ``group=, device=`` (CUDA gets the JIT-compiled
    ``CustomAllReduceV2`` when ``can_use_custom_all_reduce_v2`` admits the group, i.e. full NVLink,
    else ``CustomAllreduce``; ``SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2=0`` forces the legacy one).
    Releases without the dispatcher construct ``CustomAllreduce`` directly. Asking the dispatcher
    instead of naming a class keeps the probe on the path a server really takes.
    """
    import inspect

    module = importlib.import_module(SGLANG_CUSTOM_AR_MODULE)
    dispatch = getattr(module, "dispatch_custom_allreduce", None)
    if dispatch is None:
        chosen = module.CustomAllreduce
    elif inspect.signature(dispatch).parameters:
        chosen = dispatch(group=group, device=device)
    else:
        chosen = dispatch()
    return chosen, callable_name(chosen)


#: SGLang's JIT-compiled custom all-reduce (0.5.23: CustomAllReduceV2's kernels and registries).
SGLANG_JIT_ALL_REDUCE = "sglang.kernels.ops.communication.all_reduce"


def warm_sglang_custom_allreduce_jit(chosen: Any, world_size: int, torch: Any) -> dict[str, Any]:
    """Build what SGLang's custom all-reduce JIT-compiles on first use, before any timed phase, and time it.

    In 0.5.23 ``CustomAllReduceV2`` builds three modules once per process on first use
    (``sglang/kernels/ops/communication/all_reduce.py``: ``_init_communicator``, ``_init_ipc_manager`` and
    ``get_all_reduce_module(dtype, world_size)``, each ``cache_once``); in a phase with a collective's
    timeout a slow first compile reads as a hang. ``CustomAllreduce`` runs prebuilt sgl-kernel ops.
    """
    name = callable_name(chosen)
    if "V2" not in name:
        return {"jit": f"nothing to build: {name} runs prebuilt kernels"}
    module = importlib.import_module(SGLANG_JIT_ALL_REDUCE)
    started = time.monotonic()
    built = []
    for init in ("_init_communicator", "_init_ipc_manager"):
        step = getattr(module, init, None)
        if step is not None:
            step()
            built.append(init)
    kernel = getattr(module, "get_all_reduce_module", None)
    if kernel is not None:
        kernel(torch.bfloat16, world_size)
        built.append(f"get_all_reduce_module(bfloat16, {world_size})")
    return {"jit": ", ".join(built) or f"nothing found to build in {SGLANG_JIT_ALL_REDUCE}",
            "jit_s": round(time.monotonic() - started, 1)}


def callable_name(obj: Any) -> str:
    """``Class`` for a class, ``Class(partial)`` for a functools.partial of one (SGLang's ROCm path)."""
    inner = getattr(obj, "func", None)
    if inner is not None:
        return f"{callable_name(inner)}(partial)"
    return getattr(obj, "__qualname__", None) or type(obj).__name__


# --------------------------------------------------------------------------------------------
# Shared objects: what they link and export, and why a load failed
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class ElfDynamic:
    """What the dynamic loader and the import system see of a shared object.

    Attributes:
        needed: the DT_NEEDED libraries (``libc10.so``, ``libcuda.so.1``), in file order.
        py_init: the Python module name ``X`` of an exported ``PyInit_X`` ("" for a plain shared object:
            a torch op library, a TVM-FFI module, a C library).
        error: why the file could not be read ("" when it was).
    """

    needed: tuple[str, ...] = ()
    py_init: str = ""
    error: str = ""


_SHT_DYNAMIC = 6
_DT_NEEDED = 1
_PY_INIT = re.compile(rb"\0PyInit_([A-Za-z_][A-Za-z0-9_]*)\0")


def elf_dynamic(path: str) -> ElfDynamic:
    """Read a shared object's dynamic section (standard library only, the section headers and the
    ``.dynamic`` / ``.dynstr`` pair they point to; the rest of a 400 MB kernel library is never read)."""
    try:
        with open(path, "rb") as handle:
            ident = handle.read(64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF":
                return ElfDynamic(error="not an ELF file")
            is64, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
            if is64:
                shoff = struct.unpack_from(order + "Q", ident, 40)[0]
                shentsize, shnum = struct.unpack_from(order + "HH", ident, 58)
                layout = order + "IIQQQQII"
            else:
                shoff = struct.unpack_from(order + "I", ident, 32)[0]
                shentsize, shnum = struct.unpack_from(order + "HH", ident, 46)
                layout = order + "IIIIIIII"
            handle.seek(shoff)
            table = handle.read(shentsize * shnum)
            sections = [struct.unpack_from(layout, table, i * shentsize)
                        for i in range(len(table) // shentsize) if shentsize >= struct.calcsize(layout)]
            dynamic = next((s for s in sections if s[1] == _SHT_DYNAMIC), None)
            if dynamic is None or dynamic[6] >= len(sections):
                return ElfDynamic(error="no dynamic section (a static object)")
            _, _, _, _, dyn_offset, dyn_size, link, _ = dynamic
            _, _, _, _, str_offset, str_size, _, _ = sections[link]
            handle.seek(str_offset)
            strings = handle.read(str_size)
            handle.seek(dyn_offset)
            entries = handle.read(dyn_size)
    except (OSError, struct.error, IndexError) as exc:
        return ElfDynamic(error=describe_exception(exc))
    entry = "qQ" if is64 else "iI"
    step = struct.calcsize(order + entry)
    needed = []
    for index in range(len(entries) // step):
        tag, value = struct.unpack_from(order + entry, entries, index * step)
        if tag == 0:
            break
        if tag == _DT_NEEDED and value < len(strings):
            needed.append(strings[value:strings.find(b"\0", value)].decode("utf-8", "replace"))
    init = _PY_INIT.search(b"\0" + strings)
    return ElfDynamic(tuple(needed), init.group(1).decode() if init else "")


_UNDEFINED_SYMBOL = re.compile(r"undefined symbol: ([A-Za-z_$.][\w$.@]*)")
_MISSING_LIBRARY = re.compile(r"([\w.+-]+\.so(?:\.[\w.]+)?): cannot open shared object file")


def undefined_symbol(error: str) -> str:
    """The symbol of a loader's ``undefined symbol: _ZN3c10...`` error ("" when it names none)."""
    match = _UNDEFINED_SYMBOL.search(error)
    return match.group(1) if match else ""


def missing_library(error: str) -> str:
    """The library of a loader's ``libX.so.1: cannot open shared object file`` error ("" when none)."""
    match = _MISSING_LIBRARY.search(error)
    return match.group(1) if match else ""


def demangle(symbols: Sequence[str], timeout_s: float = 30) -> dict[str, str]:
    """{mangled: demangled} by the image's ``c++filt`` (binutils); {} without one, and a symbol it leaves
    as it was is left out: the caller shows the mangled name, which is exact, rather than guess."""
    tool = shutil.which("c++filt")
    wanted = [s for s in dict.fromkeys(symbols) if s]
    if not tool or not wanted:
        return {}
    done = run_command([tool, *wanted], timeout_s)
    lines = done.stdout.splitlines() if done.ok else []
    return {m: d for m, d in zip(wanted, lines) if d and d != m} if len(lines) == len(wanted) else {}


def _toolkit_dirs(*subdirs: str) -> list[str]:
    """``subdirs`` of every place an image may keep a CUDA toolkit: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda,
    then each CUDA wheel under ``site-packages/nvidia`` (``cuda_runtime`` for CUDA 12, ``cu13`` for 13)."""
    roots = [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)] + ["/usr/local/cuda"]
    for root in site_packages_dirs():
        nvidia = os.path.join(root, "nvidia")
        if os.path.isdir(nvidia):
            roots += [os.path.join(nvidia, name) for name in sorted(os.listdir(nvidia))]
    return [os.path.join(root, sub) for root in roots for sub in subdirs]


def _existing_files(dirs: Sequence[str], names: Sequence[str]) -> tuple[str, ...]:
    found: list[str] = []
    for directory in dirs:
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and path not in found:
                found.append(path)
    return tuple(found)


def libcuda_stub_candidates() -> tuple[str, ...]:
    """Where an image may keep the CUDA driver's link stub ``libcuda.so``, which a compiled extension that
    links ``libcuda.so.1`` can be loaded against where no driver is: the toolkit's ``lib64/stubs``
    ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda, NVIDIA's devel images) and the CUDA wheels' ``lib/stubs``."""
    stubs = ("lib64/stubs", "lib/stubs", f"targets/{platform.machine()}-linux/lib/stubs")
    return _existing_files(_toolkit_dirs(*stubs), ("libcuda.so", "libcuda.so.1"))


def cuda_header_candidates() -> tuple[str, ...]:
    """The driver API's header ``cuda.h`` of the image's CUDA, first found first: the toolkit's ``include``
    ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda) and the CUDA runtime wheels' (never a copy another package
    bundles for itself, such as Triton's, whose release is Triton's choice)."""
    return _existing_files(_toolkit_dirs("include", f"targets/{platform.machine()}-linux/include"), ("cuda.h",))
