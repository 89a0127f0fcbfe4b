"""Create a Debian base image without any container registry (debootstrap + ``docker import``).

Development and CI machines cannot pull images, but they can reach Debian's package archive. This
module builds ``stackforge/debian:bookworm`` (Debian 12, Python 3.11, pip, venv, CA certificates) from
scratch in about a minute::

    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \\
        bookworm ROOT http://deb.debian.org/debian
    tar -C ROOT -c . | docker import - stackforge/debian:bookworm

The mirror is plain http on purpose: Debian's archive is signed (apt verifies the Release file with
the archive keyring), so TLS adds nothing and would need this machine's local CA
(``/etc/ssl/certs/ca-certificates.crt``). debootstrap downloads with the host's wget, which trusts the
host's CA store, so an https mirror works too; the CA does not end up in the image either way.

Run it as a module (``sudo python -m stackforge.edges.bootstrap``) or through ``stackforge bootstrap-base``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import docker.models.images

from stackforge.core.errors import CommandError, HostError, StackforgeError, UnsafeValueError
from stackforge.edges import docker_engine, runner

DEFAULT_REF = "stackforge/debian:bookworm"
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
INCLUDED_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
#: Label on the base image; deliberately not MANAGED_LABEL, so run cleanup never removes the base.
BASE_LABEL = f"{docker_engine.LABEL_PREFIX}.base"
DEFAULT_TIMEOUT_S = 1800.0

_SUITE_RE = re.compile(r"^[a-z][a-z0-9-]{1,30}$")
_REF_RE = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,200}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")
_MIRROR_RE = re.compile(r"^(http|https|file)://[A-Za-z0-9._~:/@%+-]+$")


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    """The base image and how it came to be.

    Attributes:
        ref: the image reference (``stackforge/debian:bookworm``).
        image_id: the engine's image id (``sha256:...``).
        created: False when the image already existed and nothing was done.
        duration_s: seconds spent (debootstrap + tar + import), 0 when nothing was done.
        size_bytes: the image size the engine reports.
    """

    ref: str
    image_id: str
    created: bool
    duration_s: float
    size_bytes: int

    def describe(self) -> str:
        """One line for the terminal."""
        size = f"{self.size_bytes / 1e6:.0f} MB"
        if not self.created:
            return f"{self.ref} already exists ({self.image_id[:19]}, {size}); use --force to rebuild"
        return f"created {self.ref} ({self.image_id[:19]}, {size}) in {self.duration_s:.1f} s"


def bootstrap_base(
    client: docker.DockerClient,
    *,
    ref: str = DEFAULT_REF,
    suite: str = DEFAULT_SUITE,
    mirror: str = DEFAULT_MIRROR,
    force: bool = False,
    workdir: Path | None = None,
    log_path: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    report: Callable[[str], None] | None = None,
) -> BootstrapResult:
    """Build the registry-free base image, unless it already exists.

    Args:
        client: from :func:`stackforge.edges.docker_engine.connect`.
        ref: image reference to create.
        suite: Debian suite for debootstrap (``bookworm`` gives Python 3.11).
        mirror: Debian archive URL.
        force: rebuild even when ``ref`` already exists.
        workdir: where the temporary root filesystem goes (needs about 0.5 GB); default: TMPDIR.
        log_path: file that receives debootstrap's and tar's full output.
        timeout: seconds for debootstrap, and again for the tar step.
        report: called with a one-line progress message before each long step.

    Raises:
        HostError: not root, or debootstrap / tar missing.
        CommandError / CommandTimeout: debootstrap or tar failed; the error carries the output tail.
        UnsafeValueError: ``ref``, ``suite`` or ``mirror`` is not a plain value (they reach argv and labels).
    """
    _check_arguments(ref, suite, mirror)
    say = report or (lambda message: None)
    existing = _existing_image(client, ref)
    if existing is not None and not force:
        return BootstrapResult(ref, existing.id, False, 0.0, int(existing.attrs.get("Size", 0)))
    debootstrap = _debootstrap_program()
    _require_root()
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="stackforge-rootfs-", dir=workdir))
    try:
        root, tarball = scratch / "root", scratch / "rootfs.tar"
        say(f"debootstrap {suite} from {mirror} into {root} (about a minute)")
        runner.check_run(_debootstrap_argv(debootstrap, suite, root, mirror), timeout=timeout,
                         log_path=log_path)
        _trim_rootfs(root)
        say(f"packing the root filesystem and importing it as {ref}")
        runner.check_run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tarball), "."],
                         timeout=timeout, log_path=log_path)
        image_id = _import(client, tarball, ref, suite)
    finally:
        remove_tree(scratch)
    if existing is not None and existing.id != image_id:
        _drop_replaced_image(client, existing.id)
    image = client.images.get(image_id)
    return BootstrapResult(ref, image.id, True, time.monotonic() - started, int(image.attrs.get("Size", 0)))


def import_changes(suite: str) -> list[str]:
    """The Dockerfile instructions applied on import: a shell as default command, UTF-8, labels."""
    return [
        'CMD ["/bin/bash"]',
        "ENV LANG=C.UTF-8",
        # Official Debian images set PATH; an imported image has none unless we say so.
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"LABEL {BASE_LABEL}=debootstrap {BASE_LABEL}.suite={suite}",
    ]


def remove_tree(path: Path) -> None:
    """Delete a scratch root filesystem, unmounting anything left mounted inside it first.

    debootstrap mounts /proc (and sometimes /sys or /dev) inside the target and unmounts them when it
    exits normally. If it was killed, they stay mounted, and a plain recursive delete would descend
    into the host's /proc or /dev. So: unmount, verify, and only then delete.
    """
    if not path.exists():
        return
    for mount_point in mounts_under(path):
        runner.run(["umount", "--lazy", str(mount_point)], timeout=60)
    still_mounted = mounts_under(path)
    if still_mounted:
        raise HostError(f"refusing to delete {path}: {still_mounted[0]} is still mounted",
                        remedy=f"umount it, then rm -rf {path}")
    shutil.rmtree(path)


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path``, deepest first (from /proc/self/mountinfo)."""
    base = path.resolve()
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    points = [Path(_unescape_mount_path(line.split()[4])) for line in lines if len(line.split()) > 4]
    inside = [p for p in points if p == base or base in p.parents]
    return sorted(set(inside), key=lambda p: len(p.parts), reverse=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m stackforge.edges.bootstrap``: build the base image and print how long it took."""
    parser = argparse.ArgumentParser(prog="python -m stackforge.edges.bootstrap", description=__doc__.split("\n")[0])
    parser.add_argument("--ref", default=DEFAULT_REF, help=f"image to create (default {DEFAULT_REF})")
    parser.add_argument("--suite", default=DEFAULT_SUITE, help=f"Debian suite (default {DEFAULT_SUITE})")
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help=f"Debian mirror (default {DEFAULT_MIRROR})")
    parser.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    parser.add_argument("--log", type=Path, default=None, help="write debootstrap's full output here")
    args = parser.parse_args(argv)
    try:
        client = docker_engine.connect()
        result = bootstrap_base(client, ref=args.ref, suite=args.suite, mirror=args.mirror, force=args.force,
                                log_path=args.log, report=lambda message: print(message, flush=True))
    except StackforgeError as error:
        tail = getattr(error, "output_tail", "")
        if tail:
            print(tail.rstrip()[-3000:], file=sys.stderr)
        print(f"error: {error.one_line()}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("interrupted; the temporary root filesystem was removed", file=sys.stderr)
        return 130
    print(result.describe(), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- internals


def _check_arguments(ref: str, suite: str, mirror: str) -> None:
    """Reject values that could smuggle options or odd characters into commands and labels."""
    if not _REF_RE.match(ref):
        raise UnsafeValueError(f"not a plain image reference: {ref!r}")
    if not _SUITE_RE.match(suite):
        raise UnsafeValueError(f"not a Debian suite name: {suite!r}")
    if not _MIRROR_RE.match(mirror):
        raise UnsafeValueError(f"not an http(s):// or file:// mirror URL: {mirror!r}")


def _existing_image(client: docker.DockerClient, ref: str) -> docker.models.images.Image | None:
    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def _debootstrap_program() -> str:
    # debootstrap lives in /usr/sbin, which is not on every user's PATH.
    found = runner.which("debootstrap") or runner.which("/usr/sbin/debootstrap")
    if found is None:
        raise HostError("debootstrap is not installed",
                        remedy="apt-get install debootstrap (or run sudo scripts/setup-engine.sh)")
    return found


def _require_root() -> None:
    if os.geteuid() != 0:
        raise HostError("bootstrap-base must run as root: debootstrap creates device nodes and chroots",
                        remedy="run it with sudo")


def _debootstrap_argv(program: str, suite: str, root: Path, mirror: str) -> list[str]:
    return [program, "--variant=minbase", f"--include={','.join(INCLUDED_PACKAGES)}", suite, str(root), mirror]


def _trim_rootfs(root: Path) -> None:
    """Drop the downloaded .deb files and package lists: they are cache, not system (~40 MB)."""
    for folder in (root / "var/cache/apt/archives", root / "var/lib/apt/lists"):
        for entry in folder.glob("*"):
            if entry.is_file() and entry.name != "lock":
                entry.unlink()


def _import(client: docker.DockerClient, tarball: Path, ref: str, suite: str) -> str:
    """Stream the tarball to the engine (works for a remote DOCKER_HOST too); return the image id."""
    repository, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    answer = client.api.import_image_from_file(str(tarball), repository=repository, tag=tag,
                                               changes=import_changes(suite))
    image_id = ""
    for line in str(answer).splitlines():
        message = json.loads(line) if line.strip().startswith("{") else {}
        if "error" in message:
            raise CommandError(f"docker import of {ref} failed: {message['error']}")
        image_id = message.get("status", image_id)
    if not image_id.startswith("sha256:"):
        raise CommandError(f"docker import of {ref} gave no image id: {str(answer)[:200]}")
    return image_id


def _drop_replaced_image(client: docker.DockerClient, image_id: str) -> None:
    """Remove the image a forced rebuild replaced, unless something still uses it."""
    try:
        client.images.remove(image_id, noprune=False)
    except docker.errors.APIError:
        pass  # a container or a derived image still needs it: leave it to `docker image prune`


def _unescape_mount_path(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


if __name__ == "__main__":
    sys.exit(main())
