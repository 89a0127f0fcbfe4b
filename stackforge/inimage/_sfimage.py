"""The facts of an image stackforge did not build, read in one run inside it (standard library only).

``stackforge probe --image REF`` runs this file once in a container of the image (mounted with the rest of
this folder) and reads the one ``STACKFORGE_IMAGE {json}`` line it prints: the Python, the installed
torch (and the CUDA it was built for, read from ``torch/version.py`` without importing torch), FlashInfer and
its cubin / jit-cache packages, the kernel package, SGLang, nvcc, the CUDA libraries (every ``nvidia-*``
distribution, and the libcudart files found), the OS and glibc. Nothing is imported beyond the standard
library (and ``_sfprobe``'s nvcc search, when it imports), so an image's broken packages cannot stop the
reading: what is missing is said in the facts, never a traceback.

An image without Python never gets here: :data:`SHELL_READER` (run by ``/bin/sh``) prints the OS and glibc
instead, and says there is no Python.
"""

import ast
import glob
import json
import os
import platform
import sys

MARKER = "STACKFORGE_IMAGE "
#: What ``/bin/sh -c`` runs: this file under the first Python on PATH, else the OS and glibc lines and a
#: ``STACKFORGE_NO_PYTHON`` marker (``$1``: this file's path in the container).
SHELL_READER = (
    'for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then exec "$p" "$1"; fi; done; '
    'echo STACKFORGE_NO_PYTHON; cat /etc/os-release 2>/dev/null | sed "s/^/OSREL /"; '
    '(getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -n 1) | sed "s/^/LIBC /"; '
    'echo "MACHINE $(uname -m)"'
)
#: The distributions whose versions make the stack (the kernel packages, FlashInfer's add-ons).
STACK_DISTRIBUTIONS = ("torch", "triton", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache",
                       "sglang", "sgl-kernel", "sglang-kernel")
_LIBCUDART_GLOBS = ("/usr/local/cuda*/lib64/libcudart.so.*", "/usr/local/cuda*/targets/*/lib/libcudart.so.*",
                    "/usr/lib/*-linux-gnu/libcudart.so.*")


def distributions():
    """Every installed distribution's name (normalised) -> version; {} when importlib.metadata is missing."""
    try:
        import importlib.metadata as metadata
    except ImportError:
        return {}
    found = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").strip().lower().replace("_", "-").replace(".", "-")
        if name and dist.version and name not in found:
            found[name] = dist.version
    return found


def torch_cuda():
    """The CUDA torch was built for, from ``torch/version.py`` (None: a CPU build, or no torch)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(getattr(t, "id", None) == "cuda" for t in targets) and isinstance(node.value, ast.Constant):
            return node.value.value if isinstance(node.value.value, str) else None
    return None


def libcudart_files():
    """The libcudart files of the image (the toolkit's and the nvidia-cuda-runtime wheels'), by name."""
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    patterns = list(_LIBCUDART_GLOBS) + [os.path.join(r, "nvidia", "cu*", "lib", "libcudart.so.*") for r in roots] \
        + [os.path.join(r, "nvidia", "cuda_runtime", "lib", "libcudart.so.*") for r in roots]
    return sorted({os.path.realpath(path) for pattern in patterns for path in glob.glob(pattern)})


def os_release():
    """``/etc/os-release``'s fields (ID, VERSION_ID, PRETTY_NAME)."""
    fields = {}
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            for line in handle:
                key, sep, value = line.strip().partition("=")
                if sep and key in ("ID", "VERSION_ID", "PRETTY_NAME"):
                    fields[key] = value.strip().strip('"')
    except OSError:
        pass
    return fields


def nvcc():
    """(release, version line, path) of the nvcc FlashInfer would find, through ``_sfprobe`` (else Nones)."""
    try:
        import _sfprobe
    except Exception as exc:   # an old Python that cannot import the harness: said, not fatal
        return None, "cannot look for nvcc: _sfprobe does not import here ({})".format(exc), None
    path = _sfprobe.find_nvcc()
    if not path:
        return None, "", None
    release, line = _sfprobe.nvcc_version(path)
    return release or None, line[:300], path


def facts():
    """Everything read, as one JSON-able dict."""
    installed = distributions()
    release, line, path = nvcc()
    libc = platform.libc_ver()
    return {
        "python": platform.python_version(), "python_path": sys.executable, "machine": platform.machine(),
        "versions": {name: installed[name] for name in STACK_DISTRIBUTIONS if name in installed},
        "cuda_libraries": {name: v for name, v in sorted(installed.items()) if name.startswith("nvidia-")},
        "torch_cuda": torch_cuda() if "torch" in installed else None,
        "libcudart": [os.path.basename(p) for p in libcudart_files()],
        "nvcc": release, "nvcc_line": line, "nvcc_path": path,
        "os": os_release(), "glibc": libc[1] if libc[0] == "glibc" else None,
    }


if __name__ == "__main__":
    print(MARKER + json.dumps(facts(), sort_keys=True))
