"""Verify a built image from the inside with pytest-testinfra: is the stack really what it claims?

Tags lie (a release tag over an rc, a CPU torch that silently replaced the CUDA one), so the build
record keeps what is measured here. A container idles in the image (started through
:func:`stackforge.edges.docker_engine.idle_container`: labelled, host network, always removed);
``testinfra.get_host("docker://<id>")`` then runs the checks:

* python, torch (base version, wheel variant, ``torch.version.cuda``), FlashInfer (+ addons), the
  kernel package and SGLang: installed versions equal the stack's pins;
* nvcc present on devel and CUDA 13.x wheels images (its version reported), absent-by-design otherwise;
* where there is nvcc, a JIT link as FlashInfer's builder makes it (:func:`jit_link_check`): a CUDA shared
  object calling the runtime and the driver API links, its libcudart resolves inside the image and its
  libcuda.so.1 is left to the driver (never the link stub); without nvcc the check says the image
  cannot JIT-compile;
* ``pip check`` clean (lines about packages installed with ``--no-deps`` are excused, and shown);
* the labels the Dockerfile set, plus content hash and freeze, are on the image;
* ``/opt/stackforge/freeze.txt`` still equals ``pip freeze --all`` (nothing drifted after the freeze);
  the freeze read here is also what the build's metadata step puts into the freeze label.

Every check carries the actual value it was decided on.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import docker
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackforge.build.metadata import CONTENT_HASH_LABEL, FREEZE_LABEL, FREEZE_PATH
from stackforge.core.errors import BuildError, CommandError
from stackforge.core.model import Stack
from stackforge.core.records import Status
from stackforge.core.versions import minor_of
from stackforge.edges import docker_engine
from stackforge.inimage import _sfshared
from stackforge.plan.derive import Derived

COMMAND_TIMEOUT_S = 300
# The verification container ends by itself after this long (more than every check's limit together),
# so one left behind by a killed run does not idle for ever.
CONTAINER_LIFETIME_S = 10 * COMMAND_TIMEOUT_S
_NVCC_RELEASE = re.compile(r"release (\d+\.\d+), (V[\w.]+)")

# Runs inside the image with its own python (stdlib only; torch only if installed): the shared
# image-facts readers of _sfshared.py (the same ones every probe record's facts come from), then this.
_FACTS_MAIN = r"""
import sys
facts = {"python": "%d.%d.%d" % sys.version_info[:3], "packages": installed_versions(sys.argv[1:])}
try:
    import torch
    build = torch_build_facts(torch)
    facts["torch"] = {**build, "arch_flags": build["arch_flags"] or ""}
except Exception as exc:
    facts["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
print("STACKFORGE_FACTS " + json.dumps(facts, sort_keys=True))
"""


def facts_program() -> str:
    """The ``python -c`` program that prints the image's facts: _sfshared.py's text, then
    :data:`_FACTS_MAIN` (nothing is mounted into the verification container, so the shared file
    travels as the program)."""
    return Path(_sfshared.__file__).read_text(encoding="utf-8") + _FACTS_MAIN


@dataclass(frozen=True, slots=True)
class ImageCheck:
    """One verification check: its status, what was expected and what was found (evidence)."""

    name: str
    status: Status
    expected: str
    actual: str
    evidence: str = ""


@dataclass(frozen=True, slots=True)
class ImageVerification:
    """What the image really contains, and whether that matches the stack."""

    image: str
    checks: tuple[ImageCheck, ...]
    installed: dict[str, str] = field(default_factory=dict)   # package -> version, measured
    torch: dict[str, Any] = field(default_factory=dict)       # version, cuda, git_version, arch_flags
    nvcc: str | None = None
    freeze: tuple[str, ...] = ()                              # /opt/stackforge/freeze.txt, as read
    duration_s: float = 0.0

    @property
    def status(self) -> Status:
        statuses = {c.status for c in self.checks}
        for worst in (Status.ERROR, Status.FAIL):
            if worst in statuses:
                return worst
        return Status.PASS

    @property
    def failures(self) -> tuple[ImageCheck, ...]:
        return tuple(c for c in self.checks if c.status in (Status.FAIL, Status.ERROR))

    def summary(self) -> str:
        """One line: the failed checks with expected vs actual, or 'all N checks passed'."""
        if not self.failures:
            return f"all {len(self.checks)} checks passed"
        return "; ".join(f"{c.name}: expected {c.expected}, found {c.actual}" for c in self.failures)

    def with_check(self, check: ImageCheck) -> "ImageVerification":
        """This report plus one more check (the label check runs on the final, labelled image)."""
        return replace(self, checks=(*self.checks, check))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("freeze")   # kept in the build record's own freeze field
        data["status"] = self.status.value
        data["checks"] = [{**check, "status": check["status"].value} for check in data["checks"]]
        return data


def verify_image(client: docker.DockerClient, image: str, stack: Stack, derived: Derived, *,
                 no_deps: frozenset[str] = frozenset(), labels: Mapping[str, str] | None = None) -> ImageVerification:
    """Run every in-container check against ``image`` (always removes its container).

    The labels are checked separately (:func:`label_check`) on the final image: the build adds some
    of them after this, from what this found (the freeze).

    Raises:
        BuildError: the container could not be started at all.
    """
    import testinfra  # imported here: it loads pytest, which the commands that do not verify never need

    started = time.monotonic()
    with running_container(client, image, labels=labels or {}) as container_id:
        host = testinfra.get_host(f"docker://{container_id}")
        facts = _facts(host, stack, derived)
        freeze_check, freeze = _freeze_check(host)
        checks = [*_version_checks(stack, derived, facts), _nvcc_check(host, stack, derived),
                  jit_link_check(host, derived), _pip_check(host, stack, derived, no_deps), freeze_check]
    nvcc = next((c.actual for c in checks if c.name == "nvcc" and c.status is Status.PASS), None)
    return ImageVerification(image=image, checks=tuple(checks), installed=dict(facts.get("packages", {})),
                             torch=dict(facts.get("torch", {})), nvcc=nvcc, freeze=freeze,
                             duration_s=round(time.monotonic() - started, 2))


@contextmanager
def running_container(client: docker.DockerClient, image: str, *, labels: Mapping[str, str]) -> Iterator[str]:
    """A container idling in ``image`` (host network, labelled; :func:`stackforge.edges.docker_engine.idle_container`),
    removed on the way out."""
    with ExitStack() as stack:
        try:
            container_id = stack.enter_context(docker_engine.idle_container(client, image, labels=labels,
                                                                            lifetime_s=CONTAINER_LIFETIME_S))
        except CommandError as exc:
            raise BuildError(f"cannot start a verification container from {image}: {exc.message}") from None
        yield container_id


# ------------------------------------------------------------------------------------------ checks


def _run(host: Any, command: str, *args: str) -> Any:
    """Run in the container with a hard limit (testinfra's docker exec has none)."""
    return host.run(f"timeout {COMMAND_TIMEOUT_S} {command}", *args)


def _package_names(stack: Stack, derived: Derived) -> list[str]:
    names = ["torch", "flashinfer-python", "sglang", "pip"]
    names += [f"flashinfer-{addon}" for addon in stack.flashinfer_addons]
    if derived.kernel_package:
        names.append(derived.kernel_package)
    return names


def _facts(host: Any, stack: Stack, derived: Derived) -> dict[str, Any]:
    result = _run(host, "python -c %s" + " %s" * len(_package_names(stack, derived)), facts_program(),
                  *_package_names(stack, derived))
    for line in reversed(result.stdout.splitlines()):
        if line.startswith("STACKFORGE_FACTS "):
            return dict(json.loads(line.removeprefix("STACKFORGE_FACTS ")))
    raise BuildError(f"verification could not read versions from the image (exit {result.rc}): "
                     f"{(result.stderr or result.stdout).strip()[-300:]}")


def _same_version(actual: str | None, expected: str) -> bool:
    if actual is None:
        return False
    try:
        return Version(actual) == Version(expected)
    except InvalidVersion:
        return actual == expected


def _version_check(name: str, actual: str | None, expected: str) -> ImageCheck:
    status = Status.PASS if _same_version(actual, expected) else Status.FAIL
    return ImageCheck(name, status, expected, actual or "not installed", evidence=f"{name}=={actual}")


def _version_checks(stack: Stack, derived: Derived, facts: dict[str, Any]) -> list[ImageCheck]:
    packages = facts.get("packages", {})
    python = str(facts.get("python", ""))
    checks = [ImageCheck("python", Status.PASS if python.startswith(f"{stack.python}.") else Status.FAIL,
                         stack.python, python, evidence=f"sys.version_info -> {python}")]
    checks += _torch_checks(stack, derived, facts)
    checks.append(_version_check("flashinfer-python", packages.get("flashinfer-python"), stack.flashinfer))
    for addon in stack.flashinfer_addons:
        name = f"flashinfer-{addon}"
        checks.append(_version_check(name, packages.get(name), stack.flashinfer))
    if derived.kernel_package and derived.kernel_version:
        checks.append(_version_check(derived.kernel_package, packages.get(derived.kernel_package),
                                     derived.kernel_version))
    checks.append(_version_check("sglang", packages.get("sglang"), stack.sglang))
    return checks


def _torch_checks(stack: Stack, derived: Derived, facts: dict[str, Any]) -> list[ImageCheck]:
    torch = facts.get("torch")
    if not torch:
        error = facts.get("torch_error", "torch is not installed")
        return [ImageCheck("torch", Status.FAIL, stack.torch, "cannot import torch", evidence=str(error))]
    version = str(torch["version"])
    parsed = Version(version)
    base_ok = parsed.public == Version(stack.torch).public
    evidence = f"torch.__version__={version} torch.version.cuda={torch.get('cuda')}"
    checks = [ImageCheck("torch", Status.PASS if base_ok else Status.FAIL, stack.torch, parsed.public, evidence)]
    # The variant: a local tag (+cu130, +cpu) must name it; torch.version.cuda must match its CUDA.
    actual_cuda = torch.get("cuda")
    cuda_ok = (actual_cuda is None and derived.torch_cuda is None) or (
        actual_cuda is not None and derived.torch_cuda is not None
        and minor_of(str(actual_cuda)) == minor_of(derived.torch_cuda))
    local_ok = parsed.local is None or parsed.local == derived.torch_variant
    actual_variant = f"{parsed.local or 'no local tag'}, cuda {actual_cuda}"
    checks.append(ImageCheck("torch-variant", Status.PASS if cuda_ok and local_ok else Status.FAIL,
                             f"{derived.torch_variant}, cuda {derived.torch_cuda}", actual_variant, evidence))
    return checks


def _nvcc_check(host: Any, stack: Stack, derived: Derived) -> ImageCheck:
    result = _run(host, "sh -c %s", "command -v nvcc && nvcc --version")
    output = (result.stdout + result.stderr).strip()
    found = _NVCC_RELEASE.search(output)
    if not derived.has_nvcc:
        where = output.splitlines()[0] if result.rc == 0 and output else "not on PATH"
        return ImageCheck("nvcc", Status.SKIP, "none (runtime-only image)", where,
                          evidence=output[-300:] or "command -v nvcc: not found")
    if result.rc != 0 or not found:
        return ImageCheck("nvcc", Status.FAIL, f"nvcc {minor_of(stack.cuda)}", "missing",
                          evidence=output[-300:] or f"exit {result.rc}")
    release = found.group(1)
    status = Status.PASS if release == minor_of(stack.cuda) else Status.FAIL
    return ImageCheck("nvcc", status, f"release {minor_of(stack.cuda)}", f"release {release}, {found.group(2)}",
                      evidence=output.splitlines()[-1] if output else "")


# The JIT link, run in the image with its own environment. The toolkit is where FlashInfer looks (CUDA_HOME,
# CUDA_PATH, else nvcc's folder, else /usr/local/cuda) and the link flags are exactly its own
# (flashinfer-python 0.7.2 wheel: flashinfer/jit/cpp_ext.py:48-64 get_cuda_path, 273-279 ldflags); nvcc links,
# as FlashInfer's nvcc_link rule does (cpp_ext.py:338), so nvcc's default link flags apply as well. The object
# calls one runtime-API and one driver-API function: both libraries must really be linked.
JIT_LINK_SCRIPT = r"""
cuda_home=${CUDA_HOME:-${CUDA_PATH:-}}
if [ -z "$cuda_home" ]; then
    if nvcc_path=$(command -v nvcc); then cuda_home=${nvcc_path%/bin/nvcc}; else cuda_home=/usr/local/cuda; fi
fi
work=$(mktemp -d) && cd "$work" || exit 1
trap 'rm -rf "$work"' EXIT
cat > jit.cu <<'SOURCE'
#include <cuda.h>
#include <cuda_runtime_api.h>
extern "C" int stackforge_jit_link(void) {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cuDriverGetVersion(&driver);
    return runtime + driver;
}
SOURCE
echo "CUDA_HOME $cuda_home"
if ! "$cuda_home/bin/nvcc" -shared -Xcompiler -fPIC jit.cu -o jit.so \
        -L"$cuda_home/lib64" -L"$cuda_home/lib64/stubs" -lcudart -lcuda > link.log 2>&1; then
    echo "LINK FAILED"
    cat link.log
    exit 1
fi
readelf -d jit.so | sed -n 's/.*(NEEDED).*\[\(.*\)\]/NEEDED \1/p'
ldd jit.so | sed -n 's/^[[:space:]]*\([^ ]*\) => \(.*\)$/LDD \1 \2/p'
for lib in $(ldd jit.so | awk '$1 ~ /^libcud/ && $3 ~ /^\// {print $3}'); do echo "REAL $lib $(readlink -f "$lib")"; done
"""
JIT_LINK_EXPECTED = "-lcudart -lcuda link; libcudart in the image, libcuda.so.1 left to the driver"
# The linker's own words, quoted when the link fails.
_LINKER_WORDS = re.compile(r"cannot find -l\S+|undefined reference to [^\n]+|[^\n]*error[^\n]*", re.IGNORECASE)


def jit_link_check(host: Any, derived: Derived) -> ImageCheck:
    """Link a CUDA shared object in the image as a JIT builder does (``host``: a testinfra host)."""
    if not derived.has_nvcc:
        return ImageCheck("jit-link", Status.SKIP, "none (no nvcc)", "no nvcc: this image cannot JIT-compile",
                          evidence="the stack's toolkit has no nvcc (io.stackforge.jit=unavailable:no-nvcc)")
    result = _run(host, "sh -c %s", JIT_LINK_SCRIPT)
    return judge_jit_link(result.rc, result.stdout + result.stderr)


def judge_jit_link(rc: int, output: str) -> ImageCheck:
    """The ``jit-link`` check from what :data:`JIT_LINK_SCRIPT` printed (pure)."""
    lines = output.splitlines()
    evidence = output.strip()[-1500:]
    if "LINK FAILED" in lines:
        words = list(dict.fromkeys(match.group(0).strip().rstrip(":") for match in _LINKER_WORDS.finditer(output)))
        return ImageCheck("jit-link", Status.FAIL, JIT_LINK_EXPECTED,
                          "link failed: " + ("; ".join(words[:4]) or f"nvcc exit status {rc}"), evidence)
    needed = [line.split(" ", 1)[1] for line in lines if line.startswith("NEEDED ")]
    resolved = {parts[1]: parts[2].split(" (0x", 1)[0]
                for parts in (line.split(" ", 2) for line in lines if line.startswith("LDD ")) if len(parts) == 3}
    real = {parts[1]: parts[2] for parts in (line.split(" ", 2) for line in lines if line.startswith("REAL "))
            if len(parts) == 3}
    if rc != 0 or not needed:
        return ImageCheck("jit-link", Status.FAIL, JIT_LINK_EXPECTED, f"no linked object to read (exit status {rc})",
                          evidence)
    cudart = next((name for name in needed if name.startswith("libcudart.so.")), None)
    if cudart is None or "libcuda.so.1" not in needed:
        return ImageCheck("jit-link", Status.FAIL, JIT_LINK_EXPECTED,
                          f"jit.so needs {', '.join(needed)}, not libcudart.so.N and libcuda.so.1", evidence)
    cudart_path = resolved.get(cudart, "not found")
    if not cudart_path.startswith("/"):
        return ImageCheck("jit-link", Status.FAIL, JIT_LINK_EXPECTED, f"{cudart} => {cudart_path}", evidence)
    driver = resolved.get("libcuda.so.1", "not found")
    if "/stubs/" in driver or "/stubs/" in real.get(driver, ""):
        return ImageCheck("jit-link", Status.FAIL, JIT_LINK_EXPECTED,
                          f"libcuda.so.1 => {driver}: the link stub would shadow the driver", evidence)
    driver_text = "not found (left to the driver)" if driver == "not found" else f"{driver} (a libcuda in the image)"
    return ImageCheck("jit-link", Status.PASS, JIT_LINK_EXPECTED,
                      f"linked; {cudart} => {real.get(cudart_path, cudart_path)}; libcuda.so.1 => {driver_text}",
                      evidence)


def _pip_check(host: Any, stack: Stack, derived: Derived, no_deps: frozenset[str]) -> ImageCheck:
    result = _run(host, "pip check")
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    if result.rc == 0:
        return ImageCheck("pip-check", Status.PASS, "no broken requirements", "clean", evidence=" | ".join(lines))
    excused = _no_deps_packages(stack, derived, no_deps)
    unexcused = [line for line in lines if line.split(" ", 1)[0].lower() not in excused]
    if unexcused:
        return ImageCheck("pip-check", Status.FAIL, "no broken requirements", f"{len(unexcused)} broken",
                          evidence=" | ".join(unexcused)[:2000])
    return ImageCheck("pip-check", Status.PASS, "no broken requirements",
                      f"clean except {len(lines)} line(s) about --no-deps packages ({', '.join(sorted(excused))})",
                      evidence=" | ".join(lines)[:2000])


def _no_deps_packages(stack: Stack, derived: Derived, no_deps: frozenset[str]) -> set[str]:
    """Distribution names (as pip check prints them, lower case) of the layers installed --no-deps."""
    names: set[str] = set()
    if "flashinfer" in no_deps:
        names |= {"flashinfer-python", "flashinfer_python"} | {f"flashinfer-{a}" for a in stack.flashinfer_addons}
    if "kernel" in no_deps and derived.kernel_package:
        names |= {derived.kernel_package, derived.kernel_package.replace("-", "_")}
    if "sglang" in no_deps:
        names.add("sglang")
    return names


def _freeze_check(host: Any) -> tuple[ImageCheck, tuple[str, ...]]:
    """freeze.txt must still equal ``pip freeze --all``; returns the check and the stored freeze."""
    stored = _run(host, "cat %s", FREEZE_PATH)
    now = _run(host, "pip freeze --all")
    if stored.rc != 0:
        return ImageCheck("freeze", Status.FAIL, f"{FREEZE_PATH} present", "missing", evidence=stored.stderr[-300:]), ()
    lines = tuple(line.strip() for line in stored.stdout.splitlines() if line.strip())
    before, after = set(lines), {line.strip() for line in now.stdout.splitlines() if line.strip()}
    if before == after:
        return ImageCheck("freeze", Status.PASS, "freeze.txt == pip freeze", f"{len(after)} packages, unchanged"), lines
    drift = sorted(before ^ after)
    return ImageCheck("freeze", Status.FAIL, "freeze.txt == pip freeze", f"{len(drift)} lines differ",
                      evidence=" ".join(drift)[:2000]), lines


def label_check(client: docker.DockerClient, image: str, expected: Sequence[tuple[str, str]]) -> ImageCheck:
    """The Dockerfile's labels with their values, plus the content hash and freeze, are on ``image``."""
    actual = client.images.get(image).labels or {}
    wrong = [f"{key}={actual.get(key)!r} (want {value!r})" for key, value in expected if actual.get(key) != value]
    missing = [key for key in (CONTENT_HASH_LABEL, FREEZE_LABEL) if not actual.get(key)]
    if wrong or missing:
        return ImageCheck("labels", Status.FAIL, f"{len(expected)} stack labels + content hash + freeze",
                          f"{len(wrong)} wrong, {len(missing)} missing", evidence="; ".join(wrong + missing)[:2000])
    return ImageCheck("labels", Status.PASS, f"{len(expected)} stack labels + content hash + freeze",
                      f"{len(actual)} labels present", evidence=f"{CONTENT_HASH_LABEL}={actual[CONTENT_HASH_LABEL]}")


#: What ``python -m venv`` puts into every venv itself; a lock never names it.
VENV_OWN = frozenset({"pip"})


def lock_check(freeze: Sequence[str], lock_pins: Sequence[str]) -> ImageCheck:
    """``pip freeze --all`` of the image lists exactly the lock's venv packages (besides the venv's pip)."""
    installed = {_freeze_name(line): line for line in freeze if "==" in line}
    wanted = {_freeze_name(pin): pin for pin in lock_pins}
    wrong = [f"{installed[n]} (lock: {wanted[n]})" for n in sorted(wanted.keys() & installed.keys())
             if installed[n].split("==", 1)[1] != wanted[n].split("==", 1)[1]]
    missing = [wanted[n] for n in sorted(wanted.keys() - installed.keys())]
    extra = [installed[n] for n in sorted(installed.keys() - wanted.keys() - VENV_OWN)]
    expected = f"the {len(wanted)} packages of the stack lock"
    if wrong or missing or extra:
        evidence = "; ".join([*(f"other version: {w}" for w in wrong), *(f"missing: {m}" for m in missing),
                              *(f"not in the lock: {e}" for e in extra)])
        return ImageCheck("lock", Status.FAIL, expected, f"{len(wrong)} other versions, {len(missing)} missing, "
                          f"{len(extra)} not locked", evidence=evidence[:2000])
    return ImageCheck("lock", Status.PASS, expected, f"pip freeze lists exactly those ({len(installed)} with the "
                      f"venv's own {', '.join(sorted(VENV_OWN & installed.keys())) or 'nothing'})")


def _freeze_name(line: str) -> str:
    return canonicalize_name(line.split("==", 1)[0].split(" @ ", 1)[0].strip())
